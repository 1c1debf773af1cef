// Reading input files safely: a path a reader opens must be a regular file (not a FIFO, a device
// or a socket, which could block the reader or never end) of at most a documented size, so that
// no reader waits forever or reads until memory runs out.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hap {

// Size limits of the files HAP reads (documented in docs/architecture.md, "Input files").
inline constexpr std::int64_t kMaxConfigBytes = std::int64_t{16} << 20;     // run and cluster YAML
inline constexpr std::int64_t kMaxPlanBytes = std::int64_t{1} << 30;        // plan JSON
inline constexpr std::int64_t kMaxCorpusBytes = std::int64_t{64} << 30;     // a text corpus in all
inline constexpr std::int64_t kMaxCheckpointBytes = std::int64_t{1} << 40;  // a .hapt file

// Why `path` cannot be read as an input file of at most max_bytes ("does not exist", "is a
// directory", "is not a regular file (a FIFO, device or socket)", "has N bytes, more than the
// limit of M"), or "" when it can. *bytes receives its size when it is a regular file. Without
// report_missing a path that does not exist gives "" too (for a caller that reports the OS's own
// reason when opening it).
std::string unreadable_reason(const std::string& path, std::int64_t max_bytes,
                              std::int64_t* bytes = nullptr, bool report_missing = true);

// The regular files directly in folder `dir` (not through symbolic links, not in subfolders),
// sorted by name. Throws hap::Error naming `what` ("data.path"), the folder and the OS's reason
// when the folder cannot be listed.
std::vector<std::string> regular_files_in(const std::string& dir, const std::string& what);

// The offset of the first byte of `text` that is not part of well-formed UTF-8 (overlong forms,
// surrogates and code points past U+10FFFF count as malformed), or std::string_view::npos.
std::size_t invalid_utf8_at(std::string_view text);

}  // namespace hap
