// The nn, loss and attention ops: fused kernels against plain double-precision loops, gradients
// by finite differences (f64), dropout masks against Philox, sharding signatures and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/rng.h"
#include "ops/cpu/vec_math.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/op.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using autograd::gradcheck;
using autograd::GradcheckOptions;
using ops::OpKind;

TensorOptions f64(bool requires_grad = false) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(requires_grad);
}
TensorOptions f32() { return TensorOptions{}.with_dtype(DType::F32); }

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

void expect_close(const Tensor& actual, const std::vector<double>& expected, double rtol,
                  double atol, const std::string& what) {
  std::vector<double> a = actual.to_vector();
  ASSERT_EQ(a.size(), expected.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::abs(a[i] - expected[i]), atol + rtol * std::abs(expected[i]))
        << what << ": element " << i << " is " << a[i] << ", expected " << expected[i];
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message << " (max abs error " << r.max_abs_error << ")";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void expect_mentions(const std::string& msg, const std::vector<std::string>& parts) {
  for (const std::string& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
}

// ---------------- references: plain loops in double ----------------

// Softmax (or log_softmax) along `dim` of a row-major tensor.
std::vector<double> softmax_ref(const std::vector<double>& x, const Shape& s, int64_t dim,
                                bool log) {
  int64_t outer = 1, n = s[dim], inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= s[d];
  for (int64_t d = dim + 1; d < static_cast<int64_t>(s.size()); ++d) inner *= s[d];
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t r) { return (o * n + r) * inner + i; };
      double mx = -INFINITY, sum = 0;
      for (int64_t r = 0; r < n; ++r) mx = std::max(mx, x[at(r)]);
      for (int64_t r = 0; r < n; ++r) sum += std::exp(x[at(r)] - mx);
      for (int64_t r = 0; r < n; ++r)
        y[at(r)] = log ? x[at(r)] - mx - std::log(sum) : std::exp(x[at(r)] - mx) / sum;
    }
  return y;
}

// layer_norm (rms = false) or rms_norm over the last dim; empty w/b mean omitted.
std::vector<double> norm_ref(const std::vector<double>& x, int64_t c, const std::vector<double>& w,
                             const std::vector<double>& b, double eps, bool rms) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    const double* xr = x.data() + r * c;
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < c; ++j) mean += xr[j];
      mean /= c;
    }
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= c;
    for (int64_t j = 0; j < c; ++j)
      y[r * c + j] = (xr[j] - mean) / std::sqrt(var + eps) * (w.empty() ? 1.0 : w[j]) +
                     (b.empty() ? 0.0 : b[j]);
  }
  return y;
}

std::vector<double> cross_entropy_ref(const std::vector<double>& x, int64_t v,
                                      const std::vector<int64_t>& targets, int64_t ignore) {
  double total = 0;
  int64_t count = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == ignore) continue;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[i * v + j]);
    for (int64_t j = 0; j < v; ++j) sum += std::exp(x[i * v + j] - mx);
    total += mx + std::log(sum) - x[i * v + targets[i]];
    ++count;
  }
  return {count == 0 ? 0.0 : total / count};
}

struct AttentionRef {
  std::vector<double> out, lse;
};

// q, k: [B, H, T, D], v: [B, H, T, Dv]; dropout keeps element (b, h, i, j) of the probabilities
// when philox_uniform(seed, stream, logical index) < 1 - p.
AttentionRef attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           double scale, double p = 0, uint64_t seed = 0, uint64_t stream = 0) {
  int64_t nb = q.size(0), nh = q.size(1), t = q.size(2), d = q.size(3), dv = v.size(3);
  std::vector<double> qv = q.to_vector(), kv = k.to_vector(), vv = v.to_vector();
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  AttentionRef r{std::vector<double>(nb * nh * t * dv, 0.0), std::vector<double>(nb * nh * t)};
  for (int64_t bh = 0; bh < nb * nh; ++bh)
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> s(t, -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < t; ++j) {
        if (causal && j > i) continue;
        double acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += qv[(bh * t + i) * d + c] * kv[(bh * t + j) * d + c];
        s[j] = acc * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < t; ++j) sum += std::exp(s[j] - mx);
      r.lse[bh * t + i] = mx + std::log(sum);
      for (int64_t j = 0; j < t; ++j) {
        double pj = std::exp(s[j] - mx) / sum;
        if (p > 0) {
          uint64_t idx = static_cast<uint64_t>((bh * t + i) * t + j);
          pj = static_cast<double>(philox_uniform(seed, stream, idx)) < 1.0 - p ? pj / (1.0 - p)
                                                                                : 0.0;
        }
        for (int64_t c = 0; c < dv; ++c)
          r.out[(bh * t + i) * dv + c] += pj * vv[(bh * t + j) * dv + c];
      }
    }
  return r;
}

std::vector<Tensor> attention_call(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                   double scale = 0, double p = 0, uint64_t seed = 0,
                                   uint64_t stream = 0, LogicalSlice slice = {}) {
  return ops::call(OpKind::Attention, {q, k, v, Tensor()},
                   ops::AttentionAttrs{causal, scale, ops::RandomAttrs{p, seed, stream, slice}});
}

// ---------------- softmax / log_softmax ----------------

TEST(NnSoftmax, LastDimMatchesReferenceInF32AndF64) {
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor x = randn({6, 37}, 1, 0, TensorOptions{}.with_dtype(dt)) * 4.0;
    double tol = dt == DType::F32 ? 2e-6 : 1e-12;
    expect_close(softmax(x, -1), softmax_ref(x.to_vector(), x.shape(), 1, false), tol, tol * 1e-1,
                 "softmax");
    expect_close(log_softmax(x, 1), softmax_ref(x.to_vector(), x.shape(), 1, true), tol, tol,
                 "log_softmax");
  }
}

