#include "train/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

}  // namespace hap::train
