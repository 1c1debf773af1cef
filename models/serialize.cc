#include "models/serialize.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_set>

#include "core/atomic_file.h"
#include "core/input_file.h"
#include "models/module.h"
#include "models/optim.h"

namespace hap {

static_assert(std::endian::native == std::endian::little,
              ".hapt files are little-endian; this reader/writer assumes a little-endian host");

namespace {

constexpr char kMagic[4] = {'H', 'A', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxNdim = 64;

uint8_t dtype_code(DType t) { return static_cast<uint8_t>(t); }

bool dtype_from_code(uint8_t code, DType* out) {
  switch (code) {
    case 0:
      *out = DType::F32;
      return true;
    case 1:
      *out = DType::BF16;
      return true;
    case 2:
      *out = DType::F64;
      return true;
    case 3:
      *out = DType::I64;
      return true;
    case 4:
      *out = DType::U8;
      return true;
  }
  return false;
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<FILE, FileCloser>;

std::string errno_str() { return std::strerror(errno); }

// Writes everything to `f` or throws naming `path`.
class Writer {
 public:
  Writer(FILE* f, const std::string& path) : f_(f), path_(path) {}
  void bytes(const void* p, size_t n) { check_write(f_, p, n, "save_tensors", path_); }
  template <typename T>
  void pod(T v) {
    bytes(&v, sizeof(T));
  }

 private:
  FILE* f_;
  const std::string& path_;
};

// Reads with bounds checks against the file size, so truncation is reported precisely.
class Reader {
 public:
  Reader(FILE* f, const std::string& path, uint64_t size) : f_(f), path_(path), size_(size) {}
  uint64_t remaining() const { return size_ - pos_; }
  void bytes(void* p, uint64_t n, const std::string& what) {
    HAP_CHECK(n <= remaining(), "load_tensors: ", path_, " is truncated while reading ", what,
              " (needs ", n, " bytes at offset ", pos_, ", the file has ", size_, ")");
    if (n > 0)
      HAP_CHECK(std::fread(p, 1, n, f_) == n, "load_tensors: reading ", path_, " failed at offset ",
                pos_, ": ", errno_str());
    pos_ += n;
  }
  template <typename T>
  T pod(const std::string& what) {
    T v;
    bytes(&v, sizeof(T), what);
    return v;
  }
  uint64_t pos() const { return pos_; }

 private:
  FILE* f_;
  const std::string& path_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

void write_all(FILE* f, const std::string& path, const NamedTensors& tensors) {
  Writer w(f, path);
  w.bytes(kMagic, 4);
  w.pod<uint32_t>(kVersion);
  w.pod<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    w.pod<uint32_t>(static_cast<uint32_t>(name.size()));
    w.bytes(name.data(), name.size());
    w.pod<uint8_t>(dtype_code(t.dtype()));
    w.pod<uint32_t>(static_cast<uint32_t>(t.dim()));
    for (int64_t d : t.shape()) w.pod<int64_t>(d);
    Tensor c = t.contiguous();
    w.bytes(c.raw_data(), c.nbytes());
  }
}

}  // namespace

void save_tensors(const std::string& path, const NamedTensors& tensors) {
  HAP_CHECK(tensors.size() <= UINT32_MAX, "save_tensors: too many tensors (", tensors.size(), ")");
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : tensors) {
    HAP_CHECK(!name.empty(), "save_tensors: tensor names must be non-empty (writing ", path, ")");
    HAP_CHECK(name.size() <= UINT32_MAX, "save_tensors: name of ", name.size(),
              " bytes is too long");
    HAP_CHECK(names.insert(name).second, "save_tensors: tensor name '", name,
              "' appears twice (writing ", path, ")");
    HAP_CHECK(t.defined(), "save_tensors: tensor '", name, "' is undefined");
    HAP_CHECK(t.device().is_cpu(), "save_tensors: tensor '", name, "' is on ", t.device().str(),
              "; copy it to the CPU first");
    HAP_CHECK(t.has_storage(), "save_tensors: tensor '", name, "' (", t.str(),
              ") has no storage (a traced, shape-only tensor)");
  }
  write_atomically(path, "save_tensors", [&](std::FILE* f) { write_all(f, path, tensors); });
}

NamedTensors load_tensors(const std::string& path) {
  const std::string why = unreadable_reason(path, kMaxCheckpointBytes, nullptr, false);
  HAP_CHECK(why.empty(), "load_tensors: cannot read ", path, ": it ", why);
  File f(std::fopen(path.c_str(), "rb"));
  HAP_CHECK(f != nullptr, "load_tensors: cannot open ", path, ": ", errno_str());
  HAP_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, "load_tensors: cannot seek in ", path);
  long size = std::ftell(f.get());
  HAP_CHECK(size >= 0, "load_tensors: cannot tell the size of ", path);
  std::rewind(f.get());
  Reader r(f.get(), path, static_cast<uint64_t>(size));