TEST(NnSoftmax, EveryOtherDimMatchesReference) {
  Tensor x = randn({3, 5, 7}, 2, 0, f64());
  for (int64_t dim = 0; dim < 3; ++dim) {
    expect_close(softmax(x, dim), softmax_ref(x.to_vector(), x.shape(), dim, false), 1e-12, 1e-14,
                 "softmax dim " + std::to_string(dim));
    expect_close(log_softmax(x, dim), softmax_ref(x.to_vector(), x.shape(), dim, true), 1e-12,
                 1e-12, "log_softmax dim " + std::to_string(dim));
  }
}

TEST(NnSoftmax, NonContiguousInputMatchesContiguous) {
  Tensor x = randn({4, 9}, 3, 0, f32());
  Tensor xt = transpose(x, 0, 1);  // [9, 4], not contiguous
  expect_close(softmax(xt, -1), softmax(contiguous(xt), -1).to_vector(), 0, 0, "softmax of a view");
}

TEST(NnSoftmax, IsStableForLargeLogitsAndZeroWhereMinusInfinity) {
  Tensor x = Tensor::from_vector(std::vector<double>{1000, 1001, -INFINITY, 999}, {1, 4}, f32());
  std::vector<double> e = {std::exp(-1.0), 1.0, 0.0, std::exp(-2.0)};
  double s = e[0] + e[1] + e[3];
  for (double& v : e) v /= s;
  expect_close(softmax(x, -1), e, 1e-6, 1e-7, "softmax");
  EXPECT_EQ(softmax(x, -1).item_at(2), 0.0);
}

// The row maximum of softmax, cross-entropy and attention (16 running maxima, then the tail):
// the running std::max's value for every length around the lanes' multiples, with NaN skipped
// (also a row of NaN alone: -inf), the largest in any lane or in the tail, f32 and f64.
template <typename T>
void check_row_maximum() {
  std::vector<T> x(70);
  for (size_t n = 0; n <= x.size(); ++n) {
    for (size_t at = 0; at < std::max<size_t>(n, 1); ++at) {
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(std::sin(0.7 * i) * 10 - 20);
      if (n > 0) x[at] = static_cast<T>(5);  // the largest, at each place
      if (n > 3) x[(at + 3) % n] = std::numeric_limits<T>::quiet_NaN();  // skipped
      if (n > 5) x[(at + 5) % n] = -std::numeric_limits<T>::infinity();
      T running = -std::numeric_limits<T>::infinity();
      for (size_t i = 0; i < n; ++i) running = std::max(running, x[i]);
      ASSERT_EQ(cpu::max_skipping_nan(x.data(), static_cast<int64_t>(n)), running)
          << "n " << n << ", largest at " << at;
    }
  }
  std::vector<T> nans(20, std::numeric_limits<T>::quiet_NaN());
  EXPECT_EQ(cpu::max_skipping_nan(nans.data(), 20), -std::numeric_limits<T>::infinity());
}

TEST(NnSoftmax, RowMaximumIsTheRunningMaximumSkippingNan) {
  check_row_maximum<float>();
  check_row_maximum<double>();
}

TEST(NnSoftmax, GradientsMatchFiniteDifferences) {
  Tensor x = randn({3, 4, 5}, 4, 0, f64(true));
  for (int64_t dim : {-1, 1, 0}) {
    expect_gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); }, {x},
                     "softmax dim " + std::to_string(dim));
    expect_gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); }, {x},
                     "log_softmax dim " + std::to_string(dim));
  }
}

TEST(NnSoftmax, OutOfRangeDimNamesTheOp) {
  Tensor x = randn({2, 3}, 5);
  expect_mentions(error_of([&] { softmax(x, 2); }), {"softmax", "2", "2 dims"});
}

TEST(NnSoftmax, ShardsEveryDimButTheNormalisedOne) {
  ops::Metas in{{{4, 6, 8}, DType::F32}};
  auto sigs = ops::op_def(OpKind::Softmax).shard(in, in, ops::DimAttrs{1, false});
  ASSERT_EQ(sigs.size(), 2u);
  EXPECT_EQ(sigs[0].inputs[0], ops::Prop::sharded(0));
  EXPECT_EQ(sigs[1].outputs[0], ops::Prop::sharded(2));
}

// ---------------- batch_norm (batch statistics) ----------------

TEST(NnBatchNorm, EveryChannelIsNormalisedOverTheBatchAndTheOtherDims) {
  Tensor x = randn({6, 3, 4, 5}, 21, 0, f64()) * 2.0 + 3.0;
  Tensor w = Tensor::from_vector(std::vector<double>{1.0, 2.0, -0.5}, {3}, f64());
  Tensor b = Tensor::from_vector(std::vector<double>{0.0, 1.0, 4.0}, {3}, f64());
  const std::vector<double> y = batch_norm(x, w, b, 1e-5).to_vector(), xv = x.to_vector();
  for (int c = 0; c < 3; ++c) {
    double mean = 0, var = 0, ym = 0, yv = 0;
    std::vector<size_t> at;
    for (size_t n = 0; n < 6; ++n)
      for (size_t k = 0; k < 20; ++k) at.push_back((n * 3 + static_cast<size_t>(c)) * 20 + k);
    for (size_t i : at) mean += xv[i] / 120.0;
    for (size_t i : at) var += (xv[i] - mean) * (xv[i] - mean) / 120.0;
    for (size_t i : at) {
      const double expect =
          (xv[i] - mean) / std::sqrt(var + 1e-5) * w.to_vector()[c] + b.to_vector()[c];
      EXPECT_NEAR(y[i], expect, 1e-12) << c << " " << i;
      ym += y[i] / 120.0;
    }
    for (size_t i : at) yv += (y[i] - ym) * (y[i] - ym) / 120.0;
    EXPECT_NEAR(ym, b.to_vector()[c], 1e-12);
    EXPECT_NEAR(yv, w.to_vector()[c] * w.to_vector()[c] * var / (var + 1e-5), 1e-9);
  }
}

