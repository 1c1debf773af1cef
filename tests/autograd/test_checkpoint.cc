// autograd::checkpoint: recomputed functions give the gradients the recorded ones do, bit for bit
// (random ops and mixed precision included), keep nothing of their inside alive between forward
// and backward, run once more in backward, and refuse a tensor that needs a gradient but is not
// among their inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"

namespace hap {
namespace {

struct Mlp {
  Tensor w1, b1, w2;
  explicit Mlp(uint64_t seed) {
    w1 = randn({8, 16}, seed, 1).set_requires_grad(true);
    b1 = randn({16}, seed, 2).set_requires_grad(true);
    w2 = randn({16, 3}, seed, 3).set_requires_grad(true);
  }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

// A block with a random op: dropout of gelu(x w1 + b1), then a product.
std::vector<Tensor> block(const std::vector<Tensor>& in) {
  Tensor h = gelu(add(matmul(in[0], in[1]), in[2]));
  h = dropout(h, 0.25, /*training=*/true, /*seed=*/7, /*stream=*/3);
  return {matmul(h, in[3]), h};
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

// The same loss, recorded and recomputed: every gradient equal bit for bit, under f32 and under
// bf16 autocast, with both outputs used (one directly, one through the loss).
TEST(Checkpoint, GradientsEqualTheRecordedOnesBitForBit) {
  for (const bool bf16 : {false, true}) {
    std::vector<Tensor> grads[2];
    for (const bool recompute : {false, true}) {
      Mlp m(11);
      Tensor x = randn({4, 8}, 5, 0).set_requires_grad(true);
      Tensor loss;
      {
        ops::AutocastGuard precision(bf16 ? DType::BF16 : DType::F32);
        const std::vector<Tensor> in = {x, m.w1, m.b1, m.w2};
        const std::vector<Tensor> out = recompute ? autograd::checkpoint(block, in) : block(in);
        loss = add(sum(mul(out[0], out[0])), mean(out[1]).to(out[0].dtype()));
      }
      loss.backward();
      for (const Tensor& t : {x, m.w1, m.b1, m.w2}) grads[recompute].push_back(t.grad());
    }
    for (size_t i = 0; i < grads[0].size(); ++i)
      expect_same_bits(grads[1][i], grads[0][i],
                       std::string(bf16 ? "bf16" : "f32") + " gradient " + std::to_string(i));
  }
}

// Nothing the function computes inside is kept: its outputs carry one node (the checkpoint), and
// it runs exactly twice (forward, then backward's recomputation); under no_grad, once.
TEST(Checkpoint, KeepsNothingInsideAndRunsOnceMoreInBackward) {
  Mlp m(3);
  Tensor x = randn({4, 8}, 9, 0);
  int runs = 0;
  auto counted = [&](const std::vector<Tensor>& in) {
    ++runs;
    return block(in);
  };
  std::vector<Tensor> out = autograd::checkpoint(counted, {x, m.w1, m.b1, m.w2});
  EXPECT_EQ(runs, 1);
  ASSERT_NE(out[0].grad_fn(), nullptr);
  EXPECT_TRUE(out[0].grad_fn()->custom);
  EXPECT_EQ(std::string(out[0].grad_fn()->custom_name), "checkpoint");
  EXPECT_TRUE(out[0].grad_fn()->saved_inputs.empty() ||
              !out[0].grad_fn()->saved_inputs[0].defined());
  sum(out[0]).backward();
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(m.w1.grad().defined());
  EXPECT_FALSE(x.grad().defined());  // x needs no gradient
  {
    NoGradGuard no_grad;
    out = autograd::checkpoint(counted, {x, m.w1, m.b1, m.w2});
  }
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(out[0].grad_fn(), nullptr);
}

// A parameter read inside but not passed in would silently get no gradient: an error instead.
TEST(Checkpoint, AParameterThatIsNotAnInputIsAnError) {
  Mlp m(4);
  Tensor x = randn({4, 8}, 2, 0).set_requires_grad(true);
  auto hides_w2 = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{matmul(gelu(matmul(in[0], in[1])), m.w2)};
  };
  std::vector<Tensor> out = autograd::checkpoint(hides_w2, {x, m.w1});
  try {
    sum(out[0]).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not among its inputs"), std::string::npos) << e.what();
  }
}

// The engine's observer hears that a parameter used only inside a checkpoint is complete (the
// executor starts its gradient all-reduce then), once, after the recomputation gave it.
TEST(Checkpoint, TheObserverHearsOfParametersUsedInside) {
  struct Heard : autograd::BackwardObserver {
    std::vector<const TensorImpl*> leaves;
    void leaf_done(const Tensor& leaf) override { leaves.push_back(leaf.impl()); }
  } heard;
  Mlp m(5);
  Tensor x = randn({4, 8}, 1, 0);
  std::vector<Tensor> out = autograd::checkpoint(block, {x, m.w1, m.b1, m.w2});
  {
    autograd::ObserveBackward observe(&heard);
    sum(out[0]).backward();
  }
  for (const Tensor& p : m.params()) {
    EXPECT_EQ(std::count(heard.leaves.begin(), heard.leaves.end(), p.impl()), 1);
    EXPECT_TRUE(p.grad().defined());
  }
}

}  // namespace
}  // namespace hap
