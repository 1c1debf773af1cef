// Optimizers against hand-computed updates (torch.optim semantics), the weight-decay grouping,
// global-norm clipping and the warmup + cosine learning-rate schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "models/clip.h"
#include "models/layers.h"
#include "models/lr_schedule.h"
#include "models/optim.h"

namespace hap::optim {
namespace {

using hap::testing::error_of;

Tensor param(const std::vector<double>& v, const Shape& shape, DType dt = DType::F64) {
  Tensor t = Tensor::from_vector(v, shape, TensorOptions{}.with_dtype(dt));
  t.set_requires_grad(true);
  return t;
}

void set_grad(const Tensor& p, const std::vector<double>& g) {
  p.set_grad(Tensor::from_vector(g, p.shape(), TensorOptions{}.with_dtype(p.dtype())));
}

void expect_near(const Tensor& t, const std::vector<double>& expected, double tol) {
  std::vector<double> v = t.to_vector();
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

// The gradients fed at steps 0, 1, 2 (per element).
const std::vector<std::vector<double>> kGrads = {
    {0.5, -1.0, 2.0, 0.0}, {0.25, 0.5, -1.5, 1.0}, {-0.75, 0.1, 0.3, -2.0}};
const std::vector<double> kInit = {1.0, -2.0, 0.5, 3.0};

// torch.optim.AdamW written out for one element, in double.
std::vector<double> adamw_reference(double lr, double b1, double b2, double eps, double wd,
                                    int steps) {
  std::vector<double> p = kInit, m(4, 0), v(4, 0);
  for (int t = 1; t <= steps; ++t)
    for (size_t i = 0; i < 4; ++i) {
      double g = kGrads[t - 1][i];
      p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double mhat = m[i] / (1 - std::pow(b1, t));
      double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  return p;
}

TEST(AdamW, FirstStepIsSignLikeWithDecoupledDecay) {
  // Step 1: m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
  Tensor p = param({1.0, -2.0}, {2, 1});
  AdamW opt({p}, {.lr = 0.1, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.5});
  set_grad(p, {0.5, -4.0});
  opt.step();
  expect_near(p, {1.0 * 0.95 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 * 0.95 + 0.1 * 4.0 / (4.0 + 1e-8)},
              1e-14);
}

TEST(AdamW, ThreeStepsMatchTheTorchFormulasInF64AndF32) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor p = param(kInit, {2, 2}, dt);
    AdamW opt({p}, {.lr = 0.01, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1});
    for (int s = 0; s < 3; ++s) {
      set_grad(p, kGrads[s]);
      opt.step();
    }
    expect_near(p, adamw_reference(0.01, 0.9, 0.95, 1e-8, 0.1, 3), dt == DType::F64 ? 1e-14 : 1e-6);
    EXPECT_EQ(opt.state(p)->step, 3);
    // The second moment after 3 steps: sum_t (1-b2) b2^(3-t) g_t^2.
    double v0 = 0.05 * (0.95 * 0.95 * 0.25 + 0.95 * 0.0625 + 0.5625);
    EXPECT_NEAR(opt.state(p)->slots[1].item_at(0), v0, dt == DType::F64 ? 1e-15 : 1e-8);
  }
}

TEST(AdamW, WeightDecayGroupsDecayOnlyMatrices) {
  nn::Linear lin(nn::LinearOptions(2, 2));
  lin.weight.copy_from(Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}));
  lin.bias.copy_from(Tensor::from_vector(std::vector<double>{1, 1}, {2}));
  auto groups = weight_decay_groups(lin.named_parameters(), 0.5);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "decay");
  ASSERT_EQ(groups[0].params.size(), 1u);
  EXPECT_TRUE(groups[0].params[0].same(lin.weight));
  ASSERT_EQ(groups[1].params.size(), 1u);
  EXPECT_TRUE(groups[1].params[0].same(lin.bias));
  EXPECT_EQ(*groups[1].weight_decay, 0.0);

  // With zero gradients Adam's step is 0, so only the decoupled decay moves the parameters.
  AdamW opt(groups, {.lr = 0.1, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 0.01});
  lin.weight.set_grad(Tensor::zeros({2, 2}));
  lin.bias.set_grad(Tensor::zeros({2}));
  opt.step();
  expect_near(lin.weight, {0.95, 1.9, 2.85, 3.8}, 1e-6);  // group's 0.5, not the default 0.01
  expect_near(lin.bias, {1, 1}, 0);
}

