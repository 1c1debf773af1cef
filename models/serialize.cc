#include "models/serialize.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_set>

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
  void bytes(const void* p, size_t n) {
    if (n == 0) return;
    HAP_CHECK(std::fwrite(p, 1, n, f_) == n, "save_tensors: writing ", path_,
              " failed: ", errno_str());
  }
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
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  File f(std::fopen(tmp.c_str(), "wb"));
  HAP_CHECK(f != nullptr, "save_tensors: cannot create ", tmp, " (for ", path, "): ", errno_str());
  try {
    write_all(f.get(), path, tensors);
    HAP_CHECK(std::fflush(f.get()) == 0 && ::fsync(::fileno(f.get())) == 0,
              "save_tensors: flushing ", tmp, " failed: ", errno_str());
    FILE* raw = f.release();
    HAP_CHECK(std::fclose(raw) == 0, "save_tensors: closing ", tmp, " failed: ", errno_str());
    HAP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "save_tensors: renaming ", tmp, " to ",
              path, " failed: ", errno_str());
  } catch (...) {
    f.reset();
    std::remove(tmp.c_str());
    throw;
  }
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

}  // namespace

void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, int64_t step) {
  NamedTensors out;
  auto params = model.named_parameters();
  for (const auto& [name, t] : params) out.emplace_back(kModelPrefix + name, t);
  if (optimizer) {
    size_t held = 0;
    for (const auto& g : optimizer->param_groups()) held += g.params.size();
    size_t found = 0;
    for (const auto& [name, t] : params) {
      const optim::Optimizer::ParamState* st = optimizer->state(t);
      if (!st) continue;
      ++found;
      for (size_t s = 0; s < st->slots.size(); ++s)
        out.emplace_back(kOptimPrefix + optimizer->state_slots()[s] + "." + name, st->slots[s]);
      out.emplace_back(std::string(kOptimPrefix) + "step." + name, i64_scalar(st->step));
    }
    HAP_CHECK(found == held, "save_checkpoint: the optimizer holds ", held - found,
              " parameter(s) that are not parameters of the ", model.type_name(), " being saved");
  }
  out.emplace_back("meta.step", i64_scalar(step));
  out.emplace_back("meta.random_seed", i64_scalar(static_cast<int64_t>(model.random_seed())));
  out.emplace_back("meta.random_step", i64_scalar(static_cast<int64_t>(model.random_step())));
  save_tensors(path, out);
}

int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer) {
  NamedTensors loaded = load_tensors(path);
  std::map<std::string, Tensor> by_name(loaded.begin(), loaded.end());
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
    Tensor t = take(name, {});
    HAP_CHECK(t.dtype() == DType::I64, "load_checkpoint: ", path, ": '", name,
              "' must be an i64 scalar, got ", t.str());
    return static_cast<int64_t>(t.item());
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
  int64_t step = take_i64("meta.step");
  int64_t random_seed = take_i64("meta.random_seed");
  int64_t random_step = take_i64("meta.random_step");
  for (const auto& [name, t] : loaded) {
    bool optim_entry = name.rfind(kOptimPrefix, 0) == 0;
    if (optim_entry && !optimizer) continue;  // resuming the weights only
    HAP_CHECK(used.count(name), "load_checkpoint: ", path, " has an unexpected tensor '", name,
              "' that the ", model.type_name(), optimizer ? " and its optimizer" : "",
              " do not have");
  }

  for (auto& [dst, src] : copies) dst.copy_from(src);
  for (auto& [st, s] : steps) st->step = s;
  model.set_random_seed(static_cast<uint64_t>(random_seed));
  model.set_random_step(static_cast<uint64_t>(random_step));
  return step;
}

}  // namespace hap
