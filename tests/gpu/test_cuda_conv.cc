// conv2d, max and average pooling and their backward kernels on a GPU, against the CPU's
// (ops/defs/conv.cc): strides, padding, dilation, groups (depthwise too), 1x1 and 3x3 kernels,
// odd sizes, with and without bias, transposed input views, batches of several chunks, empty
// batches, f32 and f64, through cuDNN and through the own im2col kernels, and max pooling's tie
// rule on integer-valued inputs. Each test skips
// without a visible GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/cuda/cudnn.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "tests/gpu/gpu_test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

// Normal values drawn in f64, stored as d: packed [N, C, H, W], or (transposed) a view of
// [N, C, W, H] storage with the last two dims swapped.
Tensor input(const Shape& s, uint64_t seed, DType d, bool transposed) {
  if (!transposed) return randn(s, seed, 0, f64()).to(d);
  const Tensor packed = randn({s[0], s[1], s[3], s[2]}, seed, 0, f64()).to(d);
  return packed.as_strided(s, {s[1] * s[2] * s[3], s[2] * s[3], 1, s[2]}, 0);
}

Tensor on_gpu(const Tensor& t) { return t.defined() ? same_view_on_gpu(t) : Tensor(); }

// The GEMMs sum each output over K = C / groups * KH * KW <= 45 products (the forward and dx) or
// N * OH * OW <= 189 products (dw, db) of N(0, 1) values, in another order than OpenBLAS and the
// CPU's loops (cuBLAS may also split the sum). The partial sums of such random-sign terms stay
// near sqrt(terms) <= 14, so the two orders' roundings differ by about sqrt(terms) * 14 * 2^-24
// ~ 1e-5 in f32 (1e-14 in f64): the bounds leave a margin of 10 or more.
double conv_rtol(DType d) { return d == DType::F64 ? 1e-11 : 1e-4; }
double conv_atol(DType d) { return d == DType::F64 ? 1e-11 : 2e-4; }

struct ConvCase {
  std::string label;
  Shape x, w;
  bool bias;
  ops::Conv2dAttrs attrs;
};

std::vector<ConvCase> conv_cases() {
  using A = ops::Conv2dAttrs;
  return {
      {"3x3, stride 2, padding 1", {3, 5, 7, 9}, {4, 5, 3, 3}, true, A{{2, 2}, {1, 1}, {1, 1}, 1}},
      {"3x3, dilation 2, padding 2",
       {3, 5, 7, 9},
       {6, 5, 3, 3},
       false,
       A{{1, 1}, {2, 2}, {2, 2}, 1}},
      {"1x1", {3, 5, 7, 9}, {3, 5, 1, 1}, true, A{}},
      {"1x1, stride 2", {3, 5, 7, 9}, {4, 5, 1, 1}, false, A{{2, 2}, {0, 0}, {1, 1}, 1}},
      {"groups 2, 3x2, strides 1 and 2",
       {3, 6, 7, 9},
       {4, 3, 3, 2},
       true,
       A{{1, 2}, {1, 0}, {1, 1}, 2}},
      {"groups 2, 2x3, uneven stride, padding and dilation",
       {2, 4, 9, 7},
       {6, 2, 2, 3},
       false,
       A{{2, 1}, {0, 2}, {2, 1}, 2}},
      {"depthwise", {3, 5, 7, 9}, {5, 1, 3, 3}, true, A{{1, 1}, {1, 1}, {1, 1}, 5}},
      {"depthwise, two filters per channel, stride 2",
       {3, 5, 7, 9},
       {10, 1, 3, 3},
       false,
       A{{2, 2}, {1, 1}, {1, 1}, 5}},
      {"padding wider than the kernel",
       {2, 3, 5, 4},
       {2, 3, 3, 3},
       true,
       A{{2, 1}, {3, 3}, {1, 1}, 1}},
      {"one image", {1, 5, 7, 9}, {4, 5, 3, 3}, true, A{{1, 1}, {1, 1}, {1, 1}, 1}},
  };
}

