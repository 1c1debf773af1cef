// The pieces of a vocabulary-parallel cross-entropy (logsumexp, target_logit, count_targets)
// against plain loops and finite differences, their composition over column shards against
// cross_entropy, and the optimizer-update and sum-of-squares ops against the formulas.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "models/optim.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/threads.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using ops::OpKind;

TensorOptions f64(bool requires_grad = false) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(requires_grad);
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message << " (max abs error " << r.max_abs_error << ")";
}

TEST(LogSumExp, MatchesAPlainLoopAndIsStable) {
  Tensor x = randn({4, 7}, 1, 0, f64()) * 30.0;  // large logits: exp overflows without the max
  std::vector<double> v = x.to_vector(), got = logsumexp(x).to_vector();
  ASSERT_EQ(got.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < 7; ++j) mx = std::max(mx, v[i * 7 + j]);
    for (int j = 0; j < 7; ++j) sum += std::exp(v[i * 7 + j] - mx);
    EXPECT_NEAR(got[i], mx + std::log(sum), 1e-12) << "row " << i;
  }
}

TEST(LogSumExp, AnEmptyRowIsMinusInfinityAndMinusInfinityEntriesCountZero) {
  EXPECT_EQ(logsumexp(Tensor::zeros({3, 0}, f64())).to_vector(),
            std::vector<double>(3, -std::numeric_limits<double>::infinity()));
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::from_vector(std::vector<double>{-inf, 0.0, -inf, -inf}, {2, 2}, f64());
  std::vector<double> got = logsumexp(x).to_vector();
  EXPECT_NEAR(got[0], 0.0, 1e-15);
  EXPECT_EQ(got[1], -inf);
}

TEST(LogSumExp, GradientsMatchFiniteDifferences) {
  Tensor x = randn({3, 5}, 2, 0, f64(true));
  expect_gradcheck([](const std::vector<Tensor>& in) { return logsumexp(in[0]); }, {x},
                   "logsumexp");
  Tensor y = randn({2, 3, 4}, 3, 0, f64(true));
  expect_gradcheck([](const std::vector<Tensor>& in) { return logsumexp(in[0]); }, {y},
                   "logsumexp 3-D");
}

TEST(TargetLogit, PicksHeldTargetsAndZerosTheRest) {
  // Columns [10, 14) of a vocabulary; targets held, elsewhere, or ignored.
  Tensor x = Tensor::arange(12, f64()).as_strided({3, 4}, {4, 1}, 0);
  Tensor t = Tensor::from_vector(std::vector<int64_t>{11, 3, -100}, {3});
  EXPECT_EQ(target_logit(x, t, 10).to_vector(), (std::vector<double>{1.0, 0.0, 0.0}));
  Tensor t2 = Tensor::from_vector(std::vector<int64_t>{13, 10, 12}, {3});
  EXPECT_EQ(target_logit(x, t2, 10).to_vector(), (std::vector<double>{3.0, 4.0, 10.0}));
  EXPECT_EQ(target_logit(x, t2, 10, /*ignore_index=*/12).to_vector(),
            (std::vector<double>{3.0, 4.0, 0.0}));
}

TEST(TargetLogit, GradientsMatchFiniteDifferences) {
  Tensor x = randn({5, 4}, 4, 0, f64(true));
  Tensor t = Tensor::from_vector(std::vector<int64_t>{7, 2, 5, -100, 8}, {5});
  expect_gradcheck([t](const std::vector<Tensor>& in) { return target_logit(in[0], t, 5); }, {x},
                   "target_logit");
}

TEST(CountTargets, CountsTheTargetsThatAreNotIgnored) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{1, -100, 4, 4, -100, 0}, {2, 3});
  EXPECT_EQ(count_targets(t).item(), 4.0);
  EXPECT_EQ(count_targets(t, 4).item(), 4.0);
  EXPECT_EQ(count_targets(Tensor::from_vector(std::vector<int64_t>{-100}, {1})).item(), 0.0);
}

