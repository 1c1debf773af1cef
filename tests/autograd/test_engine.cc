// The autograd engine: gradients of small graphs against hand-derived values, accumulation over
// backward calls, shared subexpressions and diamonds, no_grad, multi-output ops, autograd::grad,
// several roots, custom functions, and the errors bad calls get.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using namespace test_util;

TensorOptions f64(bool rg = false) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(rg);
}

Tensor vec(std::vector<double> v, bool rg = true) {
  int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n}, f64(rg));
}

void expect_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_TRUE(t.defined());
  std::vector<double> got = t.to_vector();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// ---------------------------------------------------------------- basic graphs

TEST(Engine, ChainRuleThroughSeveralOps) {
  // L = sum(exp(2x) * x + 3) -> dL/dx = exp(2x) (2x + 1)
  Tensor x = vec({-0.5, 0.0, 0.7});
  Tensor y = sum(add(mul(exp(mul(x, 2.0)), x), 3.0));
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_NE(y.grad_fn(), nullptr);
  y.backward();
  std::vector<double> want;
  for (double v : {-0.5, 0.0, 0.7}) want.push_back(std::exp(2 * v) * (2 * v + 1));
  expect_near(x.grad(), want);
  EXPECT_FALSE(y.grad().defined());  // non-leaves keep no .grad
}

TEST(Engine, GradientsAccumulateOverBackwardCalls) {
  Tensor x = vec({1, 2, 3});
  Tensor y = sum(mul(x, x));
  y.backward();
  expect_near(x.grad(), {2, 4, 6});
  y.backward();  // the graph is kept: a second pass adds
  expect_near(x.grad(), {4, 8, 12});
  sum(mul(x, 10.0)).backward();  // a new graph on the same leaf adds too
  expect_near(x.grad(), {14, 18, 22});
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(x).backward();
  expect_near(x.grad(), {1, 1, 1});
}

TEST(Engine, ATensorUsedSeveralTimesGetsTheSumOfItsGradients) {
  Tensor x = vec({0.5, -2});
  // y = x * x * x + x  -> 3x^2 + 1
  Tensor y = sum(add(mul(mul(x, x), x), x));
  y.backward();
  expect_near(x.grad(), {3 * 0.25 + 1, 3 * 4 + 1});
  // An intermediate used several times: h = exp(x); y = h * h + h -> (2h + 1) h
  Tensor z = vec({0.1, 0.3});
  Tensor h = exp(z);
  sum(add(mul(h, h), h)).backward();
  std::vector<double> want;
  for (double v : {0.1, 0.3}) want.push_back((2 * std::exp(v) + 1) * std::exp(v));
  expect_near(z.grad(), want);
}

// The observer hears of a leaf once, after its last accumulation (a leaf used three times, once
// through a view), with .grad then complete, and a leaf whose gradient is zeros like any other.
// Nodes are reported as they run;
// autograd::grad is not observed, nor any backward outside the observer's scope.
TEST(Engine, AnObserverHearsOfEachLeafOnceItsGradientIsComplete) {
  struct Recorder : autograd::BackwardObserver {
    std::vector<std::pair<const TensorImpl*, std::vector<double>>> leaves;
    int nodes = 0;
    void leaf_done(const Tensor& leaf) override {
      leaves.push_back(
          {leaf.impl(), leaf.grad().defined() ? leaf.grad().to_vector() : std::vector<double>{}});
    }
    void node_done() override { ++nodes; }
  } rec;
  Tensor a = vec({1, 2});
  Tensor b = vec({3, -1});
  Tensor unused_grad = vec({5, 5});
  {
    autograd::ObserveBackward observe(&rec);
    // y = sum(a * a + a[0:2] * b) + sum(c * 0)
    Tensor first = mul(a, a);
    Tensor second = mul(slice(a, 0, 0, 2), b);
    Tensor y = add(sum(add(first, second)), sum(mul(unused_grad, 0.0)));
    y.backward();
  }
  ASSERT_EQ(rec.leaves.size(), 3u);
  std::map<const TensorImpl*, std::vector<double>> got;
  for (const auto& [impl, g] : rec.leaves) {
    EXPECT_EQ(got.count(impl), 0u) << "a leaf reported twice";
    got[impl] = g;
  }
  // d/da = 2a + b, d/db = a: complete when reported.
  EXPECT_EQ(got.at(a.impl()), (std::vector<double>{2 * 1 + 3, 2 * 2 - 1}));
  EXPECT_EQ(got.at(b.impl()), (std::vector<double>{1, 2}));
  EXPECT_EQ(got.at(unused_grad.impl()), (std::vector<double>{0, 0}));
  EXPECT_GT(rec.nodes, 3);
  // Outside the scope, and autograd::grad inside one, nothing is reported.
  const size_t before = rec.leaves.size();
  sum(mul(a, b)).backward();
  {
    autograd::ObserveBackward observe(&rec);
    autograd::grad(sum(mul(a, b)), {a});
  }
  EXPECT_EQ(rec.leaves.size(), before);
}

