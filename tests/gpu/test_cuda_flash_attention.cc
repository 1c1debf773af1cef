// bf16 attention on the GPU through the flash kernels (ops/cuda/flash_attention.cuh), against the
// CPU's attention in f32 on the same bf16 operands: forward, log-sum-exp and backward, causal and
// not, several tiles with a partial one, head sizes padded to the tiles, a key padding mask with
// rows that have no key, dropout on a slice of a larger logical tensor. The same kernel source
// runs on the CPU in tests/ops/test_flash_attention_emulated.cc; here the tensor cores run it.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/cuda/kernels.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/flash_attention_cases.h"
#include "tests/gpu/gpu_test_util.h"

namespace hap {
namespace {

using namespace gpu_test;

using flash_test::largest;

// Within the bounds of the bf16 roundings (flash_test::kRel, kAbs; the tensor cores' f32
// summation order adds ~1e-6 relative).
void expect_near_cpu(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  const double worst = flash_test::expect_close(gpu, cpu, flash_test::kRel, flash_test::kAbs, what);
  std::printf("  %s: largest error %.2e of max |cpu|\n", what.c_str(), worst);
}

using flash_test::Case;

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  std::printf("%s\n", c.name.c_str());
  const flash_test::Operands in = flash_test::operands(c);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &go = in.go, &glse = in.glse, &keys = in.keys;
  const ops::AttentionAttrs& a = in.attrs;
  auto f32 = [](const Tensor& x) { return x.to(DType::F32); };
  auto gpu = [](const Tensor& x) { return x.defined() ? x.to(kGpu) : Tensor(); };
  const std::vector<Tensor> want =
      ops::call(ops::OpKind::Attention, {f32(q), f32(k), f32(v), keys}, a);
  const int64_t before = ops::cuda::flash_attention_calls();
  const std::vector<Tensor> got =
      ops::call(ops::OpKind::Attention, {gpu(q), gpu(k), gpu(v), gpu(keys)}, a);
  EXPECT_EQ(ops::cuda::flash_attention_calls(), before + 1) << "the flash kernels did not run";
  EXPECT_EQ(got[0].dtype(), DType::BF16);
  EXPECT_EQ(got[1].dtype(), DType::F32);
  expect_near_cpu(got[0].to(DType::F32), want[0], "output");
  expect_close(got[1], want[1], 1e-5, 1e-5, "log-sum-exp");
  // The backward from the GPU's o and lse on both sides.
  const Tensor o = got[0].to(Device::cpu());
  const Tensor lse = got[1].to(Device::cpu());
  const std::vector<Tensor> gwant =
      ops::call(ops::OpKind::AttentionBackward,
                {f32(q), f32(k), f32(v), f32(o), lse, f32(go), glse, keys}, a);
  const std::vector<Tensor> ggot =
      ops::call(ops::OpKind::AttentionBackward,
                {gpu(q), gpu(k), gpu(v), got[0], got[1], gpu(go), gpu(glse), gpu(keys)}, a);
  EXPECT_EQ(ops::cuda::flash_attention_calls(), before + 2) << "the flash backward did not run";
  const char* names[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ggot[i].dtype(), DType::BF16);
    expect_near_cpu(ggot[i].to(DType::F32), gwant[i], names[i]);
    EXPECT_GT(largest(ggot[i]), 1e-3) << names[i];
  }
}

TEST(CudaFlashAttention, MatchesTheCpuOnTilesMasksAndHeadSizes) {
  HAP_REQUIRE_GPU();
  run_case({"causal, T=37, d=16", 2, 3, 37, 16, 16});
  run_case({"causal, T=150, d=64", 1, 2, 150, 64, 64});
  run_case({"not causal, T=150, d=64", 1, 2, 150, 64, 64, false});
  run_case({"causal, T=70, d=8 (padded)", 1, 2, 70, 8, 8});
  run_case({"not causal, d=40, dv=24", 1, 2, 70, 40, 24, false});
  run_case({"causal, d=128, T=300", 1, 1, 300, 128, 128});
  run_case({"causal, key mask", 2, 2, 80, 16, 16, true, true});
  run_case({"not causal, key mask", 2, 1, 80, 16, 16, false, true});
  run_case({"causal, dropout 0.2", 1, 2, 70, 16, 16, true, false, 0.2});
  run_case({"not causal, key mask, dropout 0.3", 2, 1, 40, 32, 32, false, true, 0.3});
}

// GPT-2's shape (T = 1024, d = 64): 16 tiles of queries and keys.
TEST(CudaFlashAttention, MatchesTheCpuAtGpt2sSequenceLength) {
  HAP_REQUIRE_GPU();
  run_case({"causal, T=1024, d=64", 1, 2, 1024, 64, 64});
}

// Head sizes beyond the tiles (over 128) take the f32 route, within bf16 rounding of the CPU.
TEST(CudaFlashAttention, HeadSizesOverTheTilesTakeTheF32Route) {
  HAP_REQUIRE_GPU();
  const Shape s = {1, 2, 40, 136};
  const Tensor q = randn(s, 1).to(DType::BF16), k = randn(s, 2).to(DType::BF16);
  const Tensor v = randn(s, 3).to(DType::BF16);
  const int64_t before = ops::cuda::flash_attention_calls();
  const Tensor y = scaled_dot_product_attention(q.to(kGpu), k.to(kGpu), v.to(kGpu), true);
  EXPECT_EQ(ops::cuda::flash_attention_calls(), before);
  EXPECT_EQ(y.dtype(), DType::BF16);
  const Tensor want =
      scaled_dot_product_attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), true);
  expect_near_cpu(y.to(DType::F32), want, "output");
}

}  // namespace
}  // namespace hap