// The composition the vocabulary-parallel loss runs on each rank, done here for every rank's
// column shard in one process: the sum of the shards' partial losses is cross_entropy, and so is
// the gradient of every logit.
TEST(VocabularyShards, PartialLossesSumToCrossEntropyWithTheSameGradients) {
  const int64_t N = 6, V = 11;
  Tensor x = randn({N, V}, 5, 0, f64());
  Tensor t = Tensor::from_vector(std::vector<int64_t>{3, -100, 10, 0, 7, 7}, {N});
  Tensor whole = x.clone().set_requires_grad(true);
  Tensor expected = cross_entropy(whole, t);
  expected.backward();
  for (const std::vector<int64_t>& lengths :
       std::vector<std::vector<int64_t>>{{4, 7}, {0, 5, 6}, {11}, {3, 3, 3, 2}}) {
    std::vector<Tensor> shards;
    std::vector<Tensor> lse_r;
    int64_t offset = 0;
    for (int64_t len : lengths) {
      shards.push_back(
          slice(x, 1, offset, offset + len).contiguous().clone().set_requires_grad(true));
      lse_r.push_back(reshape(logsumexp(shards.back()), {N, 1}));
      offset += len;
    }
    Tensor lse = logsumexp(concat(lse_r, 1));  // what the all-gather gives every rank
    const double count = count_targets(t).item();
    Tensor total;
    offset = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
      Tensor rows = expand(reshape(lse, {N, 1}), {N, lengths[r]}) - shards[r];
      Tensor part = sum(target_logit(rows, t, offset)) * (1.0 / count);
      total = total.defined() ? total + part : part;
      offset += lengths[r];
    }
    EXPECT_NEAR(total.item(), expected.item(), 1e-12);
    total.backward();
    std::vector<Tensor> grads;
    for (const Tensor& s : shards) grads.push_back(s.grad());
    std::vector<double> got = concat(grads, 1).to_vector(), want = whole.grad().to_vector();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
  }
}

TEST(SumOfSquares, AddsEveryTensorInOrderInDouble) {
  Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3});
  Tensor b = Tensor::from_vector(std::vector<double>{0.5, -4}, {2, 1}, f64());
  EXPECT_EQ(sum_of_squares(std::vector<Tensor>{a, b}), 14.0 + 16.25);
  EXPECT_EQ(sum_of_squares(std::vector<Tensor>{}), 0.0);
  EXPECT_EQ(ops::call1(OpKind::SumOfSquares, {a}).dtype(), DType::F64);
}

// The sum runs in an order fixed by the size alone (blocks of 4096 in 16 lanes): the same bits on
// one thread and on two, across block and lane boundaries, and within a few ulp of the exact sum
// (a long double reference; every term is positive, so the relative error is bounded by the
// number of additions times the rounding unit).
TEST(SumOfSquares, TheSameBitsOnAnyThreadCountAndCloseToTheExactSum) {
  const int threads = num_threads();
  for (DType d : {DType::F32, DType::F64})
    for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{4095},
                      int64_t{4096}, int64_t{4097}, int64_t{3 * 4096 + 5}, int64_t{100003}}) {
      const Tensor x = randn({n}, 70 + static_cast<uint64_t>(n), 0, f64()).to(d);
      long double exact = 0;
      for (double v : x.to_vector()) exact += static_cast<long double>(v) * v;
      set_num_threads(1);
      const double one = sum_of_squares(x);
      set_num_threads(2);
      const double two = sum_of_squares(x);
      set_num_threads(threads);
      EXPECT_EQ(one, two) << dtype_name(d) << " n " << n;
      EXPECT_NEAR(one, static_cast<double>(exact), 1e-13 * static_cast<double>(exact))
          << dtype_name(d) << " n " << n;
    }
  // Strided views are summed in logical order as the contiguous copy.
  const Tensor m = randn({300, 41}, 5, 0, f64());
  const Tensor t = m.as_strided({41, 300}, {1, 41}, 0);
  EXPECT_EQ(sum_of_squares(t), sum_of_squares(t.contiguous()));
}