TEST(AdamW, SkipsParametersWithoutGradientAndHonoursSetLr) {
  Tensor a = param({1.0}, {1}), b = param({1.0}, {1});
  AdamW opt({a, b}, {.lr = 0.1, .betas = {0.9, 0.999}, .eps = 0.0, .weight_decay = 0.0});
  set_grad(a, {2.0});
  opt.step();
  EXPECT_NEAR(a.item(), 0.9, 1e-15);
  EXPECT_EQ(b.item(), 1.0);
  EXPECT_EQ(opt.state(b)->step, 0);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
  opt.step();
  EXPECT_NEAR(a.item(), 0.4, 1e-12);
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(AdamW, RejectsBadOptionsAndDuplicateParameters) {
  Tensor a = param({1.0}, {1});
  EXPECT_HAS(error_of([&] { AdamW({a, a}, {}); }), "appears more than once");
  EXPECT_HAS(error_of([&] {
               AdamW({a}, {.lr = 1e-3, .betas = {1.0, 0.9}});
             }),
             "betas must be in [0, 1), got (1, 0.9)");
  EXPECT_HAS(error_of([&] { AdamW({a}, {.lr = -1}); }), "learning rate of group 0 must be >= 0");
  Tensor bf = Tensor::zeros({2}, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_HAS(error_of([&] { AdamW({bf}, {}); }), "only f32 and f64 parameters are supported");
  AdamW opt({a}, {});
  a.set_grad(Tensor::zeros({2}, TensorOptions{}.with_dtype(DType::F64)));
  EXPECT_HAS(error_of([&] { opt.step(); }), "does not match parameter 0 of group 0");
}

// torch.optim.SGD (dampening 0) written out, in double.
std::vector<double> sgd_reference(double lr, double momentum, double wd, bool nesterov, int steps) {
  std::vector<double> p = kInit, buf(4, 0);
  for (int t = 0; t < steps; ++t)
    for (size_t i = 0; i < 4; ++i) {
      double d = kGrads[t][i] + wd * p[i];
      if (momentum != 0) {
        buf[i] = t == 0 ? d : momentum * buf[i] + d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  return p;
}

TEST(SGD, ThreeStepsWithMomentumNesterovAndWeightDecay) {
  struct Case {
    double momentum, wd;
    bool nesterov;
  };
  for (Case c : {Case{0.0, 0.0, false}, Case{0.9, 0.0, false}, Case{0.9, 0.1, false},
                 Case{0.9, 0.1, true}}) {
    Tensor p = param(kInit, {4});
    SGD opt({p}, {.lr = 0.1, .momentum = c.momentum, .weight_decay = c.wd, .nesterov = c.nesterov});
    for (int s = 0; s < 3; ++s) {
      set_grad(p, kGrads[s]);
      opt.step();
    }
    expect_near(p, sgd_reference(0.1, c.momentum, c.wd, c.nesterov, 3), 1e-14);
  }
  // By hand, element 0, momentum 0.9, no decay: bufs 0.5, 0.7, -0.12; p = 1 - 0.1 (0.5 + 0.7 -
  // 0.12).
  Tensor p = param(kInit, {4});
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < 3; ++s) {
    set_grad(p, kGrads[s]);
    opt.step();
  }
  EXPECT_NEAR(p.item_at(0), 1.0 - 0.1 * (0.5 + 0.7 - 0.12), 1e-14);
  EXPECT_HAS(error_of([&] { SGD({param({1.0}, {1})}, {.lr = 0.1, .nesterov = true}); }),
             "nesterov needs a momentum > 0");
}

// step(grad_scale), what the trainer's clipping does, against clip_grad_norm_ then step(): the
// same parameters and state over three steps, the gradients left unscaled. Bit for bit for
// AdamW; SGD adds the scaled gradient to another product (weight decay, momentum), which the
// compiler may fuse into one multiply-add: there, within a few ulp.
TEST(Optimizers, StepWithAGradScaleIsClippingThenStepping) {
  for (DType d : {DType::F32, DType::F64})
    for (bool adamw : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(d)) + (adamw ? " AdamW" : " SGD"));
      const double ulp = d == DType::F32 ? 0x1p-23 : 0x1p-52;
      auto expect_same = [&](const Tensor& got, const Tensor& want, int step) {
        const std::vector<double> g = got.to_vector(), w = want.to_vector();
        ASSERT_EQ(g.size(), w.size());
        for (size_t i = 0; i < g.size(); ++i) {
          if (adamw) {
            EXPECT_EQ(g[i], w[i]) << "step " << step << " element " << i;
          } else {
            EXPECT_NEAR(g[i], w[i], 8 * ulp * std::max(1.0, std::abs(w[i])))
                << "step " << step << " element " << i;
          }
        }
      };
      Tensor a = param(kInit, {4}, d), b = param(kInit, {2, 2}, d);
      Tensor a2 = param(kInit, {4}, d), b2 = param(kInit, {2, 2}, d);
      auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<Optimizer> {
        if (adamw)
          return std::make_unique<AdamW>(std::move(ps),
                                         AdamWOptions{.lr = 0.1, .weight_decay = 0.1});
        return std::make_unique<SGD>(
            std::move(ps),
            SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
      };
      auto clipped = make({a, b}), folded = make({a2, b2});
      for (int s = 0; s < 3; ++s) {
        for (const Tensor& p : {a, b, a2, b2}) set_grad(p, kGrads[s]);
        const double norm = nn::clip_grad_norm_({a, b}, 0.5);
        ASSERT_GT(norm, 0.5);  // clipping scales
        clipped->step();
        folded->step(0.5 / (nn::grad_norm({a2, b2}) + 1e-6));
        expect_same(a2, a, s);
        expect_same(b2, b, s);
        for (size_t k = 0; k < clipped->state(a)->slots.size(); ++k)
          expect_same(folded->state(a2)->slots[k], clipped->state(a)->slots[k], s);
        EXPECT_EQ(a2.grad().to_vector(),
                  Tensor::from_vector(kGrads[s], {4}, TensorOptions{}.with_dtype(d)).to_vector());
      }
    }
}

TEST(ClipGradNorm, ReturnsTheGlobalNormAndScalesOnlyAboveMax) {
  Tensor a = param({3.0, 0.0}, {2}), b = param({0.0}, {1}), none = param({1.0}, {1});
  set_grad(a, {3.0, 0.0});
  set_grad(b, {4.0});
  // Norm 5 <= 10: unchanged.
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a, b, none}, 10.0), 5.0);
  expect_near(a.grad(), {3.0, 0.0}, 0);
  // Norm 5 > 1: scaled by 1 / (5 + 1e-6); a listed twice counts once.
  EXPECT_DOUBLE_EQ(nn::clip_grad_norm_({a, b, a}, 1.0), 5.0);
  double coef = 1.0 / (5.0 + 1e-6);
  expect_near(a.grad(), {3.0 * coef, 0.0}, 1e-15);
  expect_near(b.grad(), {4.0 * coef}, 1e-15);
  EXPECT_NEAR(nn::grad_norm({a, b}), 5.0 * coef, 1e-15);
  EXPECT_FALSE(none.grad().defined());
}

