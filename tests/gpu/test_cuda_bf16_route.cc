// Ops given bf16 inputs that have no bf16 kernel compute in f32 between casts; inside them
// (ops::in_bf16_route) a GPU's GEMMs may form their products in TF32. Attention is such an op, its
// four products cuBLAS GEMMs: on bf16 q, k and v its forward and backward stay within bf16's
// rounding of the CPU's (which computes them in f32 exactly); the f32 attention stays exact to
// f32 (the registry harness, tests/gpu/test_cuda_registry.cc, checks it tightly). Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/functional.h"
#include "tests/gpu/gpu_test_util.h"

namespace hap {
namespace {

using namespace gpu_test;

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to(Device::cpu()).to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// Outputs are rounded to bf16 (8 significant bits: 2^-9 relative) on both devices, from f32 values
// that differ by the GPU's TF32 products (2^-11 relative each) and summation order: at most about
// two bf16 ulps apart (2^-7 relative), or, for elements far below the tensor's largest (sums that
// cancel), 2^-7 of that largest.
void expect_within_bf16(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  const double scale = max_abs(cpu);
  expect_close(gpu, cpu, 1.0 / 128, scale / 128, what);
}

TEST(CudaBf16Route, AttentionOnBf16InputsMatchesTheCpuWithinBf16Rounding) {
  HAP_REQUIRE_GPU();
  const Shape s = {2, 3, 37, 16};
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    std::array<Tensor, 2> y, gq, gk, gv;
    for (int device = 0; device < 2; ++device) {
      const Device d = device ? kGpu : Device::cpu();
      auto input = [&](uint64_t seed) {
        Tensor t = randn(s, seed).to(DType::BF16).to(d);
        t.set_requires_grad(true);
        return t;
      };
      Tensor q = input(1), k = input(2), v = input(3);
      const Tensor gy = randn(s, 4).to(DType::BF16).to(d);
      y[device] = scaled_dot_product_attention(q, k, v, causal);
      y[device].backward(gy);
      gq[device] = q.grad();
      gk[device] = k.grad();
      gv[device] = v.grad();
    }
    EXPECT_EQ(y[1].dtype(), DType::BF16);
    expect_within_bf16(y[1], y[0], "output");
    expect_within_bf16(gq[1], gq[0], "dq");
    expect_within_bf16(gk[1], gk[0], "dk");
    expect_within_bf16(gv[1], gv[0], "dv");
  }
}

}  // namespace
}  // namespace hap