  char magic[4];
  r.bytes(magic, 4, "the magic bytes");
  HAP_CHECK(std::memcmp(magic, kMagic, 4) == 0, "load_tensors: ", path,
            " is not a .hapt file (its first bytes are not \"HAPT\")");
  uint32_t version = r.pod<uint32_t>("the version");
  HAP_CHECK(version == kVersion, "load_tensors: ", path, " has .hapt version ", version,
            "; this reader knows version ", kVersion);
  uint32_t count = r.pod<uint32_t>("the tensor count");

  NamedTensors out;
  std::unordered_set<std::string> names;
  for (uint32_t i = 0; i < count; ++i) {
    std::string which = "tensor #" + std::to_string(i);
    uint32_t name_len = r.pod<uint32_t>("the name length of " + which);
    HAP_CHECK(name_len <= r.remaining(), "load_tensors: ", path, " is truncated while reading ",
              "the name of ", which, " (", name_len, " bytes at offset ", r.pos(), ")");
    std::string name(name_len, '\0');
    r.bytes(name.data(), name_len, "the name of " + which);
    HAP_CHECK(!name.empty(), "load_tensors: ", path, ": ", which, " has an empty name");
    HAP_CHECK(invalid_utf8_at(name) == std::string::npos, "load_tensors: ", path, ": the name of ",
              which, " is not UTF-8 text");
    HAP_CHECK(names.insert(name).second, "load_tensors: ", path, ": tensor name '", name,
              "' appears twice");
    uint8_t code = r.pod<uint8_t>("the dtype of '" + name + "'");
    DType dtype;
    HAP_CHECK(dtype_from_code(code, &dtype), "load_tensors: ", path, ": tensor '", name,
              "' has unknown dtype code ", static_cast<int>(code), " (known: 0..4)");
    uint32_t ndim = r.pod<uint32_t>("the ndim of '" + name + "'");
    HAP_CHECK(ndim <= kMaxNdim, "load_tensors: ", path, ": tensor '", name, "' has ndim ", ndim,
              " (at most ", kMaxNdim, ")");
    Shape shape(ndim);
    for (uint32_t d = 0; d < ndim; ++d) {
      shape[d] = r.pod<int64_t>("the dims of '" + name + "'");
      HAP_CHECK(shape[d] >= 0, "load_tensors: ", path, ": tensor '", name, "' has dim ", d,
                " of size ", shape[d]);
    }
    // Garbage dims must neither overflow nor allocate before the truncation check.
    uint64_t data_bytes = dtype_size(dtype);
    bool overflow = false;
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
      data_bytes = 0;
    } else {
      for (int64_t d : shape)
        overflow =
            overflow || __builtin_mul_overflow(data_bytes, static_cast<uint64_t>(d), &data_bytes);
    }
    HAP_CHECK(!overflow && data_bytes <= r.remaining(), "load_tensors: ", path,
              " is truncated while reading the data of '", name, "' ", shape_str(shape), " ",
              dtype_name(dtype), " (needs ",
              overflow ? std::string("more") : std::to_string(data_bytes), " bytes at offset ",
              r.pos(), ", ", r.remaining(), " are left)");
    Tensor t = Tensor::empty(shape, TensorOptions{}.with_dtype(dtype));
    r.bytes(t.raw_data(), t.nbytes(), "the data of '" + name + "'");
    out.emplace_back(std::move(name), std::move(t));
  }
  HAP_CHECK(r.remaining() == 0, "load_tensors: ", path, " has ", r.remaining(),
            " unexpected bytes after the last of its ", count, " tensors");
  return out;
}

// ---- checkpoints ----

namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kOptimPrefix = "optim.";

Tensor i64_scalar(int64_t v) {
  return Tensor::full({}, static_cast<double>(v), TensorOptions{}.with_dtype(DType::I64));
}