TEST(NnBatchNorm, GradientsMatchFiniteDifferences) {
  Tensor x = randn({4, 3, 2, 3}, 22, 0, f64(true));
  Tensor w = randn({3}, 23, 0, f64(true)), b = randn({3}, 24, 0, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], 1e-5); },
      {x, w, b}, "batch_norm x, weight, bias");
  Tensor flat = randn({7, 4}, 25, 0, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], Tensor(), Tensor(), 1e-3); },
      {flat}, "batch_norm [N, C] without parameters");
}

TEST(NnBatchNorm, BadShapesAreNamed) {
  EXPECT_HAS(error_of([] { batch_norm(randn({5}, 1), Tensor(), Tensor()); }), "[N, C, ...]");
  EXPECT_HAS(error_of([] {
               batch_norm(randn({2, 3, 4}, 1), randn({4}, 2), Tensor());
             }),
             "must be [3]");
  EXPECT_HAS(error_of([] { batch_norm(randn({2, 3}, 1), Tensor(), Tensor(), 0.0); }), "eps");
}

// ---------------- batch_norm with running statistics ----------------

// Per channel c of x [N, C, ...]: the batch mean and biased variance.
std::pair<std::vector<double>, std::vector<double>> channel_stats(const Tensor& x) {
  const std::vector<double> v = x.to_vector();
  const int64_t C = x.size(1), inner = x.numel() / (x.size(0) * C);
  const double n = static_cast<double>(x.numel() / C);
  std::vector<double> mean(static_cast<size_t>(C)), var(static_cast<size_t>(C));
  for (int64_t pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < x.size(0); ++i)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t k = 0; k < inner; ++k) {
          const double e = v[static_cast<size_t>((i * C + c) * inner + k)];
          const size_t cs = static_cast<size_t>(c);
          if (pass == 0)
            mean[cs] += e / n;
          else
            var[cs] += (e - mean[cs]) * (e - mean[cs]) / n;
        }
  return {mean, var};
}

TEST(NnBatchNorm, TrainingUpdatesTheRunningStatisticsAsPyTorchDoes) {
  Tensor x = randn({6, 3, 4, 5}, 31, 0, f64()) * 2.0 + 3.0;
  Tensor w = randn({3}, 32, 0, f64()), b = randn({3}, 33, 0, f64());
  const std::vector<double> m0 = {0.5, -1.0, 2.0}, v0 = {1.0, 3.0, 0.25};
  Tensor rm = Tensor::from_vector(m0, {3}, f64()), rv = Tensor::from_vector(v0, {3}, f64());
  const Tensor y = batch_norm(x, w, b, rm, rv, /*training=*/true, 0.3, 1e-5);
  // The output is the batch-statistics batch norm's; the statistics move by momentum 0.3, the
  // variance unbiased over the 120 values per channel.
  expect_close(y, batch_norm(x, w, b, 1e-5).to_vector(), 1e-12, 1e-12, "training output");
  const auto [mean, var] = channel_stats(x);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_NEAR(rm.to_vector()[c], 0.7 * m0[c] + 0.3 * mean[c], 1e-12) << c;
    EXPECT_NEAR(rv.to_vector()[c], 0.7 * v0[c] + 0.3 * var[c] * 120.0 / 119.0, 1e-12) << c;
  }
}

TEST(NnBatchNorm, EvaluationNormalisesByTheRunningStatisticsAndLeavesThem) {
  Tensor x = randn({4, 3, 5}, 34, 0, f64());
  Tensor w = randn({3}, 35, 0, f64()), b = randn({3}, 36, 0, f64());
  const std::vector<double> m = {0.5, -1.0, 2.0}, v = {1.0, 3.0, 0.25};
  Tensor rm = Tensor::from_vector(m, {3}, f64()), rv = Tensor::from_vector(v, {3}, f64());
  const std::vector<double> y =
      batch_norm(x, w, b, rm, rv, /*training=*/false, 0.1, 1e-3).to_vector();
  const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 5) % 3;
    EXPECT_NEAR(y[i], (xv[i] - m[c]) / std::sqrt(v[c] + 1e-3) * wv[c] + bv[c], 1e-12) << i;
  }
  EXPECT_EQ(rm.to_vector(), m);
  EXPECT_EQ(rv.to_vector(), v);
}

TEST(NnBatchNorm, GradientsWithRunningStatisticsMatchFiniteDifferences) {
  Tensor x = randn({4, 3, 2, 3}, 37, 0, f64(true));
  Tensor w = randn({3}, 38, 0, f64(true)), b = randn({3}, 39, 0, f64(true));
  Tensor rm = randn({3}, 40, 0, f64()), rv = exp(randn({3}, 41, 0, f64()));
  for (const bool training : {true, false})
    expect_gradcheck(
        [&](const std::vector<Tensor>& in) {
          return batch_norm(in[0], in[1], in[2], rm, rv, training, 0.1, 1e-5);
        },
        {x, w, b}, training ? "training" : "evaluation");
}