TEST(Engine, DiamondGraphsRunEachNodeOnceWithAllItsGradient) {
  // a -> b = exp(a) -> { c = 2b, d = b^2 } -> e = c * d, so de/da = d(2 b^3)/da = 6 b^3.
  // b is recorded as a custom function that counts its backward calls.
  Tensor a = vec({0.2, -0.4});
  int calls = 0;
  Tensor eb = exp(a.detach());
  Tensor saved = eb.detach();  // not eb itself: the node would then hold its own output (a cycle)
  auto counted = [&calls, saved](const std::vector<Tensor>& g) {
    ++calls;
    return std::vector<Tensor>{mul(g[0], saved)};
  };
  Tensor b = autograd::record_custom("counted_exp", {a}, {eb}, counted)[0];
  Tensor e = mul(mul(b, 2.0), pow(b, 2.0));
  sum(e).backward();
  std::vector<double> want;
  for (double v : {0.2, -0.4}) want.push_back(6 * std::pow(std::exp(v), 3));
  expect_near(a.grad(), want, 1e-12);
  EXPECT_EQ(calls, 1);  // after both branches delivered their gradient, not once per branch
  // A wider diamond: four paths of different lengths from x to the loss.
  Tensor x = vec({1.5});
  Tensor p1 = mul(x, 2.0);
  Tensor p2 = neg(neg(x));
  Tensor p3 = mul(add(x, 1.0), 3.0);
  Tensor loss = add(add(p1, p2), add(p3, sub(x, p1)));  // 2x + x + 3x + 3 + x - 2x = 5x + 3
  loss.backward();
  expect_near(x.grad(), {5});
}

TEST(Engine, LongChainsDoNotRecurse) {
  Tensor x = vec({1.0});
  Tensor y = x;
  for (int i = 0; i < 20000; ++i) y = add(y, 0.0);
  sum(y).backward();
  expect_near(x.grad(), {1});
}

TEST(Engine, GradientsStopAtInputsThatDoNotRequireGrad) {
  Tensor x = vec({1, 2});
  Tensor w = vec({3, 4}, false);
  Tensor y = sum(mul(x, w));
  y.backward();
  expect_near(x.grad(), {3, 4});
  EXPECT_FALSE(w.grad().defined());
  // An op on tensors that do not require grad records nothing.
  Tensor z = mul(w, w);
  EXPECT_FALSE(z.requires_grad());
  EXPECT_EQ(z.grad_fn(), nullptr);
  EXPECT_TRUE(z.is_leaf());
}

TEST(Engine, BroadcastGradientsAreReducedToTheInputShape) {
  Tensor a = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3, 1}, f64(true));
  Tensor b = Tensor::from_vector(std::vector<double>{10, 20, 30, 40}, {4}, f64(true));
  sum(mul(a, b)).backward();  // [3, 4]
  EXPECT_EQ(a.grad().shape(), (Shape{3, 1}));
  expect_near(a.grad(), {100, 100, 100});
  EXPECT_EQ(b.grad().shape(), (Shape{4}));
  expect_near(b.grad(), {6, 6, 6, 6});
}

