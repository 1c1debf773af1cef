// Mixture-of-experts routing ops: slots follow GShard's order (every first choice before any
// second choice, token order within), choices past the capacity are dropped, dispatch and combine
// are each other's adjoints, gradients match finite differences, and bad routing is named.
#include <gtest/gtest.h>

#include <vector>

#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/op.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using test_util::error_of;

TensorOptions f64(bool requires_grad = false) {
  return TensorOptions{}.with_dtype(DType::F64).with_requires_grad(requires_grad);
}

Tensor ids(const std::vector<int64_t>& v, const Shape& s) { return Tensor::from_vector(v, s); }

TEST(MoeOps, SlotsGoToFirstChoicesFirstInTokenOrderAndOverflowIsDropped) {
  // One group of 4 tokens, 2 choices, 3 experts of capacity 2. Token rows are 10 t + 1.
  const Tensor x = Tensor::from_vector(std::vector<double>{1, 11, 21, 31}, {1, 4, 1}, f64());
  // First choices: 0, 0, 0, 1; second choices: 1, 2, 1, 0.
  const Tensor e = ids({0, 1, 0, 2, 0, 1, 1, 0}, {1, 4, 2});
  const std::vector<double> buf = moe_dispatch(x, e, Tensor(), 3, 2).to_vector();
  // Expert 0: tokens 0 and 1 (token 2's first choice and token 3's second are dropped);
  // expert 1: token 3 (first choice), then token 0 (second); token 2's second choice dropped;
  // expert 2: token 1 (second choice), one empty slot.
  EXPECT_EQ(buf, (std::vector<double>{1, 11, 31, 1, 11, 0}));
  // Combining with unit gates gives each token the sum of its kept choices: token 2 kept none.
  const std::vector<double> y =
      moe_combine(moe_dispatch(x, e, Tensor(), 3, 2), e, Tensor(), 3, 2).to_vector();
  EXPECT_EQ(y, (std::vector<double>{2, 22, 0, 31}));
  // Weighted dispatch scales each choice; gated combine weights each kept choice.
  const Tensor w =
      Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 4, 2}, f64());
  EXPECT_EQ(moe_dispatch(x, e, w, 3, 2).to_vector(), (std::vector<double>{1, 33, 217, 2, 44, 0}));
  const Tensor ones =
      Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {1, 3, 2, 1}, f64());
  // Token 0: expert 0 slot 0 (1) x 1 + expert 1 slot 1 (4) x 2; token 1: 2 x 3 + 5 x 4;
  // token 2: nothing kept; token 3: expert 1 slot 0 (3) x 7, its second choice dropped.
  EXPECT_EQ(moe_combine(ones, e, w, 3, 2).to_vector(), (std::vector<double>{9, 26, 0, 21}));
}

TEST(MoeOps, GroupsRouteAloneSoAGroupsSliceRoutesAsInTheWhole) {
  const int64_t G = 5, T = 6, C = 3, E = 4, k = 2, cap = 2;
  Tensor x = randn({G, T, C}, 1, 0, f64());
  std::vector<int64_t> v;
  for (double u : rand({G, T, k}, 2).to_vector()) v.push_back(static_cast<int64_t>(u * E) % E);
  Tensor e = ids(v, {G, T, k});
  const Tensor whole = moe_dispatch(x, e, Tensor(), E, cap);
  const Tensor part = moe_dispatch(slice(x, 0, 2, 4).contiguous(), slice(e, 0, 2, 4).contiguous(),
                                   Tensor(), E, cap);
  EXPECT_EQ(part.to_vector(), slice(whole, 0, 2, 4).contiguous().to_vector());
}

TEST(MoeOps, DispatchAndCombineAreAdjoint) {
  // <dispatch(x, w), b> = <x, combine(b, w)> for any x, b: combine is dispatch's transpose.
  const int64_t G = 3, T = 7, C = 4, E = 3, k = 2, cap = 3;
  Tensor x = randn({G, T, C}, 3, 0, f64()), b = randn({G, E, cap, C}, 4, 0, f64());
  Tensor w = randn({G, T, k}, 5, 0, f64());
  std::vector<int64_t> v;
  for (double u : rand({G, T, k}, 6).to_vector()) v.push_back(static_cast<int64_t>(u * E) % E);
  Tensor e = ids(v, {G, T, k});
  const double lhs = sum(moe_dispatch(x, e, w, E, cap) * b).item();
  const double rhs = sum(x * moe_combine(b, e, w, E, cap)).item();
  EXPECT_NEAR(lhs, rhs, 1e-12);
}

TEST(MoeOps, GradientsMatchFiniteDifferences) {
  const int64_t G = 2, T = 5, C = 3, E = 3, k = 2, cap = 2;
  std::vector<int64_t> v;
  for (double u : rand({G, T, k}, 7).to_vector()) v.push_back(static_cast<int64_t>(u * E) % E);
  const Tensor e = ids(v, {G, T, k});
  Tensor x = randn({G, T, C}, 8, 0, f64(true)), w = randn({G, T, k}, 9, 0, f64(true));
  Tensor b = randn({G, E, cap, C}, 10, 0, f64(true));
  auto check = [](const std::function<Tensor(const std::vector<Tensor>&)>& f,
                  const std::vector<Tensor>& in, const char* what) {
    autograd::GradcheckResult r = autograd::gradcheck(f, in);
    EXPECT_TRUE(r.ok) << what << ": " << r.message;
  };
  check([&](const std::vector<Tensor>& in) { return moe_dispatch(in[0], e, in[1], E, cap); },
        {x, w}, "moe_dispatch x, weights");
  check([&](const std::vector<Tensor>& in) { return moe_combine(in[0], e, in[1], E, cap); }, {b, w},
        "moe_combine buffers, gates");
  check(
      [&](const std::vector<Tensor>& in) {
        return ops::call1(ops::OpKind::MoeGateGrad, {in[0], in[1], e}, ops::MoeAttrs{E, cap});
      },
      {x, b}, "moe_gate_grad");
}

TEST(MoeOps, BadRoutingIsNamed) {
  Tensor x = randn({1, 2, 3}, 1);
  EXPECT_HAS(error_of([&] {
               moe_dispatch(x, ids({0, 5}, {1, 2, 1}), Tensor(), 4, 2);
             }),
             "expert id 5 at [0, 1, 0] is outside [0, 4)");
  EXPECT_HAS(error_of([&] {
               moe_dispatch(x, ids({0, 1, 2}, {1, 3, 1}), Tensor(), 4, 2);
             }),
             "expert ids must be i64 [G, T, k]");
  EXPECT_HAS(error_of([&] {
               moe_dispatch(x, ids({0, 1}, {1, 2, 1}), Tensor(), 4, 0);
             }),
             "capacity must be >= 1");
  EXPECT_HAS(error_of([&] {
               moe_combine(randn({1, 3, 2, 3}, 2), ids({0, 1}, {1, 2, 1}), Tensor(), 4, 2);
             }),
             "expert buffers must be [G, 4, 2, C]");
}

}  // namespace
}  // namespace hap
