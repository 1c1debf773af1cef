// Named tensors in the safetensors format (https://github.com/huggingface/safetensors, "Format"):
// an 8-byte little-endian header size N, N bytes of JSON header (padded with spaces to a multiple
// of 8), then the raw little-endian data of every tensor, back to back. The header maps each
// tensor name to {"dtype": "F32" | "BF16" | "F64" | "I64" | "U8", "shape": [...],
// "data_offsets": [begin, end]} (offsets relative to the end of the header) and "__metadata__" to
// a string -> string map. Any safetensors reader reads the files we write.
//
// Integrity: HAP adds to "__metadata__" a CRC-32 (zlib's, 8 hex digits) of every tensor's bytes,
// "hap.crc32.<name>", and "hap.header_crc32", a CRC-32 of everything else the header says (names,
// dtypes, shapes, offsets, metadata). A file carrying them is verified on load: a flipped byte
// anywhere either fails the load, naming the tensor or the header, or changes nothing read. A
// file without them (written by another tool) is read unverified.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace hap {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using TensorMetadata = std::map<std::string, std::string>;

// Largest header a reader accepts (as the reference implementation: 100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// zlib's CRC-32 of n bytes, continuing from `crc` (0 to start).
std::uint32_t crc32_of(const void* data, std::size_t n, std::uint32_t crc = 0);
// 8 lower-case hex digits.
std::string crc32_hex(std::uint32_t crc);

// Writes `tensors` (CPU, any layout; dtypes f32, bf16, f64, i64, u8) in order, with `metadata`
// (keys must not start with "hap.crc32." or be "hap.header_crc32") and the checksums, atomically
// (a temporary next to `path`, fsync, rename). Names must be non-empty, distinct and not
// "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const TensorMetadata& metadata = {});

// Reads every tensor, in the order of their data in the file, and the metadata (without HAP's
// checksum entries) into *metadata when given. Throws hap::Error naming the file and what is
// wrong: not a safetensors file, a header that is not the JSON the format describes, an unknown
// dtype, offsets that do not tile the data exactly, a size that does not match, a checksum that
// does not match.
NamedTensors load_safetensors(const std::string& path, TensorMetadata* metadata = nullptr);

// Whether the file starts like a safetensors file (a header size that fits the file and a '{').
bool looks_like_safetensors(const std::string& path);

}  // namespace hap
