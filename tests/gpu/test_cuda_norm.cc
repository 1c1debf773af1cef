// layer_norm, rms_norm and gelu with their backward kernels on a GPU, against the CPU: permuted
// views, rows longer than a block, more rows than the parameter gradients' row chunks, strided and
// omitted parameters, empty tensors, f32 and f64. Each test skips without a visible GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/gpu/gpu_test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

// Normal values with mean `shift` and standard deviation `scale`, drawn in f64, stored as d.
Tensor normal(const Shape& s, uint64_t seed, DType d, double scale = 1.0, double shift = 0.0) {
  return (randn(s, seed, 0, f64()) * scale + shift).to(d);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? same_view_on_gpu(t) : Tensor(); }

// Runs `kind` on the CPU inputs and on device copies of them (same views), and compares every
// output.
void expect_outputs_close(OpKind kind, const std::vector<Tensor>& in, const ops::Attrs& attrs,
                          double rtol, double atol) {
  std::vector<Tensor> gpu_in;
  for (const Tensor& t : in) gpu_in.push_back(on_gpu(t));
  const std::vector<Tensor> want = ops::call(kind, in, attrs), got = ops::call(kind, gpu_in, attrs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i], want[i], rtol, atol,
                 std::string(ops::op_name(kind)) + " output " + std::to_string(i));
}

struct NormCase {
  std::string label;
  Tensor x, g;  // x [..., C] and the gradient of y, of x's shape
};

std::vector<NormCase> norm_cases(DType d) {
  // x [3, 45, 37]: rows of 37 elements 135 apart, the permuted view of a [37, 3, 45] block.
  const Shape view = {3, 45, 37};
  const Strides view_strides = {45, 1, 135};
  const Tensor xb = normal({37, 3, 45}, 1, d, 3.0, 2.0), gb = normal({37, 3, 45}, 2, d);
  const Tensor none = Tensor::empty({0, 7}, TensorOptions{}.with_dtype(d));
  return {
      {"a permuted view", xb.as_strided(view, view_strides, 0),
       gb.as_strided(view, view_strides, 0)},
      {"rows of 3000, longer than a block", normal({3, 3000}, 3, d, 2.0, -1.0),
       normal({3, 3000}, 4, d)},
      // More rows than the CUDA kernel's 128 row chunks of the parameter gradients hold evenly.
      {"2100 rows of 19", normal({2100, 19}, 5, d, 1.5, 0.5), normal({2100, 19}, 6, d)},
      {"no rows", none, none},
  };
}

// Both norms, with every combination of parameters: a strided weight view (every other element
// of a [2C] block) and a bias, a weight alone, neither.
TEST(CudaNorm, LayerNormAndRmsNormWithTheirBackwardMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // Forward: the row statistics are sums in double on both sides (in another order) rounded to
    // d, so y differs by a few ulp. Backward, f32: the CPU sums g w and g w xhat of a row, and the
    // parameter gradients within each of its 64 row blocks, in f32 (the GPU in double): over
    // 2100 rows that rounding reaches ~1e-6 absolute in dweight and dbias, hence atol 1e-5.
    const double rtol = d == DType::F64 ? 1e-12 : 1e-5;
    const double atol_fwd = d == DType::F64 ? 1e-12 : 1e-6;
    const double atol_bwd = d == DType::F64 ? 1e-12 : 1e-5;
    for (const NormCase& c : norm_cases(d)) {
      const int64_t n = c.x.size(c.x.dim() - 1);
      const Tensor w_view = normal({2 * n}, 7, d, 1.0, 1.0).as_strided({n}, {2}, 1);
      const Tensor w = normal({n}, 8, d, 1.0, 1.0), b = normal({n}, 9, d);
      const std::vector<std::pair<std::string, std::vector<Tensor>>> params = {
          {"strided weight and bias", {w_view, b}},
          {"weight only", {w, Tensor()}},
          {"neither", {Tensor(), Tensor()}}};
      for (const auto& [plabel, p] : params) {
        for (const double eps : {1e-5, 1e-2}) {
          SCOPED_TRACE(c.label + ", " + plabel + ", eps " + std::to_string(eps) + ", " +
                       dtype_name(d));
          const ops::NormAttrs a{eps};
          expect_outputs_close(OpKind::LayerNorm, {c.x, p[0], p[1]}, a, rtol, atol_fwd);
          expect_outputs_close(OpKind::LayerNormBackward, {c.g, c.x, p[0]}, a, rtol, atol_bwd);
          expect_outputs_close(OpKind::RmsNorm, {c.x, p[0]}, a, rtol, atol_fwd);
          expect_outputs_close(OpKind::RmsNormBackward, {c.g, c.x, p[0]}, a, rtol, atol_bwd);
        }
      }
    }
  }
}

