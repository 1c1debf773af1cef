// gradcheck itself: it passes correct gradients, fails wrong, missing and NaN ones with a message
// naming the input and element, leaves its inputs as they were, and rejects bad calls.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap::autograd {
namespace {

using namespace test_util;

TensorOptions f64(bool rg = true) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(rg);
}

Tensor uni(const Shape& s, uint64_t seed, bool rg = true) {
  Tensor t = Tensor::empty(s, f64(false));
  fill_uniform(t, seed, 0, 0.5, 1.5);
  if (rg) t.set_requires_grad(true);
  return t;
}

TEST(Gradcheck, PassesCorrectGradientsWithASmallError) {
  Tensor a = uni({3, 4}, 1), b = uni({4}, 2);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& in) { return div(exp(mul(in[0], in[1])), add(in[1], 1.0)); },
      {a, b});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_TRUE(r.message.empty());
  EXPECT_GT(r.max_abs_error, 0.0);  // finite differences are never exact
  EXPECT_LT(r.max_abs_error, 1e-7);
}

TEST(Gradcheck, DetectsAWrongGradientAndNamesInputAndElement) {
  // x * detach(x): the analytic gradient misses the detached path (x instead of 2x), but the
  // perturbation reaches both factors because detach shares storage.
  Tensor a = uni({2, 3}, 3, false), x = uni({5}, 4);
  GradcheckResult r =
      gradcheck([](const std::vector<Tensor>& in) { return mul(in[1], in[1].detach()); }, {a, x});
  EXPECT_FALSE(r.ok);
  EXPECT_HAS(r.message,
             "input 1");  // its position among all inputs, not among those requiring grad
  EXPECT_HAS(r.message, "f64[5]");
  EXPECT_HAS(r.message, "element 0");
  EXPECT_HAS(r.message, "analytic");
  EXPECT_HAS(r.message, "numeric");
  EXPECT_GT(r.max_abs_error, 0.1);
}

TEST(Gradcheck, DetectsAMissingGradient) {
  // The output depends on x only through a detached copy: analytic 0, numeric 1.
  Tensor x = uni({3}, 5), y = uni({3}, 6);
  GradcheckResult r = gradcheck(
      [](const std::vector<Tensor>& in) { return add(in[0].detach(), mul(in[1], 2.0)); }, {x, y});
  EXPECT_FALSE(r.ok);
  EXPECT_HAS(r.message, "input 0");
}

TEST(Gradcheck, NaNGradientsFail) {
  // log at negative inputs: analytic and numeric gradients are both NaN. A check that passed here
  // could never fail on a backward rule that produces NaN.
  Tensor x = Tensor::from_vector(std::vector<double>{-1.0, 2.0}, {2}, f64());
  GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) { return log(in[0]); }, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_HAS(r.message, "element 0");
  // A NaN only in the analytic gradient: sqrt'(0) = inf * 0 style rules.
  Tensor z = Tensor::from_vector(std::vector<double>{0.0}, {1}, f64());
  GradcheckResult r2 =
      gradcheck([](const std::vector<Tensor>& in) { return mul(sqrt(in[0]), 0.0); }, {z});
  EXPECT_FALSE(r2.ok);
}

TEST(Gradcheck, InputsAreRestoredAfterTheCheck) {
  Tensor x = uni({4}, 7), c = uni({4}, 8, false);
  std::vector<double> before = x.to_vector(), cbefore = c.to_vector();
  gradcheck([](const std::vector<Tensor>& in) { return mul(in[0], in[1]); }, {x, c});
  EXPECT_EQ(x.to_vector(), before);
  EXPECT_EQ(c.to_vector(), cbefore);
  EXPECT_FALSE(x.grad().defined());  // gradcheck uses autograd::grad, which does not accumulate
}

TEST(Gradcheck, UnusedInputsHaveZeroGradient) {
  Tensor x = uni({3}, 9), unused = uni({2}, 10);
  GradcheckResult r =
      gradcheck([](const std::vector<Tensor>& in) { return exp(in[0]); }, {x, unused});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Gradcheck, BadCallsAreUserErrors) {
  Tensor f = Tensor::ones({2}, TensorOptions{}.with_requires_grad(true));
  std::string msg =
      error_of([&] { gradcheck([](const std::vector<Tensor>& in) { return in[0]; }, {f}); });
  EXPECT_HAS(msg, "f64");
  EXPECT_HAS(msg, "f32[2]");
  Tensor c = uni({2}, 11, false);
  EXPECT_HAS(
      error_of([&] { gradcheck([](const std::vector<Tensor>& in) { return exp(in[0]); }, {c}); }),
      "no input requires grad");
  Tensor x = uni({2}, 12);
  msg = error_of([&] {
    gradcheck([](const std::vector<Tensor>& in) { return cast(in[0], DType::F32); }, {x});
  });
  EXPECT_HAS(msg, "output must be f64");
  // Integer inputs (indices) are allowed alongside f64 ones.
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 0}, {2});
  GradcheckResult r = gradcheck([](const std::vector<Tensor>& in) { return exp(in[0]); }, {x, idx});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(Gradcheck, ToleranceOptionsAreHonoured) {
  // A gradient that is slightly wrong (relative 1e-3) passes a loose check and fails a strict one.
  Tensor x = uni({3}, 13);
  auto f = [](const std::vector<Tensor>& in) {
    Tensor d = in[0].detach();
    return add(mul(in[0], 1.0), mul(d, 1e-3));  // analytic 1, numeric 1.001
  };
  GradcheckOptions loose;
  loose.rtol = 1e-2;
  EXPECT_TRUE(gradcheck(f, {x}, loose).ok);
  GradcheckOptions strict;
  strict.rtol = 1e-4;
  strict.atol = 1e-6;
  EXPECT_FALSE(gradcheck(f, {x}, strict).ok);
}

}  // namespace
}  // namespace hap::autograd
