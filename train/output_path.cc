#include "train/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace hap::train {

std::string unwritable_reason(const std::string& path, bool create_parents) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return "the path is empty";
  if (fs::is_directory(path, ec)) return "it is a directory";
  if (fs::exists(path, ec)) return ::access(path.c_str(), W_OK) == 0 ? "" : std::strerror(errno);
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (create_parents)
    while (!fs::exists(dir, ec)) {
      if (!dir.has_parent_path()) {  // a relative path's first folder: it goes in the current one
        dir = ".";
        break;
      }
      if (dir.parent_path() == dir) break;
      dir = dir.parent_path();
    }
  if (!fs::exists(dir, ec)) return "the folder '" + dir.string() + "' does not exist";
  if (!fs::is_directory(dir, ec)) return "'" + dir.string() + "' is not a directory";
  if (::access(dir.c_str(), W_OK) != 0) return std::strerror(errno);
  return "";
}

namespace {
// The temporary file being written, for remove_partial_output (a fixed buffer: signal-safe).
char g_tmp_path[4096] = {0};
}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : ".";
  const std::string tmp =
      (dir / ("." + p.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  HAP_CHECK(tmp.size() < sizeof g_tmp_path, "output path too long: ", path);
  std::snprintf(g_tmp_path, sizeof g_tmp_path, "%s", tmp.c_str());
  {
    std::ofstream out(tmp);
    HAP_CHECK(static_cast<bool>(out), "cannot write '", tmp, "' (for ", path,
              "): ", std::strerror(errno));
    out << text;
    out.flush();
    HAP_CHECK(static_cast<bool>(out), "writing '", tmp, "' failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    ::unlink(tmp.c_str());
    g_tmp_path[0] = 0;
    HAP_CHECK(false, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
  g_tmp_path[0] = 0;
}

void remove_partial_output() {
  if (g_tmp_path[0]) ::unlink(g_tmp_path);
}

}  // namespace hap::train
