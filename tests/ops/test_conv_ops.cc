// Convolution and pooling: against plain loops written from the definition, gradients by finite
// differences (f64), shapes and errors.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

TensorOptions f64(bool requires_grad = false) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(requires_grad);
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message << " (max abs error " << r.max_abs_error << ")";
}

// y[n, o, i, j] = b[o] + sum over the group's c, ki, kj of x[n, c, i s - p + ki d, j s - p + kj d]
// w[o, c', ki, kj], zeros outside x.
std::vector<double> conv_reference(const Tensor& x, const Tensor& w, const Tensor& b,
                                   std::array<int64_t, 2> s, std::array<int64_t, 2> p,
                                   std::array<int64_t, 2> d, int64_t groups, Shape* shape) {
  const Shape xs = x.shape(), ws = w.shape();
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], KH = ws[2], KW = ws[3];
  const int64_t OH = (H + 2 * p[0] - d[0] * (KH - 1) - 1) / s[0] + 1,
                OW = (W + 2 * p[1] - d[1] * (KW - 1) - 1) / s[1] + 1;
  const int64_t cg = C / groups, og = O / groups;
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector();
  const std::vector<double> bv = b.defined() ? b.to_vector() : std::vector<double>(O, 0.0);
  std::vector<double> y(N * O * OH * OW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double acc = bv[o];
          const int64_t grp = o / og;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t ki = 0; ki < KH; ++ki)
              for (int64_t kj = 0; kj < KW; ++kj) {
                const int64_t ii = i * s[0] - p[0] + ki * d[0], jj = j * s[1] - p[1] + kj * d[1];
                if (ii < 0 || ii >= H || jj < 0 || jj >= W) continue;
                acc += xv[((n * C + grp * cg + c) * H + ii) * W + jj] *
                       wv[((o * cg + c) * KH + ki) * KW + kj];
              }
          y[((n * O + o) * OH + i) * OW + j] = acc;
        }
  *shape = {N, O, OH, OW};
  return y;
}

struct ConvCase {
  std::string label;
  Shape x, w;
  bool bias;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
};