TEST(Engine, ViewsOfALeafRouteGradientsToTheRightElements) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, f64(true));
  Tensor t = transpose(x, 0, 1);  // [3, 2]
  Tensor s = slice(t, 0, 1, 3);   // rows 1, 2 of the transpose = columns 1, 2 of x
  Tensor r = reshape(s, {4});     // a copy (non-contiguous)
  Tensor w = Tensor::from_vector(std::vector<double>{1, 10, 100, 1000}, {4}, f64());
  sum(mul(r, w)).backward();
  // r = [x01, x11, x02, x12]
  expect_near(x.grad(), {0, 1, 100, 0, 10, 1000});
}

// ---------------------------------------------------------------- multi-output ops

TEST(Engine, MultiOutputOpsWithSomeOutputsUnused) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5}, {5}, f64(true));
  std::vector<Tensor> parts = split(x, {2, 3}, 0);
  sum(mul(parts[1], 2.0)).backward();
  expect_near(x.grad(), {0, 0, 2, 2, 2});
  x.zero_grad();
  // Both outputs, through different paths.
  std::vector<Tensor> p = split(x, {2, 3}, 0);
  add(sum(mul(p[0], 3.0)), sum(exp(p[1]))).backward();
  expect_near(x.grad(), {3, 3, std::exp(3), std::exp(4), std::exp(5)});
  // topk: indices are integer (no history), values carry the gradient.
  x.zero_grad();
  auto [vals, idx] = topk(x, 2);
  EXPECT_FALSE(idx.requires_grad());
  EXPECT_TRUE(vals.requires_grad());
  sum(vals).backward();
  expect_near(x.grad(), {0, 0, 0, 1, 1});
  EXPECT_FALSE(argmax(x, 0).requires_grad());
}

// ---------------------------------------------------------------- no_grad

TEST(Engine, NoGradGuardDisablesRecordingForItsScope) {
  Tensor x = vec({1, 2});
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  {
    NoGradGuard g;
    EXPECT_FALSE(autograd::GradMode::is_enabled());
    Tensor y = mul(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      NoGradGuard nested;
      EXPECT_FALSE(autograd::GradMode::is_enabled());
    }
    EXPECT_FALSE(autograd::GradMode::is_enabled());  // the inner guard restores "off"
    std::string msg = error_of([&] { sum(y).backward(); });
    EXPECT_HAS(msg, "does not require grad");
    EXPECT_HAS(msg, "no_grad");
  }
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  Tensor z = mul(x, x);
  EXPECT_TRUE(z.requires_grad());
  // A value computed under no_grad enters a later graph as a constant.
  Tensor c;
  {
    NoGradGuard g;
    c = exp(x);
  }
  sum(mul(c, x)).backward();
  expect_near(x.grad(), {std::exp(1), std::exp(2)});
}

TEST(Engine, BackwardItselfRecordsNothing) {
  Tensor x = vec({1, 2});
  sum(mul(x, x)).backward();
  EXPECT_FALSE(x.grad().requires_grad());
  EXPECT_EQ(x.grad().grad_fn(), nullptr);
  EXPECT_TRUE(autograd::GradMode::is_enabled());
}

// ---------------------------------------------------------------- errors

TEST(Engine, BackwardOnANonScalarNeedsAGradOutput) {
  Tensor x = vec({1, 2, 3});
  Tensor y = mul(x, 2.0);
  std::string msg = error_of([&] { y.backward(); });
  EXPECT_HAS(msg, "scalar");
  EXPECT_HAS(msg, "[3]");
  EXPECT_FALSE(x.grad().defined());
  y.backward(Tensor::from_vector(std::vector<double>{1, 10, 100}, {3}, f64()));
  expect_near(x.grad(), {2, 20, 200});
  msg = error_of([&] { y.backward(Tensor::ones({2}, f64())); });
  EXPECT_HAS(msg, "[2]");
  EXPECT_HAS(msg, "[3]");
  // A [1, 1] output is a scalar in all but shape: ones are implied.
  Tensor z = reshape(sum(x), {1, 1});
  EXPECT_NO_THROW(z.backward());
}

