// Green contexts (core/cuda/green_context.h): the ranks of an emulated mixed GPU cluster each run
// on their own group of the GPU's SMs. Checked on the GPU: the context holds the SMs asked for,
// kernels launched the usual way (the default stream, our ops) stay on them, the groups two
// processes would take are disjoint, work computes the same inside one, and counts the GPU cannot
// give are clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "core/cuda/green_context.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "tests/gpu/gpu_test_util.h"

namespace hap {
namespace {

using gpu_test::kGpu;

// The smallest group the GPU allows, on its granularity.
int smallest_group(const SmGranularity& g) {
  return (g.minimum + g.alignment - 1) / g.alignment * g.alignment;
}

TEST(GreenContext, KernelsStayOnTheirGroupAndTheGroupsAreDisjoint) {
  HAP_REQUIRE_GPU();
  const SmGranularity g = cuda::sm_granularity(0);
  const int n = smallest_group(g);
  if (2 * n >= g.total) GTEST_SKIP() << "cuda:0 has too few SMs for two groups and the rest";
  // Outside a green context, enough long blocks spread over more SMs than a group has.
  const int blocks = 8 * g.total;
  const std::vector<int> all = cuda::sm_ids_of_blocks(0, blocks);
  const std::set<int> everywhere(all.begin(), all.end());
  EXPECT_GT(static_cast<int>(everywhere.size()), n);
  std::vector<std::set<int>> seen(2);
  const Tensor a = randn({67, 45}, 1), b = randn({45, 33}, 2);
  const Tensor expected = matmul(a.to(kGpu), b.to(kGpu)).to(Device::cpu());
  for (int group = 0; group < 2; ++group) {
    const cuda::GreenContextInfo& info = cuda::enter_green_context(0, {n, n}, group);
    EXPECT_EQ(info.sms, n);
    EXPECT_EQ(info.granted, (std::vector<int>{n, n}));
    EXPECT_EQ(cuda::current_context_sms(), n);
    EXPECT_NE(cuda::green_context_note().find("in a green context of " + std::to_string(n)),
              std::string::npos)
        << cuda::green_context_note();
    const std::vector<int> ids = cuda::sm_ids_of_blocks(0, blocks);
    seen[static_cast<size_t>(group)] = std::set<int>(ids.begin(), ids.end());
    EXPECT_LE(static_cast<int>(seen[static_cast<size_t>(group)].size()), n) << "group " << group;
    // Our ops (a cuBLAS GEMM here) run inside it and compute the same.
    const Tensor c = matmul(a.to(kGpu), b.to(kGpu)).to(Device::cpu());
    EXPECT_EQ(c.to_vector(), expected.to_vector()) << "group " << group;
    // Every op family keeps it current (an elementwise kernel, a reduction, a softmax), rather
    // than falling back to the primary context.
    const Tensor ag = a.to(kGpu);
    const Tensor d = softmax(sum(ag * ag + ag, {1}, true) + ag, -1);
    EXPECT_EQ(cuda::current_context_sms(), n) << "group " << group << " after the ops";
    EXPECT_EQ(d.to(Device::cpu()).shape(), (Shape{67, 45}));
    cuda::leave_green_context();
    EXPECT_EQ(cuda::green_context().device, -1);
  }
  std::vector<int> both;
  std::set_intersection(seen[0].begin(), seen[0].end(), seen[1].begin(), seen[1].end(),
                        std::back_inserter(both));
  EXPECT_TRUE(both.empty()) << both.size() << " SM(s) in both groups";
  // Out of it again, the whole GPU.
  EXPECT_EQ(cuda::current_context_sms(), g.total);
}

TEST(GreenContext, CountsTheGpuCannotGiveAreClearErrors) {
  HAP_REQUIRE_GPU();
  const SmGranularity g = cuda::sm_granularity(0);
  auto error = [](const std::vector<int>& asked) -> std::string {
    try {
      cuda::enter_green_context(0, asked, 0);
      cuda::leave_green_context();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string over = error({g.total + g.alignment});
  EXPECT_NE(over.find("more SMs than the GPU has"), std::string::npos) << over;
  EXPECT_NE(over.find("cuda:0"), std::string::npos) << over;
  const std::string sum = error({smallest_group(g), g.total});
  EXPECT_NE(sum.find("more than the " + std::to_string(g.total) + " the GPU has"),
            std::string::npos)
      << sum;
  if (g.minimum > 1) {
    const std::string below = error({g.minimum - 1});
    EXPECT_NE(below.find("below the GPU's partition minimum"), std::string::npos) << below;
  }
  EXPECT_EQ(cuda::green_context().device, -1);
}

}  // namespace
}  // namespace hap