// conv2d on both devices, then conv2d_backward (dx, dw, db) with a gradient of the output's shape
// (a transposed view too when the input is one).
void expect_conv_matches_cpu(const ConvCase& c, DType d, bool transposed) {
  const double rtol = conv_rtol(d), atol = conv_atol(d);
  const Tensor x = input(c.x, 1, d, transposed), w = randn(c.w, 2, 0, f64()).to(d);
  const Tensor b = c.bias ? randn({c.w[0]}, 3, 0, f64()).to(d) : Tensor();
  const Tensor y = ops::call1(OpKind::Conv2d, {x, w, b}, c.attrs);
  expect_close(ops::call1(OpKind::Conv2d, {on_gpu(x), on_gpu(w), on_gpu(b)}, c.attrs), y, rtol,
               atol, "conv2d");
  const Tensor gy = input(y.shape(), 4, d, transposed);
  const std::vector<Tensor> want = ops::call(OpKind::Conv2dBackward, {gy, x, w}, c.attrs);
  const std::vector<Tensor> got =
      ops::call(OpKind::Conv2dBackward, {on_gpu(gy), on_gpu(x), on_gpu(w)}, c.attrs);
  ASSERT_EQ(got.size(), 3u);
  const std::array<const char*, 3> names = {"dx", "dw", "db"};
  for (size_t i = 0; i < 3; ++i) expect_close(got[i], want[i], rtol, atol, names[i]);
}

// cuDNN's convolutions (ops/cuda/conv_cudnn.h) and the own im2col kernels (HAP_CUDNN=0, or where
// cuDNN refuses a geometry) each match the CPU on every geometry. cuDNN must be found
// (HAP_CUDNN_LIBRARY, the library path or the toolkit's folder) and must run the convolutions of
// most geometries; with it off, it runs none.
TEST(CudaConv, CudnnAndTheOwnKernelsEachMatchTheCpu) {
  HAP_REQUIRE_GPU();
  ASSERT_NE(cuda::cudnn(), nullptr) << cuda::cudnn_unavailable_reason();
  struct Restore {
    ~Restore() { cuda::set_cudnn_enabled(true); }
  } restore;
  for (const bool use_cudnn : {true, false}) {
    cuda::set_cudnn_enabled(use_cudnn);
    int cases = 0, by_cudnn = 0;
    for (const ConvCase& c : conv_cases()) {
      for (DType d : {DType::F32, DType::F64}) {
        SCOPED_TRACE(c.label + " " + dtype_name(d) + (use_cudnn ? ", cuDNN" : ", own kernels"));
        const int64_t before = cuda::cudnn_convolutions();
        expect_conv_matches_cpu(c, d, false);
        ++cases;
        // A forward and both backward convolutions at most: the forward and the backward each
        // take cuDNN where it has an algorithm HAP accepts for them (a backward whose filter
        // gradient cuDNN refuses after its data gradient ran counts that one call).
        const int64_t calls = cuda::cudnn_convolutions() - before;
        if (use_cudnn) {
          EXPECT_LE(calls, 3) << calls << " cuDNN calls";
          by_cudnn += calls > 0;
        } else {
          EXPECT_EQ(calls, 0) << "cuDNN ran while turned off";
        }
      }
    }
    if (use_cudnn) {
      EXPECT_GE(2 * by_cudnn, cases) << "cuDNN ran " << by_cudnn << " of " << cases
                                     << " geometries; the others fell back to the own kernels";
    }
  }
}

TEST(CudaConv, Conv2dAndItsGradientsMatchTheCpuForEveryGeometry) {
  HAP_REQUIRE_GPU();
  for (const ConvCase& c : conv_cases()) {
    for (DType d : {DType::F32, DType::F64}) {
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(c.label + " " + dtype_name(d) + (transposed ? ", transposed views" : ""));
        expect_conv_matches_cpu(c, d, transposed);
      }
    }
  }
}