TEST(Engine, BackwardWithAGradOutputOfAnotherDtypeNamesBoth) {
  Tensor x = vec({1, 2});
  Tensor y = mul(x, 2.0);
  std::string msg = error_of([&] { y.backward(Tensor::ones({2})); });
  EXPECT_HAS(msg, "f32");
  EXPECT_HAS(msg, "f64");
}

TEST(Engine, BackwardOnATensorWithoutHistoryIsAnError) {
  Tensor c = Tensor::ones({1}, f64());
  EXPECT_HAS(error_of([&] { c.backward(); }), "does not require grad");
  EXPECT_HAS(error_of([] { Tensor().backward(); }), "undefined");
  EXPECT_HAS(error_of([] { autograd::backward({Tensor::ones({1}, f64(true))}, {}); }),
             "1 roots but 0 gradients");
}

TEST(Engine, BackwardOfALeafAccumulatesTheGradOutput) {
  Tensor x = vec({1, 2});
  autograd::backward({x}, {Tensor::from_vector(std::vector<double>{3, 4}, {2}, f64())});
  expect_near(x.grad(), {3, 4});
}

// ---------------------------------------------------------------- autograd::grad

TEST(Engine, GradReturnsGradientsWithoutAccumulating) {
  Tensor x = vec({1, 2}), w = vec({3, 5});
  Tensor y = sum(mul(mul(x, x), w));  // dy/dx = 2xw, dy/dw = x^2
  std::vector<Tensor> g = autograd::grad(y, {x, w});
  ASSERT_EQ(g.size(), 2u);
  expect_near(g[0], {6, 20});
  expect_near(g[1], {1, 4});
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  // Only the requested inputs: w's gradient is neither returned nor accumulated.
  std::vector<Tensor> gx = autograd::grad(y, {x});
  ASSERT_EQ(gx.size(), 1u);
  expect_near(gx[0], {6, 20});
  EXPECT_FALSE(w.grad().defined());
  // With a grad_output, and an input the output does not depend on.
  Tensor u = vec({7});
  std::vector<Tensor> gu = autograd::grad(mul(x, 2.0), {x, u}, Tensor::ones({2}, f64()));
  expect_near(gu[0], {2, 2});
  EXPECT_FALSE(gu[1].defined());
}

TEST(Engine, GradRejectsNonLeafInputs) {
  Tensor x = vec({1, 2});
  Tensor h = mul(x, 2.0);
  std::string msg = error_of([&] { autograd::grad(sum(h), {h}); });
  EXPECT_HAS(msg, "leaf");
}

// ---------------------------------------------------------------- gradient storage

TEST(Engine, LeafGradientsNeverAliasEachOtherOrTheGradOutput) {
  // add's backward hands the same gradient to both inputs; the leaves must not share it, or an
  // in-place update of one .grad (clipping, zeroing) would change the other.
  Tensor x = vec({1, 2}), y = vec({3, 4});
  Tensor g = Tensor::from_vector(std::vector<double>{1, 1}, {2}, f64());
  add(x, y).backward(g);
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(y.grad().defined());
  EXPECT_NE(x.grad().raw_data(), y.grad().raw_data());
  EXPECT_NE(x.grad().raw_data(), g.raw_data());
  EXPECT_NE(y.grad().raw_data(), g.raw_data());
  x.grad().fill_(0);
  expect_near(y.grad(), {1, 1});
  expect_near(g, {1, 1});
  // A leaf as its own root gets a copy of the grad_output, not the tensor itself.
  Tensor z = vec({5});
  Tensor gz = Tensor::ones({1}, f64());
  autograd::backward({z}, {gz});
  EXPECT_NE(z.grad().raw_data(), gz.raw_data());
}

