// One CPU core's rate for cluster files in cores (train/core_rate.h): the environment override,
// the cache per machine, and the measurement itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "train/config.h"
#include "train/core_rate.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

// Sets (or with nullopt unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class CoreRateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hap_core_rate_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string cache_file() const { return (dir_ / "core-flops.json").string(); }
  fs::path dir_;
};

TEST_F(CoreRateTest, TheEnvironmentGivesTheRateWithoutMeasuring) {
  ScopedEnv rate("HAP_CORE_FLOPS", "1.25e11");
  const CoreRate r = resolve_core_rate(dir_.string());
  EXPECT_EQ(r.flops_per_s, 1.25e11);
  EXPECT_EQ(r.source, "HAP_CORE_FLOPS");
  EXPECT_FALSE(fs::exists(cache_file())) << "nothing measured, nothing cached";
}

TEST_F(CoreRateTest, ABadEnvironmentValueIsAConfigErrorNamingIt) {
  for (const char* bad : {"abc", "0", "-1e11", "1e30", "1.5e11x", "nan", "inf", " ", "1e999"}) {
    SCOPED_TRACE(bad);
    ScopedEnv rate("HAP_CORE_FLOPS", bad);
    std::string message;
    try {
      resolve_core_rate(dir_.string());
    } catch (const ConfigError& e) {
      message = e.what();
    }
    EXPECT_EQ(message, std::string("HAP_CORE_FLOPS: expected a number in [1000, 1e+18] (FLOP/s "
                                   "of one CPU core), got '") +
                           bad + "'");
  }
}

TEST_F(CoreRateTest, MeasuredOnceThenReadFromTheCacheOfThisMachine) {
  ScopedEnv no_rate("HAP_CORE_FLOPS", std::nullopt);
  const CoreRate first = resolve_core_rate(dir_.string());
  // Any CPU this runs on does more than 100 MFLOP/s and less than a PFLOP/s on one core.
  EXPECT_GT(first.flops_per_s, 1e8);
  EXPECT_LT(first.flops_per_s, 1e15);
  EXPECT_EQ(first.source, "measured now (cached in " + cache_file() + ")");
  ASSERT_TRUE(fs::exists(cache_file()));
  std::ifstream in(cache_file());
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["format"], "hap-core-flops-v1");
  ASSERT_TRUE(doc["entries"].contains(core_rate_key()));
  EXPECT_EQ(doc["entries"][core_rate_key()]["flops_per_s"].get<double>(), first.flops_per_s);

  // The same figure again, bit for bit, so plans on this machine do not change from run to run.
  const CoreRate second = resolve_core_rate(dir_.string());
  EXPECT_EQ(second.flops_per_s, first.flops_per_s);
  EXPECT_EQ(second.source.rfind("cached in " + cache_file(), 0), 0u) << second.source;
}

TEST_F(CoreRateTest, TheKeyNamesTheCpuAndTheGemmPath) {
  const std::string key = core_rate_key();
  EXPECT_NE(key.find("cpu: "), std::string::npos) << key;
  EXPECT_NE(key.find("gemm: "), std::string::npos) << key;
  EXPECT_NE(key.find("vector kernels: "), std::string::npos) << key;
}

TEST_F(CoreRateTest, OtherMachinesEntriesAreKeptAndADamagedCacheIsReplaced) {
  ScopedEnv no_rate("HAP_CORE_FLOPS", std::nullopt);
  fs::create_directories(dir_);
  {
    // A cache shared by two machines (a shared home folder): the other's entry stays.
    nlohmann::json doc = {{"format", "hap-core-flops-v1"},
                          {"entries", {{"another cpu", {{"flops_per_s", 5e10}}}}}};
    std::ofstream(cache_file()) << doc.dump();
  }
  const CoreRate measured = resolve_core_rate(dir_.string());
  {
    std::ifstream in(cache_file());
    const nlohmann::json doc = nlohmann::json::parse(in);
    EXPECT_EQ(doc["entries"]["another cpu"]["flops_per_s"].get<double>(), 5e10);
    EXPECT_EQ(doc["entries"][core_rate_key()]["flops_per_s"].get<double>(), measured.flops_per_s);
  }
  // This machine's entry with a value no CPU has is measured again rather than believed.
  {
    nlohmann::json doc = {{"format", "hap-core-flops-v1"},
                          {"entries", {{core_rate_key(), {{"flops_per_s", -1}}}}}};
    std::ofstream(cache_file()) << doc.dump();
  }
  const CoreRate again = resolve_core_rate(dir_.string());
  EXPECT_GT(again.flops_per_s, 1e8);
  EXPECT_EQ(again.source, "measured now (cached in " + cache_file() + ")");
  // Not JSON at all: replaced by a valid cache.
  std::ofstream(cache_file()) << "{ not json";
  const CoreRate third = resolve_core_rate(dir_.string());
  EXPECT_GT(third.flops_per_s, 1e8);
  std::ifstream in(cache_file());
  EXPECT_NO_THROW(nlohmann::json::parse(in));
}

}  // namespace
}  // namespace hap::train