// The optimizers' grad_scale (clipping folded into the update) gives the bits of scaling the
// gradients first (mul_scalar, as clip_grad_norm_ does) and then updating, and leaves the
// gradients as they were. SGD with weight decay adds the scaled gradient to wd * p, and the
// compiler may fuse either product into one multiply-add (-ffp-contract): there, one rounding
// of the scaled gradient may differ.
TEST(OptimizerOps, GradScaleEqualsScalingTheGradientsFirstBitForBit) {
  for (DType d : {DType::F32, DType::F64})
    for (OpKind kind : {OpKind::AdamWUpdate, OpKind::SgdUpdate}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (kind == OpKind::SgdUpdate ? " sgd" : " adamw"));
      const size_t group = kind == OpKind::AdamWUpdate ? 4 : 3;
      std::vector<Tensor> folded, scaled;
      std::vector<Tensor> grads;
      uint64_t seed = 90;
      for (const Shape& s : {Shape{37, 5}, Shape{9001}}) {
        for (size_t j = 0; j < group; ++j) {
          Tensor x = randn(s, seed++, 0, f64()).to(d);
          if (j == 3) x = ops::call1(OpKind::Mul, {x, x});  // AdamW's second moment is >= 0
          folded.push_back(x.clone());
          scaled.push_back(x.clone());
          if (j == 1) grads.push_back(x.clone());
        }
      }
      const double coef = 0.3712345678901;
      for (size_t k = 0; k < grads.size(); ++k)
        scaled[group * k + 1] =
            ops::call1(OpKind::MulScalar, {scaled[group * k + 1]}, ops::ScalarAttrs{coef});
      ops::OptimizerAttrs a;
      a.lr = {1e-2, 3e-3};
      a.weight_decay = {0.1, 0.0};
      a.step = {2, 7};
      a.momentum = kind == OpKind::SgdUpdate ? 0.9 : 0.0;
      a.nesterov = kind == OpKind::SgdUpdate;
      ops::call(kind, scaled, a);
      a.grad_scale = coef;
      ops::call(kind, folded, a);
      for (size_t i = 0; i < folded.size(); ++i) {
        if (i % group == 1) continue;  // the gradients: the folded ones are unchanged
        const std::vector<double> f = folded[i].to_vector(), s = scaled[i].to_vector();
        ASSERT_EQ(f.size(), s.size());
        size_t differ = 0;
        for (size_t e = 0; e < f.size(); ++e) {
          differ += f[e] != s[e];
          const double ulp = d == DType::F32 ? 0x1p-23 : 0x1p-52;
          EXPECT_NEAR(f[e], s[e], 4 * ulp * std::max(1.0, std::abs(s[e])))
              << "input " << i << " element " << e;
        }
        if (kind == OpKind::AdamWUpdate) {
          EXPECT_EQ(differ, 0u) << "input " << i;
        }
      }
      for (size_t k = 0; k < grads.size(); ++k)
        EXPECT_EQ(folded[group * k + 1].to_vector(), grads[k].to_vector()) << "gradient " << k;
    }
}

// One AdamW step through the fused op, against the formula written out.
TEST(OptimizerOps, AdamWUpdateIsTheFormulaOnEveryTensorAtOnce) {
  Tensor p1 = randn({5}, 6, 0, f64()), p2 = randn({2, 3}, 7, 0, f64());
  Tensor g1 = randn({5}, 8, 0, f64()), g2 = randn({2, 3}, 9, 0, f64());
  Tensor m1 = randn({5}, 10, 0, f64()), m2 = randn({2, 3}, 11, 0, f64());
  Tensor v1 = randn({5}, 12, 0, f64()) * randn({5}, 12, 0, f64());
  Tensor v2 = randn({2, 3}, 13, 0, f64()) * randn({2, 3}, 13, 0, f64());
  std::vector<std::vector<double>> before;
  for (const Tensor& x : {p1, m1, v1, p2, m2, v2}) before.push_back(x.to_vector());
  ops::OptimizerAttrs a;
  a.lr = {1e-2, 3e-2};
  a.weight_decay = {0.1, 0.0};
  a.step = {3, 1};
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  a.eps = 1e-8;
  EXPECT_TRUE(ops::call(OpKind::AdamWUpdate, {p1, g1, m1, v1, p2, g2, m2, v2}, a).empty());
  const Tensor ps[2] = {p1, p2}, gs[2] = {g1, g2}, ms[2] = {m1, m2}, vs[2] = {v1, v2};
  for (int k = 0; k < 2; ++k) {
    std::vector<double> p = before[3 * k], m = before[3 * k + 1], v = before[3 * k + 2];
    std::vector<double> g = gs[k].to_vector();
    const double t = static_cast<double>(a.step[k]);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(0.95, t)) + 1e-8;
      p[i] = p[i] * (1 - a.lr[k] * a.weight_decay[k]) -
             a.lr[k] / (1 - std::pow(0.9, t)) * m[i] / denom;
    }
    std::vector<double> gp = ps[k].to_vector(), gm = ms[k].to_vector(), gv = vs[k].to_vector();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_NEAR(gp[i], p[i], 1e-14) << "tensor " << k << " element " << i;
      EXPECT_NEAR(gm[i], m[i], 1e-14);
      EXPECT_NEAR(gv[i], v[i], 1e-14);
    }
  }
}