TEST(Engine, GradientsAreContiguousAndOfTheLeafDtype) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3},
                                 TensorOptions{}.with_requires_grad(true));
  sum(transpose(x, 0, 1)).backward();
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  Tensor e = Tensor::from_vector(std::vector<double>{1, 2}, {2, 1}, f64(true));
  sum(expand(e, {2, 5})).backward();
  EXPECT_TRUE(e.grad().is_contiguous());
  expect_near(e.grad(), {5, 5});
}

// ---------------------------------------------------------------- several roots

TEST(Engine, SeveralRootsOneOfThemUpstreamOfAnother) {
  // z = 3y, y = 2x; backward({y, z}, {1, 1}) = d(y + z)/dx = 2 + 6
  Tensor x = vec({1.0});
  Tensor y = mul(x, 2.0);
  Tensor z = mul(y, 3.0);
  Tensor one = Tensor::ones({1}, f64());
  autograd::backward({y, z}, {one, one});
  expect_near(x.grad(), {8});
  x.zero_grad();
  autograd::backward({z, y}, {one, one});
  expect_near(x.grad(), {8});
}

TEST(Engine, TheSameRootTwiceCountsTwice) {
  Tensor x = vec({1.0});
  Tensor y = mul(x, 2.0);
  Tensor one = Tensor::ones({1}, f64());
  autograd::backward({y, y}, {one, one});
  expect_near(x.grad(), {4});
}

TEST(Engine, IndependentRoots) {
  Tensor a = vec({1.0}), b = vec({2.0});
  Tensor one = Tensor::ones({1}, f64());
  autograd::backward({mul(a, 3.0), mul(b, 5.0)}, {one, one});
  expect_near(a.grad(), {3});
  expect_near(b.grad(), {5});
}

// ---------------------------------------------------------------- custom functions

TEST(Engine, CustomFunctionsUseTheirBackward) {
  Tensor x = vec({1, 2});
  Tensor y_raw = mul(x.detach(), 4.0);  // computed outside autograd
  std::vector<Tensor> outs = autograd::record_custom(
      "times_four", {x}, {y_raw},
      [](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], 4.0)}; });
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_TRUE(outs[0].requires_grad());
  sum(mul(outs[0], outs[0])).backward();  // d(16 x^2)/dx = 32 x
  expect_near(x.grad(), {32, 64});
  // Nothing is recorded when no input requires grad or under no_grad.
  Tensor c = vec({1}, false);
  EXPECT_FALSE(autograd::record_custom("f", {c}, {mul(c, 1.0)}, nullptr)[0].requires_grad());
  NoGradGuard g;
  EXPECT_FALSE(autograd::record_custom("f", {x}, {mul(x, 1.0)}, nullptr)[0].requires_grad());
}

// ---------------------------------------------------------------- rematerializable tensors

// A tensor marked rematerializable is not kept by the ops that save it: once the forward pass
// drops it, its memory is free; each saving op's backward makes it again (once per such op) and
// gets the gradients the kept tensor gives, bit for bit.
// Ops whose backward reads only their inputs' shapes and dtypes (OpDef::input_metas_only: sums,
// views, concatenation, casts, addition) keep shape-only tensors, so an activation that only such
// ops read is freed after the forward pass; the gradients are those of the rule.
TEST(Engine, OpsReadingOnlyTheirInputsShapesKeepNoInputData) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, f64(true));
  Tensor a = mul(x, x);  // an activation: 2x is its gradient's factor
  std::vector<Tensor> outs = {
      sum(a),
      reshape(a, {3, 2}),
      add(a, a),
      sub(a, mul(a, 2.0)),
      concat({a, a}, 0),
      split(a, {1, 2}, 1)[1],
      cast(a, DType::F32),
      expand(reshape(sum(a, {0}), {1, 3}), {4, 3}),
      slice(a, 1, 1, 3),
  };
  const char* names[] = {"sum",   "reshape", "add",    "sub",  "concat",
                         "split", "cast",    "expand", "slice"};
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto& node = outs[i].grad_fn();
    ASSERT_TRUE(node) << names[i];
    ASSERT_FALSE(node->saved_inputs.empty()) << names[i];
    for (const Tensor& t : node->saved_inputs) {
      ASSERT_TRUE(t.defined()) << names[i];
      EXPECT_FALSE(t.has_storage()) << names[i] << " keeps its input's data";
    }
  }
  // d/dx of sum(out_i) = 2x * (how often out_i reads each element of a).
  const std::vector<std::vector<double>> reads = {
      {1, 1, 1, 1, 1, 1},       {1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2},
      {-1, -1, -1, -1, -1, -1}, {2, 2, 2, 2, 2, 2}, {0, 1, 1, 0, 1, 1},
      {1, 1, 1, 1, 1, 1},       {4, 4, 4, 4, 4, 4}, {0, 1, 1, 0, 1, 1}};
  for (size_t i = 0; i < outs.size(); ++i) {
    x.zero_grad();
    Tensor o = outs[i].dtype() == DType::F64 ? outs[i] : cast(outs[i], DType::F64);
    sum(o).backward();
    std::vector<double> want;
    for (size_t j = 0; j < 6; ++j) want.push_back(2.0 * static_cast<double>(j + 1) * reads[i][j]);
    SCOPED_TRACE(names[i]);
    expect_near(x.grad(), want, 1e-5);
  }
}

