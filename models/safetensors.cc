#include "models/safetensors.h"

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/input_file.h"

namespace hap {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader/writer assumes a little-endian host");

namespace {

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kCrcPrefix = "hap.crc32.";
constexpr const char* kHeaderCrcKey = "hap.header_crc32";
constexpr size_t kMaxNdim = 64;

const char* format_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F64:
      return "F64";
    case DType::I64:
      return "I64";
    case DType::U8:
      return "U8";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::F32, DType::BF16, DType::F64, DType::I64, DType::U8})
    if (s == format_dtype(t)) {
      *out = t;
      return true;
    }
  return false;
}

bool is_checksum_key(const std::string& key) {
  return key == kHeaderCrcKey || key.rfind(kCrcPrefix, 0) == 0;
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// A CRC-32 of what the header says besides its own checksum, in a canonical form that does not
// depend on the JSON's key order or spacing.
uint32_t header_crc(const std::vector<Entry>& entries, const TensorMetadata& metadata) {
  std::string s;
  for (const Entry& e : entries) {
    s += e.name + '\0' + format_dtype(e.dtype) + '\0';
    for (int64_t d : e.shape) s += std::to_string(d) + ',';
    s += '\0' + std::to_string(e.begin) + '\0' + std::to_string(e.end) + '\n';
  }
  for (const auto& [k, v] : metadata)
    if (k != kHeaderCrcKey) s += k + '\0' + v + '\n';
  return crc32_of(s.data(), s.size());
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void read_exactly(std::FILE* f, void* out, uint64_t n, const std::string& path,
                  const std::string& what) {
  if (n == 0) return;
  HAP_CHECK(std::fread(out, 1, n, f) == n, "load_safetensors: ", path, ": reading ", what,
            " failed (", std::feof(f) ? "the file ended early" : std::strerror(errno), ")");
}

// Deeper nesting than the format's ({"name": {"shape": [..]}}) is refused before parsing.
int json_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

uint64_t json_offset(const nlohmann::json& v, const std::string& path, const std::string& name) {
  HAP_CHECK(v.is_number_unsigned(), "load_safetensors: ", path, ": tensor '", name,
            "' has data offset ", v.dump(), ", expected a non-negative integer");
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const nlohmann::json& j, const std::string& path) {
  const std::string where = "load_safetensors: " + path + ": tensor '" + name + "'";
  HAP_CHECK(!name.empty(), "load_safetensors: ", path, ": a tensor has an empty name");
  HAP_CHECK(j.is_object(), where, " is described by ", j.type_name(), ", expected an object");
  for (const auto& [k, v] : j.items())
    HAP_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", where, " has unknown field '", k,
              "' (expected dtype, shape and data_offsets)");
  HAP_CHECK(j.contains("dtype") && j.contains("shape") && j.contains("data_offsets"), where,
            " lacks one of dtype, shape and data_offsets");
  Entry e;
  e.name = name;
  const auto& dtype = j.at("dtype");
  HAP_CHECK(dtype.is_string() && parse_dtype(dtype.get<std::string>(), &e.dtype), where,
            " has dtype ", dtype.dump(), "; HAP reads F32, BF16, F64, I64 and U8");
  const auto& shape = j.at("shape");
  HAP_CHECK(shape.is_array() && shape.size() <= kMaxNdim, where, " has shape ",
            shape.dump().substr(0, 200), ", expected an array of at most ", kMaxNdim, " sizes");
  for (const auto& d : shape) {
    HAP_CHECK(d.is_number_unsigned() &&
                  d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              where, " has size ", d.dump(), " in its shape, expected a non-negative integer");
    e.shape.push_back(d.get<int64_t>());
  }
  const auto& off = j.at("data_offsets");
  HAP_CHECK(off.is_array() && off.size() == 2, where, " has data_offsets ",
            off.dump().substr(0, 200), ", expected [begin, end]");
  e.begin = json_offset(off[0], path, name);
  e.end = json_offset(off[1], path, name);
  HAP_CHECK(e.begin <= e.end, where, " has data_offsets [", e.begin, ", ", e.end,
            "]: begin after end");
  uint64_t bytes = dtype_size(e.dtype);
  bool overflow = false;
  if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
    bytes = 0;
  } else {
    for (int64_t d : e.shape)
      overflow = overflow || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
  }
  HAP_CHECK(!overflow && bytes == e.end - e.begin, where, " is ", shape_str(e.shape), " ",
            format_dtype(e.dtype), " (", overflow ? std::string("too many") : std::to_string(bytes),
            " bytes) but its data_offsets span ", e.end - e.begin, " bytes");
  return e;
}

}  // namespace