TEST(NnBatchNorm, RunningStatisticsMistakesAreNamed) {
  Tensor x = randn({2, 3, 4}, 1);
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
  EXPECT_HAS(
      error_of([&] { batch_norm(x, Tensor(), Tensor(), Tensor::zeros({4}), rv, true, 0.1, 1e-5); }),
      "running_mean and running_var must be [3]");
  EXPECT_HAS(error_of([&] { batch_norm(x, Tensor(), Tensor(), rm, rv, true, 1.5, 1e-5); }),
             "momentum must be in [0, 1]");
  EXPECT_HAS(error_of([&] {
               batch_norm(randn({1, 3}, 2), Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
             }),
             "more than one value per channel");
  // Evaluation of a single example is fine.
  EXPECT_EQ(batch_norm(randn({1, 3}, 2), Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5).shape(),
            (Shape{1, 3}));
}

TEST(NnTrainEvalSelect, IsACopyOfItsTrainingInputWithItsGradient) {
  Tensor a = randn({2, 3}, 42, 0, f64(true)), e = randn({2, 3}, 43, 0, f64(true));
  Tensor y = train_eval_select(a, e);
  EXPECT_EQ(y.to_vector(), a.to_vector());
  sum(y * y).backward();
  expect_close(a.grad(), (a * 2.0).to_vector(), 1e-12, 1e-12, "gradient of the training input");
  expect_close(e.grad(), std::vector<double>(6, 0.0), 0, 0, "gradient of the evaluation input");
  EXPECT_HAS(error_of([] {
               train_eval_select(randn({2, 3}, 1), randn({3, 2}, 2));
             }),
             "one shape and dtype");
}

// ---------------- layer_norm / rms_norm ----------------

TEST(NnLayerNorm, MatchesReferenceWithAndWithoutParameters) {
  Tensor x = randn({2, 5, 37}, 6, 0, f32()) * 3.0 + 1.5;
  Tensor w = randn({37}, 7, 0, f32()), b = randn({37}, 8, 0, f32());
  expect_close(layer_norm(x, w, b, 1e-5),
               norm_ref(x.to_vector(), 37, w.to_vector(), b.to_vector(), 1e-5, false), 1e-5, 1e-5,
               "layer_norm with weight and bias");
  expect_close(layer_norm(x, Tensor(), Tensor(), 1e-3),
               norm_ref(x.to_vector(), 37, {}, {}, 1e-3, false), 1e-5, 1e-5,
               "layer_norm without parameters");
  expect_close(layer_norm(x, w, Tensor(), 1e-5),
               norm_ref(x.to_vector(), 37, w.to_vector(), {}, 1e-5, false), 1e-5, 1e-5,
               "layer_norm without bias");
}

TEST(NnLayerNorm, GradientsMatchFiniteDifferences) {
  Tensor x = randn({3, 4, 7}, 9, 0, f64(true));
  Tensor w = randn({7}, 10, 0, f64(true)), b = randn({7}, 11, 0, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
      {x, w, b}, "layer_norm x, weight, bias");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5); },
      {x}, "layer_norm x only");
}

TEST(NnLayerNorm, ManyRowsGiveParameterGradientsSummedOverAllRows) {
  // More rows than parameter-gradient blocks, with an uneven split: dbias must be the plain sum.
  Tensor x = randn({203, 5}, 12, 0, f64());
  Tensor w = randn({5}, 13, 0, f64(true)), b = randn({5}, 14, 0, f64(true));
  Tensor g = randn({203, 5}, 15, 0, f64());
  layer_norm(x, w, b).backward(g);
  std::vector<double> gv = g.to_vector(), db(5, 0.0);
  for (int64_t r = 0; r < 203; ++r)
    for (int64_t j = 0; j < 5; ++j) db[j] += gv[r * 5 + j];
  expect_close(b.grad(), db, 1e-12, 1e-12, "dbias");
}

TEST(NnLayerNorm, MismatchedWeightNamesTheOpAndBothShapes) {
  Tensor x = randn({2, 8}, 16), w = randn({7}, 17);
  expect_mentions(error_of([&] { layer_norm(x, w, Tensor()); }), {"layer_norm", "[7]", "[2, 8]"});
}

TEST(NnRmsNorm, MatchesReference) {
  Tensor x = randn({4, 3, 37}, 18, 0, f32()) * 2.0;
  Tensor w = randn({37}, 19, 0, f32());
  expect_close(rms_norm(x, w, 1e-6), norm_ref(x.to_vector(), 37, w.to_vector(), {}, 1e-6, true),
               1e-5, 1e-5, "rms_norm");
}

TEST(NnRmsNorm, GradientsMatchFiniteDifferences) {
  Tensor x = randn({5, 6}, 20, 0, f64(true)), w = randn({6}, 21, 0, f64(true));
  expect_gradcheck([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1], 1e-6); },
                   {x, w}, "rms_norm");
}

TEST(NnRmsNorm, MismatchedWeightNamesTheOpAndBothShapes) {
  Tensor x = randn({3, 4}, 22), w = randn({3, 4}, 23);
  expect_mentions(error_of([&] { rms_norm(x, w); }), {"rms_norm", "[3, 4]", "expected [4]"});
}