TEST(Engine, RematerializableTensorsAreMadeAgainForEachBackwardThatSavedThem) {
  const std::vector<double> wv = {0.5, -1.25, 2.0, 0.75, -0.5, 1.5};
  const std::vector<double> xv = {1.0, 2.0, -1.0, 0.25, 3.0, -2.0};
  auto run = [&](bool remake, int* calls, bool* freed) {
    Tensor w = Tensor::from_vector(wv, {3, 2}, f64(true));
    Tensor x = Tensor::from_vector(xv, {2, 3}, f64(true));
    Tensor loss;
    {
      Tensor w2 = mul(w, 2.0);  // an op output (what an all-gather makes)
      std::weak_ptr<Storage> storage = w2.impl()->storage;
      if (remake)
        autograd::rematerializable(w2, [w, calls] {
          ++*calls;
          return mul(w.detach(), 2.0);
        });
      // Two ops save it: the product and an elementwise product with a constant.
      const Tensor c =
          Tensor::from_vector(std::vector<double>{1, -2, 3, 0.5, 2, -1}, {3, 2}, f64());
      Tensor y = matmul(x, w2);
      loss = add(sum(mul(y, y)), sum(mul(w2, c)));
      w2 = Tensor();
      *freed = storage.expired();
    }
    loss.backward();
    return std::make_pair(w.grad().to_vector(), x.grad().to_vector());
  };
  int calls = 0;
  bool freed_kept = false, freed_remade = false;
  const auto kept = run(false, &calls, &freed_kept);
  EXPECT_EQ(calls, 0);
  EXPECT_FALSE(freed_kept) << "a saved tensor was freed";
  const auto remade = run(true, &calls, &freed_remade);
  EXPECT_TRUE(freed_remade) << "the saving ops kept the rematerializable tensor";
  EXPECT_EQ(calls, 2) << "one remake per op that saved it (matmul and mul)";
  EXPECT_EQ(remade.first, kept.first);
  EXPECT_EQ(remade.second, kept.second);
}