std::vector<ConvCase> conv_cases() {
  return {{"3x3 same", {2, 3, 6, 5}, {4, 3, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1},
          {"strided, no bias", {2, 4, 7, 6}, {3, 4, 3, 2}, false, {2, 2}, {0, 1}, {1, 1}, 1},
          {"dilated", {1, 2, 8, 8}, {2, 2, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 1},
          {"grouped", {2, 6, 5, 5}, {4, 3, 2, 2}, true, {1, 2}, {1, 0}, {1, 1}, 2},
          {"depthwise", {1, 4, 5, 4}, {4, 1, 3, 3}, false, {1, 1}, {1, 1}, {1, 1}, 4},
          {"1x1", {3, 5, 4, 4}, {2, 5, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 1}};
}

TEST(Conv2d, MatchesTheDefinitionInF32AndF64) {
  for (const ConvCase& c : conv_cases())
    for (DType dt : {DType::F64, DType::F32}) {
      SCOPED_TRACE(c.label + " " + dtype_name(dt));
      const TensorOptions o = TensorOptions{}.with_dtype(dt);
      Tensor x = randn(c.x, 1, 0, o), w = randn(c.w, 2, 0, o),
             b = c.bias ? randn({c.w[0]}, 3, 0, o) : Tensor();
      Shape shape;
      const std::vector<double> want =
          conv_reference(x, w, b, c.stride, c.padding, c.dilation, c.groups, &shape);
      Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      ASSERT_EQ(y.shape(), shape);
      const std::vector<double> got = y.to_vector();
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], dt == DType::F64 ? 1e-12 : 1e-4 * (1 + std::abs(want[i])))
            << "element " << i;
    }
}

TEST(Conv2d, GradientsMatchFiniteDifferences) {
  for (const ConvCase& c : conv_cases()) {
    std::vector<Tensor> in = {randn(c.x, 4, 0, f64(true)), randn(c.w, 5, 0, f64(true))};
    if (c.bias) in.push_back(randn({c.w[0]}, 6, 0, f64(true)));
    expect_gradcheck(
        [&](const std::vector<Tensor>& v) {
          return conv2d(v[0], v[1], c.bias ? v[2] : Tensor(), c.stride, c.padding, c.dilation,
                        c.groups);
        },
        in, c.label);
  }
}

TEST(Conv2d, BadShapesNameTheOpAndWhatWasExpected) {
  Tensor x = Tensor::zeros({1, 4, 5, 5}), w = Tensor::zeros({2, 4, 3, 3});
  EXPECT_HAS(test_util::error_of([&] {
               conv2d(Tensor::zeros({4, 5, 5}), w);
             }),
             "input must be [N, C, H, W]");
  EXPECT_HAS(test_util::error_of([&] {
               conv2d(x, Tensor::zeros({2, 3, 3, 3}));
             }),
             "takes 3 input channels");
  EXPECT_HAS(test_util::error_of([&] {
               conv2d(x, Tensor::zeros({3, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
             }),
             "groups 2 must divide");
  EXPECT_HAS(test_util::error_of([&] {
               conv2d(x, Tensor::zeros({2, 4, 7, 7}));
             }),
             "does not fit the input");
  EXPECT_HAS(test_util::error_of([&] { conv2d(x, w, Tensor(), {0, 1}); }), "stride must be >= 1");
  EXPECT_HAS(test_util::error_of([&] { conv2d(x, w, Tensor::zeros({3})); }),
             "bias [3] must be [2]");
}

// Max over each window, padding never chosen; the first maximum takes the gradient.
TEST(Pool2d, MaxAndAverageMatchTheDefinition) {
  Tensor x = randn({2, 3, 7, 6}, 7, 0, f64());
  const std::vector<double> v = x.to_vector();
  for (auto [kernel, stride, pad] : std::vector<std::array<std::array<int64_t, 2>, 3>>{
           {{{2, 2}, {2, 2}, {0, 0}}}, {{{3, 2}, {2, 1}, {1, 1}}}, {{{3, 3}, {1, 1}, {1, 0}}}}) {
    SCOPED_TRACE("kernel " + std::to_string(kernel[0]) + "x" + std::to_string(kernel[1]));
    Tensor mx = max_pool2d(x, kernel, stride, pad), av = avg_pool2d(x, kernel, stride, pad);
    const int64_t OH = (7 + 2 * pad[0] - kernel[0]) / stride[0] + 1,
                  OW = (6 + 2 * pad[1] - kernel[1]) / stride[1] + 1;
    ASSERT_EQ(mx.shape(), (Shape{2, 3, OH, OW}));
    const std::vector<double> m = mx.to_vector(), a = av.to_vector();
    for (int64_t pl = 0; pl < 6; ++pl)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          double best = -std::numeric_limits<double>::infinity(), sum = 0;
          for (int64_t ki = 0; ki < kernel[0]; ++ki)
            for (int64_t kj = 0; kj < kernel[1]; ++kj) {
              const int64_t ii = i * stride[0] - pad[0] + ki, jj = j * stride[1] - pad[1] + kj;
              if (ii < 0 || ii >= 7 || jj < 0 || jj >= 6) continue;
              best = std::max(best, v[(pl * 7 + ii) * 6 + jj]);
              sum += v[(pl * 7 + ii) * 6 + jj];
            }
          const size_t at = static_cast<size_t>((pl * OH + i) * OW + j);
          EXPECT_EQ(m[at], best);
          EXPECT_NEAR(a[at], sum / static_cast<double>(kernel[0] * kernel[1]), 1e-14);
        }
  }
}

TEST(Pool2d, GradientsMatchFiniteDifferences) {
  // Distinct values, so that no window's maximum is a tie that finite differences would split.
  std::vector<double> v(2 * 2 * 6 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37) % v.size()) * 0.1 - 5.0;
  Tensor leaf = Tensor::from_vector(v, {2, 2, 6, 5}, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& v) {
        return max_pool2d(v[0], {2, 2}, {2, 1}, {1, 0});
      },
      {leaf}, "max_pool2d");
  expect_gradcheck(
      [](const std::vector<Tensor>& v) {
        return avg_pool2d(v[0], {3, 2}, {1, 2}, {1, 1});
      },
      {leaf}, "avg_pool2d overlapping windows");
}

TEST(Pool2d, AdaptiveAveragePoolingTakesWholeWindows) {
  Tensor x = randn({2, 3, 4, 6}, 8, 0, f64());
  EXPECT_TRUE(test_util::error_of([&] {
                adaptive_avg_pool2d(x, {3, 3});
              }).find("must divide") != std::string::npos);
  const std::vector<double> got = adaptive_avg_pool2d(x, {1, 1}).to_vector(),
                            want = mean(x, {2, 3}).to_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-14);
  EXPECT_EQ(adaptive_avg_pool2d(x, {2, 3}).shape(), (Shape{2, 3, 2, 3}));
  EXPECT_HAS(test_util::error_of([&] { max_pool2d(x, {5, 5}); }), "does not fit");
  EXPECT_HAS(test_util::error_of([&] {
               max_pool2d(x, {2, 2}, {2, 2}, {2, 2});
             }),
             "at most half the kernel");
}

}  // namespace
}  // namespace hap