TEST(NnLayerNorm, ShardsRowsWithReplicatedParameters) {
  ops::Metas in{{{4, 6, 8}, DType::F32}, {{8}, DType::F32}, {{8}, DType::F32}};
  auto sigs = ops::op_def(OpKind::LayerNorm).shard(in, {in[0]}, ops::NormAttrs{});
  ASSERT_EQ(sigs.size(), 2u);
  EXPECT_EQ(sigs[1].inputs[0], ops::Prop::sharded(1));
  EXPECT_EQ(sigs[1].inputs[1], ops::Prop::replicated());
  EXPECT_EQ(sigs[1].outputs[0], ops::Prop::sharded(1));
}

// ---------------- embedding ----------------

TEST(NnEmbedding, LooksUpRowsOfTheWeight) {
  Tensor w = randn({37, 3}, 24, 0, f32());
  std::vector<int64_t> ids = {5, 0, 36, 5, 12, 7};
  Tensor out = embedding(w, ids_tensor(ids, {2, 3}));
  ASSERT_EQ(out.shape(), (Shape{2, 3, 3}));
  std::vector<double> wv = w.to_vector(), expect;
  for (int64_t id : ids)
    for (int64_t c = 0; c < 3; ++c) expect.push_back(wv[id * 3 + c]);
  expect_close(out, expect, 0, 0, "embedding");
}

TEST(NnEmbedding, GradientAddsRepeatedIdsAndMatchesFiniteDifferences) {
  Tensor w = randn({7, 4}, 25, 0, f64(true));
  Tensor ids = ids_tensor({3, 1, 3, 6, 3, 0}, {3, 2});
  expect_gradcheck([ids](const std::vector<Tensor>& in) { return embedding(in[0], ids); }, {w},
                   "embedding weight");
  Tensor g = randn({3, 2, 4}, 26, 0, f64());
  embedding(w, ids).backward(g);
  std::vector<double> gv = g.to_vector(), expect(28, 0.0);
  std::vector<int64_t> iv = {3, 1, 3, 6, 3, 0};
  for (size_t i = 0; i < iv.size(); ++i)
    for (int64_t c = 0; c < 4; ++c) expect[iv[i] * 4 + c] += gv[i * 4 + c];
  expect_close(w.grad(), expect, 1e-15, 1e-15, "embedding scatter-add");
}

TEST(NnEmbedding, OutOfRangeIdNamesTheIdItsPositionAndTheVocabulary) {
  Tensor w = randn({10, 2}, 27);
  std::string msg = error_of([&] { embedding(w, ids_tensor({1, 10, 2}, {3})); });
  expect_mentions(msg, {"embedding", "id 10", "position 1", "10 rows"});
  expect_mentions(error_of([&] { embedding(w, ids_tensor({-1}, {1})); }), {"id -1", "position 0"});
}

TEST(NnEmbedding, NonIntegerIdsAreRejected) {
  Tensor w = randn({10, 2}, 28);
  expect_mentions(error_of([&] { embedding(w, randn({3}, 29)); }), {"embedding", "i64", "f32"});
}

TEST(NnEmbedding, VocabularyShardsSumToTheFullLookupAndGradient) {
  Tensor w = randn({9, 5}, 30, 0, f64());
  Tensor ids = ids_tensor({8, 0, 4, 5, 3, 4, 2}, {7});
  Tensor full = embedding(w, ids);
  std::vector<double> sum(full.numel(), 0.0), wgrad_sum;
  Tensor g = randn({7, 5}, 31, 0, f64());
  for (auto [start, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 9}}) {
    Tensor shard = slice(w, 0, start, end).clone().set_requires_grad(true);
    Tensor part = ops::call1(OpKind::Embedding, {shard, ids}, ops::SliceAttrs{0, start, end});
    std::vector<double> pv = part.to_vector();
    for (size_t i = 0; i < pv.size(); ++i) sum[i] += pv[i];
    part.backward(g);
    std::vector<double> gv = shard.grad().to_vector();
    wgrad_sum.insert(wgrad_sum.end(), gv.begin(), gv.end());
  }
  expect_close(full, sum, 0, 0, "sum of vocabulary shards");
  Tensor wf = w.clone().set_requires_grad(true);
  embedding(wf, ids).backward(g);
  expect_close(wf.grad(), wgrad_sum, 0, 0, "concatenated shard gradients");
}

TEST(NnEmbedding, DeclaresVocabularyAndFeatureParallelSignatures) {
  ops::Metas in{{{50, 8}, DType::F32}, {{4, 6}, DType::I64}};
  auto sigs = ops::op_def(OpKind::Embedding).shard(in, {{{4, 6, 8}, DType::F32}}, ops::NoAttrs{});
  bool vocab = false, feature = false, ids = false;
  for (const auto& s : sigs) {
    if (s.inputs[0] == ops::Prop::sharded(0) && s.outputs[0] == ops::Prop::partial()) vocab = true;
    if (s.inputs[0] == ops::Prop::sharded(1) && s.outputs[0] == ops::Prop::sharded(2))
      feature = true;
    if (s.inputs[1] == ops::Prop::sharded(1) && s.outputs[0] == ops::Prop::sharded(1)) ids = true;
  }
  EXPECT_TRUE(vocab && feature && ids);
}

// ---------------- cross_entropy ----------------

TEST(NnCrossEntropy, MatchesReferenceAndSkipsIgnoredTargets) {
  Tensor x = randn({9, 37}, 32, 0, f32()) * 3.0;
  std::vector<int64_t> t = {3, -100, 36, 0, 5, -100, 17, 17, 2};
  expect_close(cross_entropy(x, ids_tensor(t, {9})), cross_entropy_ref(x.to_vector(), 37, t, -100),
               1e-6, 1e-6, "cross_entropy");
  std::vector<int64_t> t2 = {3, 7, 36, 0, 7, 1, 17, 7, 2};
  expect_close(cross_entropy(x, ids_tensor(t2, {9}), 7),
               cross_entropy_ref(x.to_vector(), 37, t2, 7), 1e-6, 1e-6,
               "cross_entropy with ignore_index 7");
}