TEST(Engine, RematerializableChecksItsTensorAndWhatTheRemakeReturns) {
  Tensor plain = vec({1, 2}, false);
  EXPECT_THROW(autograd::rematerializable(plain, [] { return Tensor(); }), Error);
  Tensor w = vec({1, 2, 3});
  Tensor w2 = mul(w, 2.0);
  EXPECT_THROW(autograd::rematerializable(w2, nullptr), Error);
  autograd::rematerializable(w2, [] { return vec({1, 2}, false); });  // the wrong shape
  Tensor loss = sum(mul(w2, w2));
  try {
    loss.backward();
    FAIL() << "a remake of the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("made again"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- whole factors

// Sufficient factor broadcasting on one process: a rank holding rows 0..1 of a linear layer's
// 6-row input gets the weight and bias gradients of all 6 rows from the whole input and output
// gradient (the gather hands the other rows on), bit for bit what one device computes, and its
// own rows' input gradient from the local factors.
TEST(Engine, GatherFactorsGivesWholeParameterGradientsFromTheLocalRows) {
  std::vector<double> xv, wv, cv;
  for (int i = 0; i < 18; ++i) xv.push_back(0.25 * (i % 7) - 0.6 + 0.01 * i);
  for (int i = 0; i < 15; ++i) wv.push_back(0.5 - 0.07 * i);
  for (int i = 0; i < 30; ++i) cv.push_back(1.0 - 0.09 * (i % 11));
  const Tensor c = Tensor::from_vector(cv, {6, 5}, f64());
  auto params = [&] {
    return std::make_pair(Tensor::from_vector(wv, {5, 3}, f64(true)),
                          vec({0.1, -0.2, 0.3, 0.4, -0.5}));
  };
  // One device.
  auto [w1, b1] = params();
  Tensor x1 = Tensor::from_vector(xv, {6, 3}, f64(true));
  sum(mul(linear(x1, w1, b1), c)).backward();
  // Rows 0..1 on this "rank".
  auto [w2, b2] = params();
  Tensor x2 = Tensor::from_vector(xv, {6, 3}, f64(true));
  const Tensor rest_x = slice(x2, 0, 2, 6).detach(), rest_g = slice(c, 0, 2, 6);
  int calls = 0;
  Tensor y = linear(slice(x2, 0, 0, 2), w2, b2);
  autograd::gather_factors(y, {false, true, true},
                           [&](const std::vector<autograd::Node::Factor>& factors) {
                             ++calls;
                             // The input x (0), then the output's gradient (0).
                             EXPECT_EQ(factors.size(), 2u);
                             std::vector<Tensor> whole;
                             for (const autograd::Node::Factor& f : factors) {
                               EXPECT_EQ(f.index, 0u);
                               whole.push_back(concat({f.local, f.grad ? rest_g : rest_x}, 0));
                             }
                             return whole;
                           });
  sum(mul(y, slice(c, 0, 0, 2))).backward();
  EXPECT_EQ(calls, 1) << "one call for all the factors";
  EXPECT_EQ(w2.grad().to_vector(), w1.grad().to_vector());
  EXPECT_EQ(b2.grad().to_vector(), b1.grad().to_vector());
  const std::vector<double> gx1 = x1.grad().to_vector(), gx2 = x2.grad().to_vector();
  for (size_t i = 0; i < gx1.size(); ++i) EXPECT_EQ(gx2[i], i < 6 ? gx1[i] : 0.0) << i;
}

TEST(Engine, GatherFactorsChecksWhatItIsGiven) {
  auto gather = [](const std::vector<autograd::Node::Factor>& factors) {
    std::vector<Tensor> out;
    for (const autograd::Node::Factor& f : factors) out.push_back(f.local);
    return out;
  };
  Tensor w = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, f64(true));
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}, f64(false));
  EXPECT_THROW(autograd::gather_factors(x, {false, true}, gather), Error);  // no history
  Tensor y = matmul(x, w);
  EXPECT_THROW(autograd::gather_factors(y, {true}, gather), Error);          // one flag for two
  EXPECT_THROW(autograd::gather_factors(y, {true, false}, gather), Error);   // x needs no grad
  EXPECT_THROW(autograd::gather_factors(y, {false, false}, gather), Error);  // nothing marked
  EXPECT_THROW(autograd::gather_factors(y, {false, true}, nullptr), Error);  // no function
  Tensor s = softmax(y, -1);  // its backward reads its output
  EXPECT_THROW(autograd::gather_factors(s, {true}, gather), Error);
  // A gather that returns too few tensors is an error when the backward runs.
  autograd::gather_factors(y, {false, true}, [](const std::vector<autograd::Node::Factor>&) {
    return std::vector<Tensor>{};
  });
  try {
    sum(y).backward();
    FAIL() << "a gather returning no tensors was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the factor gather returned 0 tensors for 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hap