TEST(ClipGradNorm, SharedGradientStorageIsScaledOnce) {
  Tensor a = param({0.0, 0.0}, {2}), b = param({0.0, 0.0}, {2});
  Tensor g = Tensor::from_vector(std::vector<double>{3.0, 4.0}, {2},
                                 TensorOptions{}.with_dtype(DType::F64));
  a.set_grad(g);
  b.set_grad(g);  // what the engine may do when one gradient flows to two leaves
  double norm = nn::clip_grad_norm_({a, b}, 1.0);
  EXPECT_NEAR(norm, std::sqrt(50.0), 1e-12);
  double coef = 1.0 / (std::sqrt(50.0) + 1e-6);
  expect_near(a.grad(), {3 * coef, 4 * coef}, 1e-15);
  expect_near(b.grad(), {3 * coef, 4 * coef}, 1e-15);
}

TEST(LrSchedule, WarmupPeakAndCosineEnd) {
  WarmupCosineSchedule s{.lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);    // the end of warmup reaches the peak
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);   // ratio 0: the peak
  EXPECT_DOUBLE_EQ(s.at(60), 0.55);  // ratio 1/2: halfway between peak and floor
  EXPECT_NEAR(s.at(35), 0.1 + 0.5 * (1 + std::cos(std::numbers::pi * 0.25)) * 0.9, 1e-15);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);                                 // ratio 1: the floor
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);                                 // stays there
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(0, 3e-4, 3e-5, 0, 100), 3e-4);  // no warmup
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(7, 1.0, 1.0, 2, 5), 1.0);
  EXPECT_HAS(error_of([] { warmup_cosine_lr(-1, 1, 0, 0, 10); }), "step must be >= 0, got -1");
  EXPECT_HAS(error_of([] { warmup_cosine_lr(0, 1, 0, -2, 10); }), "warmup_steps must be >= 0");
}

}  // namespace
}  // namespace hap::optim