int64_t meta_int(const TensorMetadata& meta, const std::string& key, const std::string& path) {
  auto it = meta.find(key);
  HAP_CHECK(it != meta.end(), "read_checkpoint: ", path, ": the metadata has no '", key, "'");
  const std::string& v = it->second;
  int64_t out = 0;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, out);
  HAP_CHECK(ec == std::errc() && p == end && !v.empty(), "read_checkpoint: ", path, ": metadata '",
            key, "' is '", v.substr(0, 100), "', expected an integer");
  return out;
}

}  // namespace

int64_t i64_scalar_value(const Tensor& t, const std::string& path, const std::string& name) {
  HAP_CHECK(t.dtype() == DType::I64 && t.numel() == 1 && t.dim() == 0, path, ": '", name,
            "' must be an i64 scalar, got ", t.str());
  return *t.contiguous().data<int64_t>();  // exact: item() goes through a double
}

std::string model_digest(const std::vector<std::pair<std::string, Tensor>>& named_parameters) {
  std::string s;
  for (const auto& [name, t] : named_parameters)
    s += name + ':' + shape_str(t.shape()) + ':' + dtype_name(t.dtype()) + ';';
  return crc32_hex(crc32_of(s.data(), s.size()));
}

void write_checkpoint(const std::string& path, const Checkpoint& c) {
  TensorMetadata meta = c.metadata;
  meta["format"] = kCheckpointFormat;
  meta["step"] = std::to_string(c.step);
  meta["random_seed"] = std::to_string(static_cast<int64_t>(c.random_seed));
  meta["random_step"] = std::to_string(static_cast<int64_t>(c.random_step));
  save_safetensors(path, c.tensors, meta);
}

namespace {

// Attention's q, k, v weights were one [3C, C] matrix and their biases one [3C] vector before they
// became [3, C, C] and [3, C] (models/layers.h, QkvProjection): the same numbers in the same
// order, so a checkpoint of the older shape (model and optimizer entries alike) is read as the
// newer one.
void upgrade_stacked_qkv(NamedTensors& tensors) {
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (auto& [name, t] : tensors) {
    Shape to;
    if (ends_with(name, "attn.qkv.weight") && t.dim() == 2 && t.size(0) == 3 * t.size(1))
      to = {3, t.size(1), t.size(1)};
    else if (ends_with(name, "attn.qkv.bias") && t.dim() == 1 && t.size(0) % 3 == 0)
      to = {3, t.size(0) / 3};
    if (to.empty()) continue;
    const Tensor packed = t.contiguous();
    t = packed.as_strided(to, contiguous_strides(to), packed.offset());
  }
}

}  // namespace

Checkpoint read_checkpoint(const std::string& path) {
  Checkpoint c = read_checkpoint_as_written(path);
  upgrade_stacked_qkv(c.tensors);
  return c;
}