TEST(NnCrossEntropy, LargeVocabularyMatchesReference) {
  Tensor x = randn({3, 50257}, 33, 0, f32()) * 2.0;
  std::vector<int64_t> t = {50256, 0, 12345};
  Tensor tt = ids_tensor(t, {3});
  expect_close(cross_entropy(x, tt), cross_entropy_ref(x.to_vector(), 50257, t, -100), 1e-5, 1e-6,
               "cross_entropy over 50257 classes");
  Tensor xg = x.clone().set_requires_grad(true);
  cross_entropy(xg, tt).backward();
  std::vector<double> xv = x.to_vector(), gv = xg.grad().to_vector();
  for (int64_t i = 0; i < 3; ++i) {  // softmax - onehot, over 3 rows
    double mx = -INFINITY, sum = 0, row_sum = 0;
    for (int64_t j = 0; j < 50257; ++j) mx = std::max(mx, xv[i * 50257 + j]);
    for (int64_t j = 0; j < 50257; ++j) sum += std::exp(xv[i * 50257 + j] - mx);
    for (int64_t j = 0; j < 50257; j += 997) {
      double expect = (std::exp(xv[i * 50257 + j] - mx) / sum - (j == t[i] ? 1.0 : 0.0)) / 3.0;
      EXPECT_NEAR(gv[i * 50257 + j], expect, 1e-7) << "row " << i << " class " << j;
    }
    for (int64_t j = 0; j < 50257; ++j) row_sum += gv[i * 50257 + j];
    EXPECT_NEAR(row_sum, 0.0, 1e-6) << "gradient row " << i << " must sum to zero";
    EXPECT_NEAR(gv[i * 50257 + t[i]], (std::exp(xv[i * 50257 + t[i]] - mx) / sum - 1.0) / 3.0,
                1e-7);
  }
}

TEST(NnCrossEntropy, GradientsMatchFiniteDifferences) {
  Tensor x = randn({6, 5}, 34, 0, f64(true));
  Tensor t = ids_tensor({4, -100, 0, 2, 2, -100}, {6});
  expect_gradcheck([t](const std::vector<Tensor>& in) { return cross_entropy(in[0], t); }, {x},
                   "cross_entropy logits");
}

TEST(NnCrossEntropy, AllTargetsIgnoredGiveZeroLossAndZeroGradient) {
  Tensor x = randn({3, 4}, 35, 0, f64(true));
  Tensor loss = cross_entropy(x, ids_tensor({-100, -100, -100}, {3}));
  EXPECT_EQ(loss.item(), 0.0);
  loss.backward();
  expect_close(x.grad(), std::vector<double>(12, 0.0), 0, 0, "gradient");
}

TEST(NnCrossEntropy, OutOfRangeTargetNamesTheValueItsPositionAndV) {
  Tensor x = randn({4, 37}, 36);
  std::string msg = error_of([&] { cross_entropy(x, ids_tensor({1, 2, 37, 0}, {4})); });
  expect_mentions(msg, {"cross_entropy", "target 37", "position 2", "37 classes"});
  msg = error_of([&] { cross_entropy(x, ids_tensor({1, -5, 3, 0}, {4})); });
  expect_mentions(msg, {"target -5", "position 1"});
}

TEST(NnCrossEntropy, MismatchedTargetsNameTheOpAndBothShapes) {
  Tensor x = randn({4, 37}, 37);
  std::string msg = error_of([&] { cross_entropy(x, ids_tensor({1, 2, 3}, {3})); });
  expect_mentions(msg, {"cross_entropy", "[3]", "[4, 37]"});
}

// ---------------- attention ----------------

TEST(NnAttention, MatchesReferenceCausalAndFull) {
  Tensor q = randn({2, 3, 5, 3}, 40, 0, f32()), k = randn({2, 3, 5, 3}, 41, 0, f32());
  Tensor v = randn({2, 3, 5, 4}, 42, 0, f32());  // Dv may differ from D
  for (bool causal : {true, false})
    for (double scale : {0.0, 0.7}) {
      auto outs = attention_call(q, k, v, causal, scale);
      AttentionRef r = attention_ref(q, k, v, causal, scale);
      std::string what =
          std::string(causal ? "causal" : "full") + " scale " + std::to_string(scale);
      expect_close(outs[0], r.out, 1e-5, 1e-6, what + " out");
      expect_close(outs[1], r.lse, 1e-5, 1e-6, what + " lse");
    }
}

TEST(NnAttention, ManyRowBlocksMatchReference) {
  // T above the kernel's row block, so causal blocks skip columns.
  Tensor q = randn({1, 2, 150, 8}, 43, 0, f64()), k = randn({1, 2, 150, 8}, 44, 0, f64());
  Tensor v = randn({1, 2, 150, 8}, 45, 0, f64());
  for (bool causal : {true, false}) {
    auto outs = attention_call(q, k, v, causal);
    AttentionRef r = attention_ref(q, k, v, causal, 0);
    expect_close(outs[0], r.out, 1e-12, 1e-12, causal ? "causal" : "full");
  }
}

