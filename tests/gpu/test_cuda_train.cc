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

#include "ops/cuda/kernels.h"
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

// bf16 mixed precision (train.precision=bf16) on the GPU, attention through the flash kernels
// (head size 16), against the CPU's bf16 run. The two round differently (the flash kernels round
// the probabilities to bf16 before their product, cuBLAS sums in other orders, and bf16 keeps 8
// significant bits, so one rounding step apart moves a value by 2^-8): the losses agree to 2%
// over 10 steps, where they fall by more than that, and the loss falls on the GPU.
TEST(CudaTrain, GptTrainsInBf16OnTheGpuWithTheFlashKernelsAsOnTheCpu) {
  HAP_REQUIRE_GPU();
  test_util::ScratchDir dir("cuda_train_bf16");
  const std::vector<ConfigOverride> bf16 = {"train.precision=bf16", "train.steps=10",
                                            "train.eval_every=10", "model.dropout=0"};
  const std::vector<double> cpu = train_losses("cpu", dir.path(""), bf16);
  const int64_t before = ops::cuda::flash_attention_calls();
  const std::vector<double> gpu = train_losses("cuda", dir.path(""), bf16);
  // Two layers, forward and backward, per step at least.
  EXPECT_GE(ops::cuda::flash_attention_calls() - before, 4 * 10);
  ASSERT_EQ(cpu.size(), 10u);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 0.02 * std::abs(cpu[i])) << "step " << i + 1;
  EXPECT_LT(gpu.back(), gpu.front() * 0.97);
}

}  // namespace
}  // namespace hap