TEST(CudaNorm, NormBackwardOfNoRowsGivesZeroParameterGradients) {
  HAP_REQUIRE_GPU();
  const Tensor none = Tensor::empty({0, 7}, TensorOptions{}.with_device(kGpu));
  const Tensor w = Tensor::ones({7}, TensorOptions{}.with_device(kGpu));
  const std::vector<Tensor> ln =
      ops::call(OpKind::LayerNormBackward, {none, none, w}, ops::NormAttrs{});
  ASSERT_EQ(ln.size(), 3u);
  EXPECT_EQ(ln[0].shape(), (Shape{0, 7}));
  EXPECT_EQ(ln[1].to(Device::cpu()).to_vector(), std::vector<double>(7, 0.0));
  EXPECT_EQ(ln[2].to(Device::cpu()).to_vector(), std::vector<double>(7, 0.0));
  const std::vector<Tensor> rms =
      ops::call(OpKind::RmsNormBackward, {none, none, Tensor()}, ops::NormAttrs{});
  ASSERT_EQ(rms.size(), 2u);
  EXPECT_EQ(rms[1].to(Device::cpu()).to_vector(), std::vector<double>(7, 0.0));
}

TEST(CudaNorm, NormRunsAreBitwiseReproducible) {
  HAP_REQUIRE_GPU();
  const Tensor x = normal({2100, 19}, 11, DType::F32).to(kGpu);
  const Tensor g = normal({2100, 19}, 12, DType::F32).to(kGpu);
  const Tensor w = normal({19}, 13, DType::F32).to(kGpu);
  const std::vector<Tensor> first =
      ops::call(OpKind::LayerNormBackward, {g, x, w}, ops::NormAttrs{});
  const std::vector<Tensor> again =
      ops::call(OpKind::LayerNormBackward, {g, x, w}, ops::NormAttrs{});
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_EQ(first[i].to(Device::cpu()).to_vector(), again[i].to(Device::cpu()).to_vector())
        << "output " << i;
}

TEST(CudaNorm, GeluAndItsBackwardMatchTheCpuForBothApproximations) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // f32: the CPU's tanh is a Cephes polynomial, the GPU's tanh, erf and exp its own library's:
    // a few ulp apart. Where x << 0, 1 + tanh(u) (or 1 + erf) cancels, so the forward differs by
    // ~0.5 |x| ulp(1) ~ 3e-7 absolute; in the backward, 1 - tanh(u)^2 near tanh = -1 (x ~ -5)
    // is scaled by 0.5 x du g ~ 10 |g|, which reaches ~1e-5 absolute (an emulation of both with
    // a 2-ulp tanh gave at most 8e-6 over 2e6 draws), hence atol 2e-5 there. f64: the same
    // formulas, the libraries' ulp apart.
    const double rtol = d == DType::F64 ? 1e-12 : 1e-5;
    const double atol_fwd = d == DType::F64 ? 1e-12 : 1e-6;
    const double atol_bwd = d == DType::F64 ? 1e-12 : 2e-5;
    // x [7, 33, 5]: the transposed view of a [5, 33, 7] block, values out to about +-10.
    const Tensor x = normal({5, 33, 7}, 21, d, 3.0).as_strided({7, 33, 5}, {1, 7, 231}, 0);
    const Tensor g = normal({7, 33, 5}, 22, d), g_column = normal({33, 1}, 23, d);
    const Tensor wide = normal({3, 3001}, 24, d, 3.0), g_wide = normal({3, 3001}, 25, d);
    const Tensor none = Tensor::empty({0, 4}, TensorOptions{}.with_dtype(d));
    for (const GeluApprox approx : {GeluApprox::Tanh, GeluApprox::None}) {
      SCOPED_TRACE(std::string(approx == GeluApprox::Tanh ? "tanh" : "erf") + " " + dtype_name(d));
      const ops::GeluAttrs a{approx};
      expect_outputs_close(OpKind::Gelu, {x}, a, rtol, atol_fwd);
      expect_outputs_close(OpKind::Gelu, {wide}, a, rtol, atol_fwd);
      expect_outputs_close(OpKind::Gelu, {none}, a, rtol, atol_fwd);
      expect_outputs_close(OpKind::GeluBackward, {g, x}, a, rtol, atol_bwd);
      expect_outputs_close(OpKind::GeluBackward, {g_column, x}, a, rtol, atol_bwd);  // broadcast
      expect_outputs_close(OpKind::GeluBackward, {g_wide, wide}, a, rtol, atol_bwd);
      expect_outputs_close(OpKind::GeluBackward, {none, none}, a, rtol, atol_bwd);
    }
  }
}

}  // namespace
}  // namespace hap
