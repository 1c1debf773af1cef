// A GPU's SMs shared out among the ranks of an emulated mixed GPU cluster (core/sm_partition.h):
// the arithmetic every rank does before asking the driver for its group, and the environment
// scripts/hap-emulate gives it. Runs everywhere (no GPU needed); the driver side is tested in
// tests/gpu/test_cuda_green.cc.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/sm_partition.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/green_context.h"
#endif

namespace hap {
namespace {

// An H100 or H200 as its driver reports it: 132 SMs, groups of at least 8 in multiples of 8.
constexpr SmGranularity kHopper{132, 8, 8};

std::string error_of(const std::vector<int>& asked, const SmGranularity& g) {
  try {
    sm_groups(asked, g, "cuda:0 (test GPU)");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SmPartition, CountsOnTheGranularityAreGrantedAsAsked) {
  EXPECT_EQ(sm_groups({64, 32, 16, 16}, kHopper, "cuda:0"), (std::vector<int>{64, 32, 16, 16}));
  EXPECT_EQ(sm_groups({128}, kHopper, "cuda:0"), (std::vector<int>{128}));
  // An Ampere GPU: at least 4, multiples of 2.
  EXPECT_EQ(sm_groups({4, 6, 98}, {108, 4, 2}, "cuda:0"), (std::vector<int>{4, 6, 98}));
}

TEST(SmPartition, OtherCountsRoundToTheNearestMultipleHalfwayUp) {
  // 20 is as near 16 as 24: up; 19 is nearer 16, 29 nearer 32; 132 is not a multiple of 8, and
  // the most a group can have is 128.
  EXPECT_EQ(sm_groups({20, 19, 29}, kHopper, "cuda:0"), (std::vector<int>{24, 16, 32}));
  EXPECT_EQ(sm_groups({132}, kHopper, "cuda:0"), (std::vector<int>{128}));
  EXPECT_EQ(sm_groups({131}, kHopper, "cuda:0"), (std::vector<int>{128}));
  // A minimum that is not itself a multiple: the least multiple above it.
  EXPECT_EQ(sm_groups({6, 7}, {64, 5, 4}, "cuda:0"), (std::vector<int>{8, 8}));
  // The ratios between ranks as granted: what the planner's figures should follow.
  const std::vector<int> g = sm_groups({60, 30, 15, 15}, kHopper, "cuda:0");
  EXPECT_EQ(g, (std::vector<int>{64, 32, 16, 16}));
}

TEST(SmPartition, CountsTheGpuCannotGiveAreClearErrors) {
  const std::string over = error_of({200}, kHopper);
  EXPECT_NE(over.find("cuda:0 (test GPU)"), std::string::npos) << over;
  EXPECT_NE(over.find("more SMs than the GPU has (132)"), std::string::npos) << over;
  const std::string below = error_of({32, 4}, kHopper);
  EXPECT_NE(below.find("SM group 1 (sm_count 4, of 32, 4)"), std::string::npos) << below;
  EXPECT_NE(below.find("below the GPU's partition minimum of 8 SMs"), std::string::npos) << below;
  const std::string sum = error_of({64, 64, 16}, kHopper);
  EXPECT_NE(sum.find("add up to 144 SMs, more than the 132 the GPU has"), std::string::npos) << sum;
  // Rounding up can make a sum that fits as asked too large: said with the rounded counts.
  const std::string rounded = error_of({100, 28}, kHopper);
  EXPECT_NE(rounded.find("rounded to multiples of 8: 104, 32) add up to 136"), std::string::npos)
      << rounded;
  EXPECT_NE(error_of({0}, kHopper).find("expected a positive number of SMs"), std::string::npos);
  EXPECT_NE(error_of({}, kHopper).find("no SM group asked for"), std::string::npos);
  EXPECT_NE(error_of({8}, {0, 8, 8}).find("reports no SMs to partition"), std::string::npos);
}

TEST(SmPartition, TheEnvironmentNamesThePartitionAndTheGroup) {
  EXPECT_TRUE(parse_sm_partition(nullptr, nullptr).asked.empty());
  EXPECT_TRUE(parse_sm_partition("", nullptr).asked.empty());
  const SmPartitionRequest r = parse_sm_partition("64,32,16,16", "2");
  EXPECT_EQ(r.asked, (std::vector<int>{64, 32, 16, 16}));
  EXPECT_EQ(r.group, 2);
  EXPECT_EQ(parse_sm_partition("8", "0").group, 0);
  auto message = [](const char* sms, const char* group) -> std::string {
    try {
      parse_sm_partition(sms, group);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  for (const char* bad : {"64,,16", "64, 32", "x", "-8", "0", "64,", "1e2"}) {
    const std::string m = message(bad, "0");
    EXPECT_NE(m.find(std::string("HAP_EMULATE_SMS='") + bad + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("positive integers"), std::string::npos) << m;
  }
  EXPECT_NE(message("64,32", nullptr).find("without HAP_EMULATE_SM_GROUP"), std::string::npos);
  EXPECT_NE(message("64,32", "2").find("has 2 group(s), 0 to 1"), std::string::npos);
  EXPECT_NE(message("64,32", "-1").find("expected a group index from 0 to 1"), std::string::npos);
  EXPECT_NE(message("64,32", "one").find("HAP_EMULATE_SM_GROUP='one'"), std::string::npos);
  EXPECT_NE(message(nullptr, "1").find("without HAP_EMULATE_SMS"), std::string::npos);
}

#ifdef HAP_HAVE_CUDA
// Without a GPU, entering a green context is an error that says why (with one, the gpu tests
// enter them).
TEST(SmPartition, WithoutAGpuAGreenContextIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu enters green contexts";
  try {
    cuda::enter_green_context(0, {64, 32}, 1);
    ADD_FAILURE() << "entered a green context without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0: no CUDA device is visible"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cuda::green_context().device, -1);
  EXPECT_EQ(cuda::green_context_note(), "");
}
#endif

}  // namespace
}  // namespace hap
