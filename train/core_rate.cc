#include "train/core_rate.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/atomic_file.h"
#include "ops/cpu/blas.h"
#include "train/config.h"

namespace hap::train {
namespace {

// Raised when the measurement changes what it measures, so old cache entries are not reused.
constexpr int kCalibrationVersion = 1;
constexpr const char* kCacheFile = "core-flops.json";
constexpr double kMinRate = 1e3, kMaxRate = 1e18;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// HAP_CORE_FLOPS as a rate, or 0 when it is not set.
double rate_from_environment() {
  const std::string text = env("HAP_CORE_FLOPS");
  if (text.empty()) return 0;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < kMinRate ||
      v > kMaxRate)
    throw ConfigError(
        "HAP_CORE_FLOPS: expected a number in [1000, 1e+18] (FLOP/s of one CPU "
        "core), got '" +
        text + "'");
  return v;
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// The cache's entries, or an empty object when there is no usable cache (a damaged one is
// reported and then replaced).
nlohmann::json read_cache(const std::string& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  try {
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.is_object() && j.value("format", "") == "hap-core-flops-v1" && j.contains("entries") &&
        j["entries"].is_object())
      return j["entries"];
  } catch (const nlohmann::json::exception&) {
  }
  std::fprintf(stderr, "hap: warning: ignoring %s: not a core-rate cache this program wrote\n",
               file.c_str());
  return nlohmann::json::object();
}

}  // namespace

std::string default_cache_dir() {
  if (std::string d = env("HAP_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/hap";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/hap";
  return "";
}

std::string core_rate_key() {
  return "v" + std::to_string(kCalibrationVersion) + ": " + cpu::gemm_description();
}

CoreRate resolve_core_rate(const std::string& cache_dir_arg) {
  if (const double v = rate_from_environment(); v > 0) return {v, "HAP_CORE_FLOPS"};
  const std::string dir = cache_dir_arg.empty() ? default_cache_dir() : cache_dir_arg;
  const std::string file = dir.empty() ? "" : dir + "/" + kCacheFile;
  const std::string key = core_rate_key();
  nlohmann::json entries = file.empty() ? nlohmann::json::object() : read_cache(file);
  if (entries.contains(key) && entries[key].is_object()) {
    const nlohmann::json& e = entries[key];
    if (e.contains("flops_per_s") && e["flops_per_s"].is_number()) {
      const double v = e["flops_per_s"].get<double>();
      if (std::isfinite(v) && v >= kMinRate && v <= kMaxRate)
        return {v, "cached in " + file + " (" + e.value("measured", std::string("?")) + ")"};
    }
  }
  CoreRate r;
  r.flops_per_s = measure_core_flops_per_s();
  if (file.empty()) {
    r.source = "measured now (no cache folder: set HAP_CACHE_DIR or HOME)";
    return r;
  }
  entries[key] = {{"flops_per_s", r.flops_per_s}, {"measured", now_utc()}};
  nlohmann::json doc = {{"format", "hap-core-flops-v1"},
                        {"about",
                         "one CPU core's FLOP/s on the default GPT training step, measured by "
                         "hap (train/core_rate.h); delete this file to measure again"},
                        {"entries", entries}};
  try {
    std::filesystem::create_directories(dir);
    write_file_atomically(file, doc.dump(2) + "\n");
    r.source = "measured now (cached in " + file + ")";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hap: warning: cannot cache the measured core rate in %s: %s\n",
                 file.c_str(), e.what());
    r.source = "measured now (not cached: " + file + " cannot be written)";
  }
  return r;
}

const CoreRate& core_rate() {
  static std::once_flag once;
  static CoreRate rate;
  std::call_once(once, [] { rate = resolve_core_rate(); });
  return rate;
}

}  // namespace hap::train