Checkpoint read_checkpoint_as_written(const std::string& path) {
  Checkpoint c;
  if (looks_like_safetensors(path)) {
    c.tensors = load_safetensors(path, &c.metadata);
    auto format = c.metadata.find("format");
    HAP_CHECK(format != c.metadata.end() && format->second == kCheckpointFormat,
              "read_checkpoint: ", path,
              " is a safetensors file but not a HAP checkpoint (its "
              "metadata's format is '",
              format == c.metadata.end() ? std::string("(none)") : format->second.substr(0, 100),
              "', expected '", kCheckpointFormat, "')");
    c.step = meta_int(c.metadata, "step", path);
    c.random_seed = static_cast<uint64_t>(meta_int(c.metadata, "random_seed", path));
    c.random_step = static_cast<uint64_t>(meta_int(c.metadata, "random_step", path));
    return c;
  }
  // HAP's first checkpoint format: .hapt with the counters as i64 scalars.
  int64_t found = 0;
  for (auto& [name, t] : load_tensors(path)) {
    int64_t* field = name == "meta.step"          ? &c.step
                     : name == "meta.random_seed" ? reinterpret_cast<int64_t*>(&c.random_seed)
                     : name == "meta.random_step" ? reinterpret_cast<int64_t*>(&c.random_step)
                                                  : nullptr;
    if (!field) {
      c.tensors.emplace_back(std::move(name), std::move(t));
      continue;
    }
    *field = i64_scalar_value(t, "read_checkpoint: " + path, name);
    ++found;
  }
  HAP_CHECK(found == 3, "read_checkpoint: ", path,
            " is not a checkpoint: it lacks meta.step, meta.random_seed or meta.random_step");
  c.metadata = {{"format", "hapt-v1"},
                {"step", std::to_string(c.step)},
                {"random_seed", std::to_string(c.random_seed)},
                {"random_step", std::to_string(c.random_step)}};
  return c;
}

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, int64_t step) {
  Checkpoint c;
  auto params = model.named_parameters();
  for (const auto& [name, t] : params) c.tensors.emplace_back(kModelPrefix + name, t);
  for (const auto& [name, t] : model.named_buffers())
    c.tensors.emplace_back(kModelPrefix + name, t);
  c.metadata["model"] = model.type_name();
  c.metadata["model_digest"] = model_digest(params);
  if (optimizer) {
    size_t held = 0;
    for (const auto& g : optimizer->param_groups()) held += g.params.size();
    size_t found = 0;
    for (const auto& [name, t] : params) {
      const optim::Optimizer::ParamState* st = optimizer->state(t);
      if (!st) continue;
      ++found;
      for (size_t s = 0; s < st->slots.size(); ++s)
        c.tensors.emplace_back(kOptimPrefix + optimizer->state_slots()[s] + "." + name,
                               st->slots[s]);
      c.tensors.emplace_back(std::string(kOptimPrefix) + "step." + name, i64_scalar(st->step));
    }
    HAP_CHECK(found == held, "save_checkpoint: the optimizer holds ", held - found,
              " parameter(s) that are not parameters of the ", model.type_name(), " being saved");
    std::string slots;
    for (const std::string& s : optimizer->state_slots()) slots += (slots.empty() ? "" : ",") + s;
    c.metadata["optimizer"] = optimizer->name();
    c.metadata["optimizer_slots"] = slots;
  }
  c.step = step;
  c.random_seed = model.random_seed();
  c.random_step = model.random_step();
  write_checkpoint(path, c);
}

int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer) {
  Checkpoint c = read_checkpoint(path);
  std::map<std::string, Tensor> by_name(c.tensors.begin(), c.tensors.end());
  std::unordered_set<std::string> used;
  auto take = [&](const std::string& name, const Shape& shape) -> Tensor {
    auto it = by_name.find(name);
    HAP_CHECK(it != by_name.end(), "load_checkpoint: ", path, " has no tensor '", name,
              "' (was it written for a different model or without an optimizer?)");
    HAP_CHECK(it->second.shape() == shape, "load_checkpoint: ", path, ": tensor '", name,
              "' has shape ", shape_str(it->second.shape()), ", expected ", shape_str(shape));
    used.insert(name);
    return it->second;
  };
  auto take_i64 = [&](const std::string& name) {
    return i64_scalar_value(take(name, {}), "load_checkpoint: " + path, name);
  };

  // Check everything before changing anything.
  auto params = model.named_parameters();
  std::vector<std::pair<Tensor, Tensor>> copies;  // (destination, source)
  std::vector<std::pair<optim::Optimizer::ParamState*, int64_t>> steps;
  for (const auto& [name, t] : params) {
    copies.emplace_back(t, take(kModelPrefix + name, t.shape()));
    if (!optimizer) continue;
    optim::Optimizer::ParamState* st = optimizer->state(t);
    if (!st) continue;
    for (size_t s = 0; s < st->slots.size(); ++s)
      copies.emplace_back(st->slots[s],
                          take(kOptimPrefix + optimizer->state_slots()[s] + "." + name, t.shape()));
    steps.emplace_back(st, take_i64(std::string(kOptimPrefix) + "step." + name));
  }
  for (const auto& [name, t] : model.named_buffers())
    copies.emplace_back(t, take(kModelPrefix + name, t.shape()));
  for (const auto& [name, t] : c.tensors) {
    bool optim_entry = name.rfind(kOptimPrefix, 0) == 0;
    if (optim_entry && !optimizer) continue;  // resuming the weights only
    HAP_CHECK(used.count(name), "load_checkpoint: ", path, " has an unexpected tensor '", name,
              "' that the ", model.type_name(), optimizer ? " and its optimizer" : "",
              " do not have");
  }

  for (auto& [dst, src] : copies) dst.copy_from(src);
  for (auto& [st, s] : steps) st->step = s;
  model.set_random_seed(c.random_seed);
  model.set_random_step(c.random_step);
  return c.step;
}

}  // namespace hap