uint32_t crc32_of(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {  // zlib takes a uInt length
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    c = ::crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(c);
}

std::string crc32_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const TensorMetadata& metadata) {
  std::set<std::string> names;
  std::vector<Entry> entries;
  std::vector<Tensor> data;
  TensorMetadata meta = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    HAP_CHECK(!name.empty() && name != kMetadataKey, "save_safetensors: tensor name '", name,
              "' is not allowed (writing ", path, ")");
    HAP_CHECK(names.insert(name).second, "save_safetensors: tensor name '", name,
              "' appears twice (writing ", path, ")");
    HAP_CHECK(invalid_utf8_at(name) == std::string::npos, "save_safetensors: tensor name #",
              entries.size(), " is not UTF-8 text (writing ", path, ")");
    HAP_CHECK(t.defined() && t.has_storage(), "save_safetensors: tensor '", name,
              "' has no data (writing ", path, ")");
    HAP_CHECK(t.device().is_cpu(), "save_safetensors: tensor '", name, "' is on ", t.device().str(),
              "; copy it to the CPU first");
    Tensor c = t.contiguous();
    Entry e{name, c.dtype(), c.shape(), offset, offset + c.nbytes()};
    offset = e.end;
    meta[kCrcPrefix + name] = crc32_hex(crc32_of(c.raw_data(), c.nbytes()));
    entries.push_back(std::move(e));
    data.push_back(std::move(c));
  }
  for (const auto& [k, v] : metadata) {
    HAP_CHECK(!is_checksum_key(k), "save_safetensors: metadata key '", k,
              "' is reserved for HAP's checksums");
    HAP_CHECK(invalid_utf8_at(k) == std::string::npos && invalid_utf8_at(v) == std::string::npos,
              "save_safetensors: a metadata entry is not UTF-8 text (writing ", path, ")");
  }
  meta[kHeaderCrcKey] = crc32_hex(header_crc(entries, meta));

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header[kMetadataKey] = meta;
  for (const Entry& e : entries)
    header[e.name] = {
        {"dtype", format_dtype(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();
  HAP_CHECK(header_bytes <= kMaxSafetensorsHeaderBytes, "save_safetensors: the header of ", path,
            " would take ", header_bytes, " bytes, more than readers accept (",
            kMaxSafetensorsHeaderBytes, ")");
  write_atomically(path, "save_safetensors", [&](std::FILE* f) {
    check_write(f, &header_bytes, 8, "save_safetensors", path);
    check_write(f, text.data(), text.size(), "save_safetensors", path);
    for (const Tensor& c : data) check_write(f, c.raw_data(), c.nbytes(), "save_safetensors", path);
  });
}

bool looks_like_safetensors(const std::string& path) {
  int64_t size = 0;
  if (!unreadable_reason(path, kMaxCheckpointBytes, &size).empty() || size < 10) return false;
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return false;
  uint64_t n = 0;
  char first = 0;
  if (std::fread(&n, 1, 8, f.get()) != 8 || std::fread(&first, 1, 1, f.get()) != 1) return false;
  return n >= 2 && n <= static_cast<uint64_t>(size) - 8 && first == '{';
}

NamedTensors load_safetensors(const std::string& path, TensorMetadata* metadata) {
  int64_t size = 0;
  const std::string why = unreadable_reason(path, kMaxCheckpointBytes, &size);
  HAP_CHECK(why.empty(), "load_safetensors: cannot read ", path, ": it ", why);
  File f(std::fopen(path.c_str(), "rb"));
  HAP_CHECK(f != nullptr, "load_safetensors: cannot open ", path, ": ", std::strerror(errno));
  const auto file_bytes = static_cast<uint64_t>(size);
  HAP_CHECK(file_bytes >= 8, "load_safetensors: ", path, " has ", file_bytes,
            " bytes, too few for a safetensors file (an 8-byte header size, then the header)");
  uint64_t header_bytes = 0;
  read_exactly(f.get(), &header_bytes, 8, path, "the header size");
  HAP_CHECK(header_bytes >= 2 && header_bytes <= file_bytes - 8 &&
                header_bytes <= kMaxSafetensorsHeaderBytes,
            "load_safetensors: ", path, " is not a safetensors file: its header size is ",
            header_bytes, " bytes (the file has ", file_bytes, "; at most ",
            kMaxSafetensorsHeaderBytes, ")");
  std::string text(header_bytes, '\0');
  read_exactly(f.get(), text.data(), header_bytes, path, "the header");
  HAP_CHECK(text[0] == '{', "load_safetensors: ", path,
            " is not a safetensors file: its header does not start with '{'");
  HAP_CHECK(json_depth(text) <= 3, "load_safetensors: ", path,
            ": the header nests deeper than the format's {name: {shape: [...]}}");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    HAP_CHECK(false, "load_safetensors: ", path, ": the header is not valid JSON (", e.what(), ")");
  }
  HAP_CHECK(header.is_object(), "load_safetensors: ", path, ": the header is a JSON ",
            header.type_name(), ", expected an object");

  TensorMetadata meta;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key != kMetadataKey) {
      entries.push_back(parse_entry(key, value, path));
      continue;
    }
    HAP_CHECK(value.is_object(), "load_safetensors: ", path, ": __metadata__ is a ",
              value.type_name(), ", expected an object of strings");
    for (const auto& [k, v] : value.items()) {
      HAP_CHECK(v.is_string(), "load_safetensors: ", path, ": __metadata__ entry '", k, "' is ",
                v.dump().substr(0, 100), ", expected a string");
      meta[k] = v.get<std::string>();
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    HAP_CHECK(e.begin == expected, "load_safetensors: ", path, ": tensor '", e.name,
              "' starts at data offset ", e.begin, ", expected ", expected,
              " (tensors must tile the data without gaps or overlaps)");
    expected = e.end;
  }
  HAP_CHECK(expected == data_bytes, "load_safetensors: ", path, ": the tensors' data takes ",
            expected, " bytes but the file holds ", data_bytes, " after the header",
            expected < data_bytes ? " (unexpected bytes at the end)" : " (the file is truncated)");

  const bool verified = meta.count(kHeaderCrcKey) > 0;
  if (verified) {
    HAP_CHECK(meta.at(kHeaderCrcKey) == crc32_hex(header_crc(entries, meta)),
              "load_safetensors: ", path,
              ": the header's checksum does not match: the header is damaged");
    std::set<std::string> names;
    for (const Entry& e : entries) names.insert(e.name);
    for (const auto& [k, v] : meta)
      HAP_CHECK(k.rfind(kCrcPrefix, 0) != 0 || names.count(k.substr(std::strlen(kCrcPrefix))),
                "load_safetensors: ", path, ": a checksum names tensor '",
                k.substr(std::strlen(kCrcPrefix)), "', which the file does not hold");
  } else {
    for (const auto& [k, v] : meta)
      HAP_CHECK(!is_checksum_key(k), "load_safetensors: ", path, ": '", k,
                "' without hap.header_crc32: the header is damaged");
  }

  NamedTensors out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, TensorOptions{}.with_dtype(e.dtype));
    read_exactly(f.get(), t.raw_data(), e.end - e.begin, path, "the data of '" + e.name + "'");
    if (verified) {
      auto it = meta.find(kCrcPrefix + e.name);
      HAP_CHECK(it != meta.end(), "load_safetensors: ", path, ": tensor '", e.name,
                "' has no checksum (hap.crc32.", e.name, "): the header is damaged");
      HAP_CHECK(it->second == crc32_hex(crc32_of(t.raw_data(), t.nbytes())),
                "load_safetensors: ", path, ": the data of tensor '", e.name,
                "' does not match its checksum: the file is damaged");
    }
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) {
    metadata->clear();
    for (auto& [k, v] : meta)
      if (!is_checksum_key(k)) (*metadata)[k] = v;
  }
  return out;
}

}  // namespace hap