TEST(NnAttention, PermutedHeadsGiveTheSameResultAsContiguous) {
  // q, k, v as heads of [B, T, H, D] activations: rows of each head are strided.
  Tensor x = randn({2, 6, 3, 4}, 46, 0, f32());
  Tensor q = permute(x, {0, 2, 1, 3});
  Tensor k = permute(x * 0.5, {0, 2, 1, 3});
  Tensor v = permute(x + 1.0, {0, 2, 1, 3});
  auto a = attention_call(q, k, v, true);
  auto b = attention_call(contiguous(q), contiguous(k), contiguous(v), true);
  expect_close(a[0], b[0].to_vector(), 0, 0, "out");
}

TEST(NnAttention, GradientsMatchFiniteDifferencesCausalAndFull) {
  Tensor q = randn({2, 2, 5, 3}, 47, 0, f64(true)), k = randn({2, 2, 5, 3}, 48, 0, f64(true));
  Tensor v = randn({2, 2, 5, 3}, 49, 0, f64(true));
  for (bool causal : {true, false})
    expect_gradcheck(
        [causal](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], causal);
        },
        {q, k, v}, causal ? "causal" : "full");
}

TEST(NnAttention, GradientsMatchFiniteDifferencesAcrossRowBlocks) {
  Tensor q = randn({1, 1, 67, 2}, 50, 0, f64(true)), k = randn({1, 1, 67, 2}, 51, 0, f64(true));
  Tensor v = randn({1, 1, 67, 3}, 52, 0, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], true);
      },
      {q, k, v}, "causal, T = 67");
}

TEST(NnAttention, LogSumExpOutputIsDifferentiable) {
  Tensor q = randn({1, 2, 4, 3}, 53, 0, f64(true)), k = randn({1, 2, 4, 3}, 54, 0, f64(true));
  Tensor v = randn({1, 2, 4, 3}, 55, 0, f64(true));
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return attention_call(in[0], in[1], in[2], true)[1]; },
      {q, k, v}, "lse alone");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        auto o = attention_call(in[0], in[1], in[2], false);
        return o[0] * unsqueeze(o[1], -1);
      },
      {q, k, v}, "out and lse together");
}

TEST(NnAttention, DropoutIsAPureFunctionOfSeedStreamAndIndex) {
  Tensor q = randn({2, 2, 6, 4}, 56, 0, f64()), k = randn({2, 2, 6, 4}, 57, 0, f64());
  Tensor v = randn({2, 2, 6, 4}, 58, 0, f64());
  auto a = attention_call(q, k, v, true, 0, 0.4, 11, 3);
  auto b = attention_call(q, k, v, true, 0, 0.4, 11, 3);
  expect_close(a[0], b[0].to_vector(), 0, 0, "same seed and stream");
  AttentionRef r = attention_ref(q, k, v, true, 0, 0.4, 11, 3);
  expect_close(a[0], r.out, 1e-12, 1e-12, "mask drawn at the logical index of [B, H, T, T]");
  auto c = attention_call(q, k, v, true, 0, 0.4, 11, 4);
  EXPECT_NE(a[0].to_vector(), c[0].to_vector()) << "another stream must draw another mask";
}

TEST(NnAttention, DropoutGradientsMatchFiniteDifferences) {
  Tensor q = randn({1, 2, 6, 3}, 59, 0, f64(true)), k = randn({1, 2, 6, 3}, 60, 0, f64(true));
  Tensor v = randn({1, 2, 6, 2}, 61, 0, f64(true));
  for (bool causal : {true, false})
    expect_gradcheck(
        [causal](const std::vector<Tensor>& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], causal, 0.3, 5, 9);
        },
        {q, k, v}, causal ? "causal with dropout" : "full with dropout");
}

TEST(NnAttention, HeadShardWithDropoutSliceEqualsSliceOfSingleDevice) {
  Tensor q = randn({2, 4, 5, 3}, 62, 0, f64()), k = randn({2, 4, 5, 3}, 63, 0, f64());
  Tensor v = randn({2, 4, 5, 3}, 64, 0, f64());
  Tensor full = attention_call(q, k, v, true, 0, 0.5, 21, 2)[0];
  Tensor expect = contiguous(slice(full, 1, 1, 3));
  LogicalSlice sl{{2, 4, 5, 5}, {0, 1, 0, 0}};
  Tensor shard = attention_call(contiguous(slice(q, 1, 1, 3)), contiguous(slice(k, 1, 1, 3)),
                                contiguous(slice(v, 1, 1, 3)), true, 0, 0.5, 21, 2, sl)[0];
  expect_close(shard, expect.to_vector(), 1e-14, 1e-14, "heads [1, 3)");
}

Tensor key_mask(const std::vector<double>& keep, const Shape& s) {
  return Tensor::from_vector(keep, s, TensorOptions{}.with_dtype(DType::U8));
}

TEST(NnAttention, KeyMaskEqualsAttentionOverTheKeptKeysOnly) {
  // Batch 0 keeps keys {0, 1, 3}; batch 1 keeps all: the masked result for batch 0 equals plain
  // attention over the kept keys (and values) alone.
  Tensor q = randn({2, 2, 4, 3}, 70, 0, f64()), k = randn({2, 2, 4, 3}, 71, 0, f64());
  Tensor v = randn({2, 2, 4, 2}, 72, 0, f64());
  Tensor mask = key_mask({1, 1, 0, 1, 1, 1, 1, 1}, {2, 4});
  Tensor got = scaled_dot_product_attention(q, k, v, false, 0, 0, 0, 0, mask);
  auto keep = [](const Tensor& t) {  // batch 0, keys {0, 1, 3}
    Tensor b0 = slice(t, 0, 0, 1);
    return concat({slice(b0, 2, 0, 2), slice(b0, 2, 3, 4)}, 2);
  };
  // Queries stay all four; only keys and values are kept (written out: the op takes q and k of
  // one length).
  Tensor s = matmul(slice(q, 0, 0, 1), transpose(keep(k), 2, 3)) * (1.0 / std::sqrt(3.0));
  Tensor want = matmul(softmax(s, -1), keep(v));
  expect_close(slice(got, 0, 0, 1), want.to_vector(), 1e-12, 1e-12, "batch 0, keys {0, 1, 3}");
  Tensor plain = scaled_dot_product_attention(q, k, v, false);
  expect_close(slice(got, 0, 1, 2), slice(plain, 0, 1, 2).to_vector(), 0, 0, "batch 1 unmasked");
}