TEST(OptimizerOps, SgdUpdateAppliesMomentumAndNesterov) {
  for (bool nesterov : {false, true}) {
    Tensor p = Tensor::from_vector(std::vector<double>{1, -2}, {2}, f64());
    Tensor g = Tensor::from_vector(std::vector<double>{0.5, 0.25}, {2}, f64());
    Tensor buf = Tensor::from_vector(std::vector<double>{0.1, 0.2}, {2}, f64());
    ops::OptimizerAttrs a;
    a.lr = {0.1};
    a.weight_decay = {0.01};
    a.step = {4};  // not the first: the buffer carries momentum
    a.momentum = 0.9;
    a.nesterov = nesterov;
    ops::call(OpKind::SgdUpdate, {p, g, buf}, a);
    const double d0 = 0.5 + 0.01 * 1, d1 = 0.25 + 0.01 * -2;
    const double b0 = 0.9 * 0.1 + d0, b1 = 0.9 * 0.2 + d1;
    EXPECT_NEAR(buf.to_vector()[0], b0, 1e-15);
    EXPECT_NEAR(p.to_vector()[0], 1 - 0.1 * (nesterov ? d0 + 0.9 * b0 : b0), 1e-15);
    EXPECT_NEAR(p.to_vector()[1], -2 - 0.1 * (nesterov ? d1 + 0.9 * b1 : b1), 1e-15);
  }
}

TEST(OptimizerOps, MismatchedStateNamesTheOpAndTheShapes) {
  Tensor p = Tensor::zeros({3}, f64()), g = Tensor::zeros({4}, f64());
  ops::OptimizerAttrs a;
  a.lr = {0.1};
  a.weight_decay = {0};
  a.step = {0};
  const std::string shapes = test_util::error_of([&] { ops::call(OpKind::SgdUpdate, {p, g}, a); });
  EXPECT_HAS(shapes, "sgd_update");
  EXPECT_HAS(shapes, "[4]");
  EXPECT_HAS(shapes, "[3]");
  a.lr.push_back(0.2);
  EXPECT_HAS(test_util::error_of([&] {
               ops::call(OpKind::SgdUpdate, {p, p}, a);
             }),
             "2 inputs per parameter");
}

// An optimizer steps only the parameters a program's update instructions name.
TEST(OptimizerOps, StepOfSomeParametersLeavesTheOthers) {
  Tensor a = Tensor::ones({2}, f64(true)), b = Tensor::ones({2}, f64(true));
  optim::SGD opt(std::vector<Tensor>{a, b}, {.lr = 0.5});
  a.set_grad(Tensor::ones({2}, f64()));
  b.set_grad(Tensor::ones({2}, f64()));
  opt.step(std::vector<Tensor>{b});
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(b.to_vector(), (std::vector<double>{0.5, 0.5}));
  Tensor stranger = Tensor::ones({2}, f64(true));
  EXPECT_HAS(test_util::error_of([&] { opt.step(std::vector<Tensor>{stranger}); }),
             "does not hold");
}

}  // namespace
}  // namespace hap