// 7 images of 16 x 200 x 210 fill more than one im2col chunk (ops/cuda/conv.cu's column budget
// of 2^25 elements holds 5 of them): the chunks' outputs land in the right images and the weight
// gradient sums over all of them. f64, so the tolerance only covers the summation order.
TEST(CudaConv, BatchesLargerThanOneChunkMatchTheCpu) {
  HAP_REQUIRE_GPU();
  struct Restore {
    ~Restore() { cuda::set_cudnn_enabled(true); }
  } restore;
  for (const bool use_cudnn : {true, false}) {  // (the chunks are the own kernels')
    SCOPED_TRACE(use_cudnn ? "cuDNN" : "own kernels");
    cuda::set_cudnn_enabled(use_cudnn);
    expect_conv_matches_cpu(
        {"7 large images", {7, 16, 200, 210}, {4, 16, 3, 3}, true, {{1, 1}, {1, 1}, {1, 1}, 1}},
        DType::F64, false);
  }
}

TEST(CudaConv, TheBackwardIsDeterministic) {
  HAP_REQUIRE_GPU();
  const ops::Conv2dAttrs a{{1, 1}, {1, 1}, {1, 1}, 2};
  const Tensor x = randn({3, 6, 7, 9}, 5).to(kGpu), w = randn({4, 3, 3, 3}, 6).to(kGpu),
               gy = randn({3, 4, 7, 9}, 7).to(kGpu);
  const std::vector<Tensor> first = ops::call(OpKind::Conv2dBackward, {gy, x, w}, a),
                            second = ops::call(OpKind::Conv2dBackward, {gy, x, w}, a);
  for (size_t i = 0; i < 3; ++i)
    expect_equal(first[i], second[i].to(Device::cpu()), "output " + std::to_string(i));
}

// No images: an empty output and input gradient, zero weight and bias gradients (empty sums).
TEST(CudaConv, AnEmptyBatchGivesEmptyOutputsAndZeroParameterGradients) {
  HAP_REQUIRE_GPU();
  const ops::Conv2dAttrs a{{1, 1}, {1, 1}, {1, 1}, 2};
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    const TensorOptions o = TensorOptions{}.with_dtype(d), og = TensorOptions(o).with_device(kGpu);
    const Tensor x = Tensor::zeros({0, 4, 5, 5}, o), w = randn({6, 2, 3, 3}, 8, 0, f64()).to(d),
                 b = randn({6}, 9, 0, f64()).to(d), gy = Tensor::zeros({0, 6, 5, 5}, o);
    const Tensor xg = Tensor::zeros(x.shape(), og), gyg = Tensor::zeros(gy.shape(), og);
    const Tensor y = ops::call1(OpKind::Conv2d, {xg, w.to(kGpu), b.to(kGpu)}, a);
    EXPECT_EQ(y.shape(), (Shape{0, 6, 5, 5}));
    EXPECT_EQ(y.device(), kGpu);
    const std::vector<Tensor> want = ops::call(OpKind::Conv2dBackward, {gy, x, w}, a),
                              got = ops::call(OpKind::Conv2dBackward, {gyg, xg, w.to(kGpu)}, a);
    for (size_t i = 0; i < 3; ++i) expect_equal(got[i], want[i], "output " + std::to_string(i));
  }
}

// ---- pooling ----

struct PoolCase {
  std::string label;
  ops::Pool2dAttrs attrs;  // kernel, stride, padding
};