TEST(NnAttention, AQueryWithNoKeyGetsZerosAndNoGradient) {
  // Batch 1 pads every key; with the causal mask, batch 0's query 0 loses its only key too.
  Tensor q = randn({2, 1, 3, 2}, 73, 0, f64(true)), k = randn({2, 1, 3, 2}, 74, 0, f64(true));
  Tensor v = randn({2, 1, 3, 2}, 75, 0, f64(true));
  Tensor mask = key_mask({0, 1, 1, 0, 0, 0}, {2, 3});
  Tensor y = scaled_dot_product_attention(q, k, v, true, 0, 0, 0, 0, mask);
  const std::vector<double> out = y.to_vector();
  for (size_t i : {0, 1, 6, 7, 8, 9, 10, 11}) EXPECT_EQ(out[i], 0.0) << "element " << i;
  for (double o : out) EXPECT_TRUE(std::isfinite(o));
  sum(y * y + y).backward();
  for (const Tensor* t : {&q, &k, &v})
    for (double g : t->grad().to_vector()) EXPECT_TRUE(std::isfinite(g));
  const std::vector<double> gq = q.grad().to_vector();
  for (size_t i = 6; i < 12; ++i) EXPECT_EQ(gq[i], 0.0) << "batch 1 has no key: no gradient";
}

TEST(NnAttention, KeyMaskGradientsMatchFiniteDifferences) {
  Tensor q = randn({2, 2, 5, 3}, 76, 0, f64(true)), k = randn({2, 2, 5, 3}, 77, 0, f64(true));
  Tensor v = randn({2, 2, 5, 3}, 78, 0, f64(true));
  Tensor mask = key_mask({1, 0, 1, 1, 0, 0, 1, 1, 1, 1}, {2, 5});
  for (bool causal : {true, false})
    for (double p : {0.0, 0.3})
      expect_gradcheck(
          [=](const std::vector<Tensor>& in) {
            return scaled_dot_product_attention(in[0], in[1], in[2], causal, p, 5, 9, 0, mask);
          },
          {q, k, v}, std::string(causal ? "causal" : "full") + (p > 0 ? " with dropout" : ""));
}

TEST(NnAttention, KeyMaskMustBeU8OfBatchByKeys) {
  Tensor q = randn({2, 3, 5, 4}, 79);
  expect_mentions(error_of([&] {
                    scaled_dot_product_attention(q, q, q, true, 0, 0, 0, 0,
                                                 key_mask(std::vector<double>(10, 1), {5, 2}));
                  }),
                  {"attention", "key mask", "[5, 2]", "[2, 5]"});
  expect_mentions(error_of([&] {
                    scaled_dot_product_attention(q, q, q, true, 0, 0, 0, 0, randn({2, 5}, 80));
                  }),
                  {"attention", "key mask", "u8"});
}

TEST(NnAttention, MismatchedShapesNameTheOpAndBothShapes) {
  Tensor q = randn({2, 3, 5, 4}, 65), k = randn({2, 3, 6, 4}, 66), v = randn({2, 3, 5, 4}, 67);
  expect_mentions(error_of([&] { scaled_dot_product_attention(q, k, v); }),
                  {"attention", "[2, 3, 5, 4]", "[2, 3, 6, 4]"});
  Tensor v2 = randn({2, 3, 4, 4}, 68);
  expect_mentions(error_of([&] { scaled_dot_product_attention(q, q, v2); }),
                  {"attention", "[2, 3, 4, 4]", "[2, 3, 5, 4]"});
  Tensor q3 = randn({3, 5, 4}, 69);
  expect_mentions(error_of([&] { scaled_dot_product_attention(q3, q3, q3); }),
                  {"attention", "[B, H, T, D]", "[3, 5, 4]"});
}

TEST(NnAttention, ShardsBatchOrHeads) {
  ops::Metas in(3, {{2, 4, 8, 16}, DType::F32});
  in.push_back({{2, 8}, DType::U8});  // the key mask: split with the batch, whole across heads
  ops::Metas out{{{2, 4, 8, 16}, DType::F32}, {{2, 4, 8}, DType::F32}};
  auto sigs = ops::op_def(OpKind::Attention).shard(in, out, ops::AttentionAttrs{});
  ASSERT_EQ(sigs.size(), 2u);
  for (int64_t d = 0; d < 2; ++d) {
    std::vector<ops::Prop> want(3, ops::Prop::sharded(d));
    want.push_back(d == 0 ? ops::Prop::sharded(0) : ops::Prop::replicated());
    EXPECT_EQ(sigs[d].inputs, want);
    EXPECT_EQ(sigs[d].outputs, std::vector<ops::Prop>(2, ops::Prop::sharded(d)));
  }
}

}  // namespace
}  // namespace hap
