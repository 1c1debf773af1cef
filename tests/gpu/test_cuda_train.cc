// GPT trained by hap-train's trainer on the GPU (train.device=cuda) against the same run on the
// CPU: every step's loss, with dropout (the GPU draws the CPU's masks), AdamW, clipping, the
// schedule and an evaluation. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"
#include "train/config.h"
#include "train/from_config.h"
#include "train/trainer.h"

namespace hap {
namespace {

using namespace gpu_test;
using namespace train;

std::vector<double> train_losses(const std::string& device, const std::string& dir,
                                 const std::vector<ConfigOverride>& extra = {}) {
  const std::string log = dir + "/" + device + ".jsonl";
  std::vector<ConfigOverride> sets = {"train.steps=5",         "train.log_every=1",
                                      "model.dropout=0.1",     "train.device=" + device,
                                      "train.log_file=" + log, "train.eval_every=5"};
  // The corpus: HAP_TEST_CORPUS where set (scripts/gpu-check's machine has no fortunes package).
  if (const char* corpus = std::getenv("HAP_TEST_CORPUS"); corpus && *corpus)
    sets.push_back(std::string("data.path=") + corpus);
  sets.insert(sets.end(), extra.begin(), extra.end());
  const RunConfig c = load_run_config(source_dir() + "/configs/gpt-tiny.yaml", sets);
  auto model = build_model(c);
  Trainer trainer(model, open_dataset(c, *model), c.train);
  trainer.fit({.quiet = true});
  std::vector<double> losses;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "train") losses.push_back(j["loss"].get<double>());
  }
  return losses;
}

TEST(CudaTrain, GptTrainsFiveStepsOnTheGpuAsOnTheCpu) {
  HAP_REQUIRE_GPU();
  test_util::ScratchDir dir("cuda_train");
  const std::vector<double> cpu = train_losses("cpu", dir.path(""));
  const std::vector<double> gpu = train_losses("cuda", dir.path(""));
  ASSERT_EQ(cpu.size(), 5u);
  ASSERT_EQ(gpu.size(), cpu.size());
  // f32 on both; sums run in other orders (cuBLAS, block reductions), and five AdamW steps carry
  // the differences: the losses agree to ~1e-5 relative, far below a step's change (~1e-2).
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i + 1;
}

}  // namespace
}  // namespace hap