std::vector<PoolCase> pool_cases() {
  return {{"2x2, stride 2", {{2, 2}, {2, 2}, {0, 0}}},
          {"3x3, stride 1, padding 1 (overlapping windows)", {{3, 3}, {1, 1}, {1, 1}}},
          {"3x2, strides 2 and 1, padding 1", {{3, 2}, {2, 1}, {1, 1}}},
          {"3x3, stride 2, padding 1 and 0", {{3, 3}, {2, 2}, {1, 0}}},
          {"2x3, strides 1 and 2, padding 1", {{2, 3}, {1, 2}, {1, 1}}},
          {"4x4, stride 3, padding 2 (half the kernel)", {{4, 4}, {3, 3}, {2, 2}}},
          {"5x3, stride 1, padding 2 and 1", {{5, 3}, {1, 1}, {2, 1}}},
          {"1x1", {{1, 1}, {1, 1}, {0, 0}}}};
}

// Max pooling forward and backward, average pooling forward: the same additions in the same
// order as the CPU, so equal bit for bit. Average pooling's backward adds gy * (1 / (KH * KW))
// per window; the CPU build (-march=native) may fuse that multiply-add, the GPU rounds the
// product first: a few ulp of the result at most.
void expect_pools_match_cpu(const Tensor& x, const ops::Pool2dAttrs& a) {
  const bool single = x.dtype() == DType::F32;
  const Tensor xg = on_gpu(x);
  const Tensor ymax = ops::call1(OpKind::MaxPool2d, {x}, a);
  expect_equal(ops::call1(OpKind::MaxPool2d, {xg}, a), ymax, "max_pool2d");
  const Tensor gy = input(ymax.shape(), 11, x.dtype(), !x.is_contiguous());
  expect_equal(ops::call1(OpKind::MaxPool2dBackward, {on_gpu(gy), xg}, a),
               ops::call1(OpKind::MaxPool2dBackward, {gy, x}, a), "max_pool2d_backward");
  expect_equal(ops::call1(OpKind::AvgPool2d, {xg}, a), ops::call1(OpKind::AvgPool2d, {x}, a),
               "avg_pool2d");
  expect_close(ops::call1(OpKind::AvgPool2dBackward, {on_gpu(gy), xg}, a),
               ops::call1(OpKind::AvgPool2dBackward, {gy, x}, a), single ? 1e-6 : 1e-14,
               single ? 1e-6 : 1e-15, "avg_pool2d_backward");
}

TEST(CudaPool, MaxAndAveragePoolingMatchTheCpuForEveryGeometry) {
  HAP_REQUIRE_GPU();
  for (const PoolCase& c : pool_cases()) {
    for (DType d : {DType::F32, DType::F64}) {
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(c.label + " " + dtype_name(d) + (transposed ? ", transposed views" : ""));
        expect_pools_match_cpu(input({3, 5, 7, 9}, 10, d, transposed), c.attrs);
      }
    }
  }
}

// Values in {0, 1, 2}: most windows hold several maxima, and the gradient must reach the first
// of them in window order, as on the CPU.
TEST(CudaPool, MaxPoolingTiesGoToTheFirstMaximumAsOnTheCpu) {
  HAP_REQUIRE_GPU();
  std::vector<double> v = rand({3, 5, 7, 9}, 12, 0, f64()).to_vector();
  for (double& e : v) e = std::floor(e * 3);
  for (const PoolCase& c : pool_cases()) {
    for (DType d : {DType::F32, DType::F64}) {
      SCOPED_TRACE(c.label + " " + dtype_name(d));
      const Tensor x = Tensor::from_vector(v, {3, 5, 7, 9}, TensorOptions{}.with_dtype(d));
      expect_pools_match_cpu(x, c.attrs);
      expect_pools_match_cpu(Tensor::zeros({3, 5, 7, 9}, TensorOptions{}.with_dtype(d)), c.attrs);
    }
  }
  // All equal, 2x2 windows every step: each window's top-left element takes its gradient.
  const ops::Pool2dAttrs a{{2, 2}, {1, 1}, {0, 0}};
  const Tensor dx =
      ops::call1(OpKind::MaxPool2dBackward,
                 {Tensor::ones({1, 1, 2, 2}).to(kGpu), Tensor::zeros({1, 1, 3, 3}).to(kGpu)}, a);
  EXPECT_EQ(dx.to(Device::cpu()).to_vector(), (std::vector<double>{1, 1, 0, 1, 1, 0, 0, 0, 0}));
}

