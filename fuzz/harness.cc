#include "fuzz/harness.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <set>
#include <typeinfo>

#include "core/error.h"

namespace hap::fuzz {
namespace {

namespace fs = std::filesystem;

// The scratch files made so far, removed at exit.
struct ScratchFiles {
  std::set<std::string> paths;
  ~ScratchFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};

ScratchFiles& scratch_files() {
  static ScratchFiles files;
  return files;
}

// The demangled type of the exception being handled.
std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "(unknown)";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(
      abi::__cxa_demangle(type->name(), nullptr, nullptr, &status), &std::free);
  return status == 0 && name ? name.get() : type->name();
}

std::string current_exception_what() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

// The kind of a finding: its exception type and message with the numbers (12, 0xFF) left out: an
// index or a byte value differs between inputs that hit the same bug.
std::string finding_kind(const std::string& type, const std::string& what) {
  std::string kind = type + ": ";
  for (std::size_t i = 0; i < what.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(what[i])) == 0) {
      kind += what[i];
      continue;
    }
    while (i + 1 < what.size() && std::isalnum(static_cast<unsigned char>(what[i + 1])) != 0) ++i;
  }
  return kind;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// HAP_FUZZ_KEEP_GOING=DIR: an escaping exception is a finding, kept as DIR/finding-<kind hash>
// (the first input of each kind, with a .txt beside it naming the exception), and the run goes on,
// so that a long run is not stopped by a known bug. Each kind is printed once.
void keep_finding(const fs::path& dir, const std::string& type, const std::string& what,
                  const std::uint8_t* data, std::size_t size) {
  static std::set<std::string> seen;
  const std::string kind = finding_kind(type, what);
  if (!seen.insert(kind).second) return;
  std::fprintf(stderr, "fuzz: finding (going on): %s: %s\n", type.c_str(), what.c_str());
  std::error_code ec;
  fs::create_directories(dir, ec);
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(kind)));
  const fs::path input = dir / (std::string("finding-") + hash);
  if (fs::exists(input, ec)) return;  // kept by an earlier run
  if (std::FILE* f = std::fopen(input.c_str(), "wb")) {
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  if (std::FILE* f = std::fopen((input.string() + ".txt").c_str(), "w")) {
    std::fprintf(f, "%s: %s\n", type.c_str(), what.c_str());
    std::fclose(f);
  }
}

}  // namespace

Outcomes& outcomes() {
  static Outcomes counts;
  return counts;
}

std::string scratch_path(std::string_view name) {
  std::error_code ec;
  const fs::path dir =
      fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
  const std::string path =
      (dir / ("hap-fuzz-" + std::to_string(::getpid()) + "-" + std::string(name))).string();
  scratch_files().paths.insert(path);
  return path;
}

std::string write_scratch(std::string_view name, const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_path(name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "fuzz: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  const bool written = size == 0 || std::fwrite(data, 1, size, f) == size;
  if (std::fclose(f) != 0 || !written) {
    std::fprintf(stderr, "fuzz: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    std::abort();
  }
  return path;
}

void read_input(std::string_view name, const std::uint8_t* data, std::size_t size,
                const std::function<void(const std::string& path)>& read) {
  const std::string path = write_scratch(name, data, size);
  try {
    read(path);
    ++outcomes().read;
  } catch (const Error&) {
    ++outcomes().refused;
  } catch (...) {
    const std::string type = current_exception_type(), what = current_exception_what();
    const char* findings = std::getenv("HAP_FUZZ_KEEP_GOING");
    if (findings == nullptr || *findings == '\0') {
      std::fprintf(stderr, "fuzz: a reader let an exception other than hap::Error escape: %s: %s\n",
                   type.c_str(), what.c_str());
      throw;
    }
    ++outcomes().findings;
    keep_finding(findings, type, what, data, size);
  }
}

void property_failed(const std::string& what) { throw InternalError("fuzz: " + what); }

}  // namespace hap::fuzz
