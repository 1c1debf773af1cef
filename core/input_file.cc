#include "core/input_file.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace hap {

std::string unreadable_reason(const std::string& path, std::int64_t max_bytes, std::int64_t* bytes,
                              bool report_missing) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return report_missing ? "does not exist" : "";
  if (fs::is_directory(st)) return "is a directory";
  if (!fs::is_regular_file(st)) return "is not a regular file (a FIFO, device or socket)";
  const auto size = static_cast<std::int64_t>(fs::file_size(path, ec));
  if (ec) return "cannot be read (" + ec.message() + ")";
  if (size > max_bytes)
    return "has " + std::to_string(size) + " bytes, more than the limit of " +
           std::to_string(max_bytes);
  if (bytes) *bytes = size;
  return "";
}

std::size_t invalid_utf8_at(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // Lead byte: the sequence length and the allowed range of the second byte (RFC 3629).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::vector<std::string> regular_files_in(const std::string& dir, const std::string& what) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code entry_ec;
    if (!it->is_symlink(entry_ec) && it->is_regular_file(entry_ec) && !entry_ec)
      files.push_back(it->path().string());
  }
  HAP_CHECK(!ec, what, ": cannot list folder '", dir, "': ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace hap