// Padding is skipped, never taken as a zero: all-negative inputs pool to themselves.
TEST(CudaPool, MaxPoolingNeverChoosesThePadding) {
  HAP_REQUIRE_GPU();
  const ops::Pool2dAttrs a{{3, 3}, {1, 1}, {1, 1}};
  const Tensor y = ops::call1(OpKind::MaxPool2d, {Tensor::full({1, 1, 3, 4}, -1.5).to(kGpu)}, a);
  EXPECT_EQ(y.to(Device::cpu()).to_vector(), std::vector<double>(12, -1.5));
}

// A NaN beats every number and the first NaN of a window takes the gradient, as on the CPU.
TEST(CudaPool, MaxPoolingPropagatesNansAsTheCpuDoes) {
  HAP_REQUIRE_GPU();
  const ops::Pool2dAttrs a{{3, 3}, {2, 1}, {1, 1}};
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    std::vector<double> v = randn({2, 3, 7, 9}, 13, 0, f64()).to_vector();
    for (size_t i : {0u, 1u, 10u, 40u, 41u, 50u, 200u, 377u})
      v[i] = std::numeric_limits<double>::quiet_NaN();
    const Tensor x = Tensor::from_vector(v, {2, 3, 7, 9}, TensorOptions{}.with_dtype(d));
    const std::vector<double>
        want = ops::call1(OpKind::MaxPool2d, {x}, a).to_vector(),
        got = ops::call1(OpKind::MaxPool2d, {x.to(kGpu)}, a).to(Device::cpu()).to_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) {
        EXPECT_TRUE(std::isnan(got[i])) << "element " << i;
      } else {
        EXPECT_EQ(got[i], want[i]) << "element " << i;
      }
    }
    const Tensor gy = randn({2, 3, 4, 9}, 14, 0, f64()).to(d);
    expect_equal(ops::call1(OpKind::MaxPool2dBackward, {gy.to(kGpu), x.to(kGpu)}, a),
                 ops::call1(OpKind::MaxPool2dBackward, {gy, x}, a), "max_pool2d_backward");
  }
}

// Average pooling divides by the whole window, padding included (count_include_pad).
TEST(CudaPool, AveragePoolingCountsThePaddingInTheDivisor) {
  HAP_REQUIRE_GPU();
  const ops::Pool2dAttrs a{{3, 3}, {1, 1}, {1, 1}};
  const std::vector<double> y =
      ops::call1(OpKind::AvgPool2d, {Tensor::ones({1, 1, 3, 3}, f64()).to(kGpu)}, a)
          .to(Device::cpu())
          .to_vector();
  const std::vector<double> want = {4, 6, 4, 6, 9, 6, 4, 6, 4};
  ASSERT_EQ(y.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y[i], want[i] / 9, 1e-15) << i;
}

TEST(CudaPool, EmptyBatchesGiveEmptyResults) {
  HAP_REQUIRE_GPU();
  const ops::Pool2dAttrs a{{3, 3}, {2, 2}, {1, 1}};
  const TensorOptions o = TensorOptions{}.with_device(kGpu);
  const Tensor x = Tensor::zeros({0, 3, 7, 9}, o), gy = Tensor::zeros({0, 3, 4, 5}, o);
  EXPECT_EQ(ops::call1(OpKind::MaxPool2d, {x}, a).shape(), (Shape{0, 3, 4, 5}));
  EXPECT_EQ(ops::call1(OpKind::AvgPool2d, {x}, a).shape(), (Shape{0, 3, 4, 5}));
  EXPECT_EQ(ops::call1(OpKind::MaxPool2dBackward, {gy, x}, a).shape(), x.shape());
  EXPECT_EQ(ops::call1(OpKind::AvgPool2dBackward, {gy, x}, a).shape(), x.shape());
}

}  // namespace
}  // namespace hap
