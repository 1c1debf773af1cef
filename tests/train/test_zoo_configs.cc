// Every model's shipped config trains out of the box on its default data: hap-train runs it for a
// few dozen steps (in one process, with the plan the config asks for) and the held-out loss falls
// clearly below the loss of the first step.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace hap::train {
namespace {

namespace fs = std::filesystem;

struct ConfigCase {
  std::string file;  // under configs/
  std::string set;   // --set overrides
  int steps;
  double fall;  // the final validation loss is at most this share of the first step's loss
};

class ShippedConfig : public ::testing::TestWithParam<ConfigCase> {};

TEST_P(ShippedConfig, TrainsOutOfTheBoxAndTheValidationLossFalls) {
  const ConfigCase& c = GetParam();
  const fs::path log =
      fs::temp_directory_path() / ("hap_zoo_config_" + std::to_string(::getpid()) + ".jsonl");
  const std::string cmd = std::string(HAP_TRAIN_BIN) + " --config " + HAP_SOURCE_DIR + "/configs/" +
                          c.file + " --set train.steps=" + std::to_string(c.steps) +
                          " --set train.warmup_steps=5 --set train.eval_every=1000" +
                          " --set train.log_file=" + log.string() + " " + c.set + " > /dev/null";
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << cmd;
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  fs::remove(log);
  const nlohmann::json done = nlohmann::json::parse(last);
  ASSERT_EQ(done.at("type"), "done") << last;
  EXPECT_EQ(done.at("steps"), c.steps);
  const double first = done.at("first_loss"), val = done.at("last_val_loss");
  EXPECT_LT(val, c.fall * first) << c.file << ": first loss " << first << ", val loss " << val;
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, ShippedConfig,
    ::testing::Values(ConfigCase{"vgg19.yaml", "", 60, 0.85}, ConfigCase{"vit.yaml", "", 40, 0.7},
                      ConfigCase{"bert.yaml", "", 60, 0.7},
                      ConfigCase{"bert.yaml", "--set model.objective=mlm", 60, 0.7},
                      ConfigCase{"bert_moe.yaml", "", 60, 0.7}),
    [](const auto& info) {
      const std::string& set = info.param.set;
      std::string n = info.param.file.substr(0, info.param.file.find('.')) +
                      (set.empty() ? "" : "_" + set.substr(set.rfind('=') + 1));
      for (char& ch : n)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return n;
    });

}  // namespace
}  // namespace hap::train
