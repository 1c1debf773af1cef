// Ops given bf16 inputs that have no bf16 kernel compute in f32 between casts; inside them
// (ops::in_bf16_route) a GPU's GEMMs may form their products in TF32. Attention with head sizes
// over 128 is such an op (smaller heads take the flash kernels: test_cuda_flash_attention.cc), its
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
#include "ops/dispatch.h"
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
  const Shape s = {2, 3, 37, 136};  // heads over 128: the route, not the flash kernels
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

// The elementwise ops, gelu and dropout take bf16 themselves on the GPU (one kernel: widen, f32
// compute, round once), which is the f32 route's cast, f32 op and cast bit for bit: each equals the
// same op on the f32 copies rounded to bf16, including broadcast and strided operands.
TEST(CudaBf16Native, ElementwiseOpsEqualTheF32RouteBitForBit) {
  HAP_REQUIRE_GPU();
  using ops::OpKind;
  const Tensor x = randn({6, 33}, 1).to(DType::BF16).to(kGpu);
  const Tensor y = randn({6, 33}, 2).to(DType::BF16).to(kGpu);
  const Tensor row = randn({1, 33}, 3).to(DType::BF16).to(kGpu);       // broadcast over rows
  const Tensor pos = exp(randn({6, 33}, 4)).to(DType::BF16).to(kGpu);  // positive
  const Tensor xt = transpose(randn({33, 6}, 5).to(DType::BF16).to(kGpu), 0, 1);  // strided
  const Tensor mask =
      Tensor::from_vector(std::vector<int64_t>{1, 0, 0, 1, 1, 0}, {6, 1}).to(DType::U8).to(kGpu);
  struct Call {
    const char* name;
    OpKind kind;
    std::vector<Tensor> in;
    ops::Attrs attrs;
  };
  const std::vector<Call> calls = {
      {"add", OpKind::Add, {x, y}, {}},
      {"add broadcast", OpKind::Add, {x, row}, {}},
      {"sub strided", OpKind::Sub, {xt, y}, {}},
      {"mul", OpKind::Mul, {x, row}, {}},
      {"div", OpKind::Div, {x, pos}, {}},
      {"relu_backward", OpKind::ReluBackward, {x, y}, {}},
      {"neg", OpKind::Neg, {x}, {}},
      {"exp", OpKind::Exp, {x}, {}},
      {"log", OpKind::Log, {pos}, {}},
      {"sqrt", OpKind::Sqrt, {pos}, {}},
      {"rsqrt", OpKind::Rsqrt, {pos}, {}},
      {"tanh", OpKind::Tanh, {xt}, {}},
      {"relu", OpKind::Relu, {x}, {}},
      {"sigmoid", OpKind::Sigmoid, {x}, {}},
      {"add_scalar", OpKind::AddScalar, {x}, ops::ScalarAttrs{0.1}},
      {"mul_scalar", OpKind::MulScalar, {x}, ops::ScalarAttrs{1.0 / 3}},
      {"pow_scalar", OpKind::PowScalar, {x}, ops::ScalarAttrs{2.0}},
      {"pow_scalar 1.5", OpKind::PowScalar, {pos}, ops::ScalarAttrs{1.5}},
      {"masked_fill", OpKind::MaskedFill, {x, mask}, ops::ScalarAttrs{-1e4}},
      {"gelu tanh", OpKind::Gelu, {x}, ops::GeluAttrs{ops::GeluApprox::Tanh}},
      {"gelu erf", OpKind::Gelu, {xt}, ops::GeluAttrs{ops::GeluApprox::None}},
      {"gelu_backward", OpKind::GeluBackward, {y, x}, ops::GeluAttrs{ops::GeluApprox::Tanh}},
      {"dropout", OpKind::Dropout, {x}, ops::RandomAttrs{0.3, 5, 2, {}}},
      {"dropout strided", OpKind::Dropout, {xt}, ops::RandomAttrs{0.1, 6, 0, {}}},
  };
  for (const Call& c : calls) {
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(ops::op_def(c.kind).cuda_bf16);
    const Tensor native = ops::call(c.kind, c.in, c.attrs)[0];
    ASSERT_EQ(native.dtype(), DType::BF16);
    std::vector<Tensor> wide;
    for (const Tensor& t : c.in) wide.push_back(t.dtype() == DType::BF16 ? t.to(DType::F32) : t);
    const Tensor route = ops::call(c.kind, wide, c.attrs)[0].to(DType::BF16);
    const std::vector<double> a = native.to(Device::cpu()).to_vector();
    const std::vector<double> b = route.to(Device::cpu()).to_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      ASSERT_EQ(a[i], b[i]) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace hap
