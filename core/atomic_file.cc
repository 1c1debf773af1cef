#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace hap {

namespace {
// The temporary file being written, for remove_partial_output (a fixed buffer: signal-safe).
char g_tmp_path[4096] = {0};
}  // namespace

std::string temporary_path(const std::string& path) {
  return path + kTemporaryInfix + std::to_string(::getpid());
}

void check_write(std::FILE* f, const void* data, std::size_t n, const std::string& what,
                 const std::string& path) {
  if (n == 0) return;
  HAP_CHECK(std::fwrite(data, 1, n, f) == n, what, ": writing ", path,
            " failed: ", std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::string& text) {
  write_atomically(path, "writing", [&](std::FILE* f) {
    check_write(f, text.data(), text.size(), "writing", path);
  });
}

void remove_partial_output() {
  if (g_tmp_path[0]) ::unlink(g_tmp_path);
}

void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(std::FILE*)>& write) {
  const std::string tmp = temporary_path(path);
  HAP_CHECK(tmp.size() < sizeof g_tmp_path, what, ": output path too long: ", path);
  std::snprintf(g_tmp_path, sizeof g_tmp_path, "%s", tmp.c_str());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) g_tmp_path[0] = 0;
  HAP_CHECK(f != nullptr, what, ": cannot create ", tmp, " (for ", path,
            "): ", std::strerror(errno));
  try {
    write(f);
    HAP_CHECK(std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0, what, ": flushing ", tmp,
              " failed: ", std::strerror(errno));
    std::FILE* done = f;
    f = nullptr;
    HAP_CHECK(std::fclose(done) == 0, what, ": closing ", tmp, " failed: ", std::strerror(errno));
    HAP_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, what, ": renaming ", tmp, " to ", path,
              " failed: ", std::strerror(errno));
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    g_tmp_path[0] = 0;
    throw;
  }
  g_tmp_path[0] = 0;
  // The rename itself survives a crash only once the folder's entry is on disk.
  std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace hap
