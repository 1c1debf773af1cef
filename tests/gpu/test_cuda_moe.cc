// The mixture-of-experts routing ops on a GPU against the CPU (ops/cuda/moe.cu): GShard slots per
// group with capacities that drop choices and capacities that keep all, top-1, top-2 and top-3
// routing, with and without weights, packed operands and strided views, empty shapes, and the
// CPU's errors for bad expert ids. Each test skips without a visible GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "ops/dispatch.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

// A tensor of shape s made by gen: packed, or (view) a view of a packed block whose last two
// dims are swapped, so that its last dim is strided.
template <typename Gen>
Tensor laid_out(const Shape& s, bool view, Gen gen) {
  if (!view) return gen(s);
  const size_t n = s.size();
  Shape swapped = s;
  std::swap(swapped[n - 2], swapped[n - 1]);
  const Tensor block = gen(swapped);
  Strides st = block.strides();
  std::swap(st[n - 2], st[n - 1]);
  return block.as_strided(s, st, 0);
}

// Expert ids uniform over [0, experts), of shape s (packed).
Tensor random_ids(const Shape& s, int64_t experts, uint64_t seed) {
  std::vector<int64_t> v;
  for (double u : rand(s, seed).to_vector())
    v.push_back(static_cast<int64_t>(u * static_cast<double>(experts)) % experts);
  return Tensor::from_vector(v, s);
}

// Whether some choice of ids [G, T, k] finds its expert full in its group: more choices of one
// expert in one group than the capacity.
bool drops_some(const Tensor& ids, int64_t experts, int64_t capacity) {
  const std::vector<double> v = ids.to_vector();
  const int64_t G = ids.size(0), per_group = ids.size(1) * ids.size(2);
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> count(static_cast<size_t>(experts));
    for (int64_t i = 0; i < per_group; ++i)
      if (++count[static_cast<size_t>(v[static_cast<size_t>(g * per_group + i)])] > capacity)
        return true;
  }
  return false;
}

// |t|, packed on the host.
Tensor abs_of(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  for (double& e : v) e = std::abs(e);
  return Tensor::from_vector(v, t.shape(), f64()).to(t.dtype());
}

double max_of(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
}

// gamma_n = n u / (1 - n u): a sum of n products computed in any order, each step fused into an
// FMA or not, is within gamma_n sum |products| of the exact value (Higham, Accuracy and Stability,
// 3.1), so two such computations are within 2 gamma_n sum |products| of each other.
double gamma_n(int64_t n, DType d) {
  const double u = d == DType::F64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24);
  return static_cast<double>(n) * u / (1.0 - static_cast<double>(n) * u);
}

Tensor gpu(const Tensor& t) { return t.defined() ? same_view_on_gpu(t) : Tensor(); }

struct RoutingCase {
  int64_t groups, tokens, features, experts, k, capacity;
  bool drops;  // whether the capacity drops some choice
};

std::string label(const RoutingCase& r, bool view) {
  return "G=" + std::to_string(r.groups) + " T=" + std::to_string(r.tokens) +
         " C=" + std::to_string(r.features) + " E=" + std::to_string(r.experts) +
         " k=" + std::to_string(r.k) + " cap=" + std::to_string(r.capacity) +
         (r.drops ? " (drops)" : " (keeps all)") + (view ? " strided views" : " packed");
}

TEST(CudaMoe, DispatchCombineAndGateGradRouteAsTheCpuDoes) {
  HAP_REQUIRE_GPU();
  // Capacities below T k / E drop choices; a capacity of T k keeps every choice whatever the ids.
  // Sizes that are not multiples of 32, and a case bigger than a block of threads.
  const std::vector<RoutingCase> cases = {
      {1, 7, 5, 3, 1, 2, true},  {3, 9, 13, 4, 2, 2, true},   {4, 6, 33, 3, 2, 12, false},
      {2, 5, 8, 4, 1, 5, false}, {5, 40, 37, 8, 2, 6, true},  {2, 11, 3, 5, 3, 33, false},
      {3, 10, 6, 4, 3, 3, true}, {1, 300, 17, 6, 2, 64, true}};
  uint64_t seed = 100;
  for (DType d : {DType::F32, DType::F64}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const RoutingCase& r = cases[ci];
      const bool view = ci % 2 == 1;
      SCOPED_TRACE(std::string(dtype_name(d)) + " " + label(r, view));
      const int64_t G = r.groups, T = r.tokens, C = r.features, E = r.experts, k = r.k;
      auto normal = [&](const Shape& s) { return randn(s, seed++, 0, f64()).to(d); };
      const Tensor x = laid_out({G, T, C}, view, normal);
      const Tensor w = laid_out({G, T, k}, view, normal);
      const Tensor b = laid_out({G, E, r.capacity, C}, view, normal);
      const Tensor ids =
          laid_out({G, T, k}, view, [&](const Shape& s) { return random_ids(s, E, seed++); });
      ASSERT_EQ(drops_some(ids, E, r.capacity), r.drops) << "the case's ids do not fit its label";
      const ops::MoeAttrs a{E, r.capacity};

      for (bool weighted : {false, true}) {
        SCOPED_TRACE(weighted ? "weighted" : "unweighted");
        const Tensor wc = weighted ? w : Tensor();
        // Dispatch only moves w x (one rounded product) or x into slots: exact.
        expect_equal(ops::call1(OpKind::MoeDispatch, {gpu(x), gpu(ids), gpu(wc)}, a),
                     ops::call1(OpKind::MoeDispatch, {x, ids, wc}, a), "moe_dispatch");
        // Combine adds the kept choices in choice order from 0 on both. Unweighted, each term is
        // 1 * buf (exact, fused or not), and with one choice the only sum is 0 + (the rounded
        // product): exact. Weighted with k >= 2, the CPU's build (-march=native) and nvcc may
        // differ in contracting gate * buf + acc into an FMA: within 2 gamma_k sum |gate buf|.
        const Tensor got = ops::call1(OpKind::MoeCombine, {gpu(b), gpu(ids), gpu(wc)}, a);
        const Tensor want = ops::call1(OpKind::MoeCombine, {b, ids, wc}, a);
        if (!weighted || k == 1) {
          expect_equal(got, want, "moe_combine");
        } else {
          const double bound =
              max_of(ops::call1(OpKind::MoeCombine, {abs_of(b), ids, abs_of(w)}, a));
          expect_close(got, want, 0.0, 2.02 * gamma_n(k, d) * bound, "moe_combine");
        }
      }
      // The gate gradient's dot products run over the features in order on both, but may differ
      // in FMA contraction as above: within 2 gamma_C sum |a buf| (0 exactly for dropped choices).
      const double bound = max_of(ops::call1(OpKind::MoeGateGrad, {abs_of(x), abs_of(b), ids}, a));
      expect_close(ops::call1(OpKind::MoeGateGrad, {gpu(x), gpu(b), gpu(ids)}, a),
                   ops::call1(OpKind::MoeGateGrad, {x, b, ids}, a), 0.0,
                   2.02 * gamma_n(C, d) * bound, "moe_gate_grad");
    }
  }
}

TEST(CudaMoe, SlotsFollowTheGShardOrderOnTheGpu) {
  HAP_REQUIRE_GPU();
  // The CPU test's example (tests/ops/test_moe_ops.cc): one group of 4 tokens, 2 choices, 3
  // experts of capacity 2; first choices 0, 0, 0, 1, second choices 1, 2, 1, 0.
  const Tensor x =
      Tensor::from_vector(std::vector<double>{1, 11, 21, 31}, {1, 4, 1}, f64()).to(kGpu);
  const Tensor e = Tensor::from_vector(std::vector<int64_t>{0, 1, 0, 2, 0, 1, 1, 0}, {1, 4, 2});
  const Tensor eg = e.to(kGpu);
  const ops::MoeAttrs a{3, 2};
  const Tensor buf = ops::call1(OpKind::MoeDispatch, {x, eg, Tensor()}, a);
  EXPECT_EQ(buf.to(Device::cpu()).to_vector(), (std::vector<double>{1, 11, 31, 1, 11, 0}));
  EXPECT_EQ(ops::call1(OpKind::MoeCombine, {buf, eg, Tensor()}, a).to(Device::cpu()).to_vector(),
            (std::vector<double>{2, 22, 0, 31}));
  const Tensor w =
      Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {1, 4, 2}, f64()).to(kGpu);
  EXPECT_EQ(ops::call1(OpKind::MoeDispatch, {x, eg, w}, a).to(Device::cpu()).to_vector(),
            (std::vector<double>{1, 33, 217, 2, 44, 0}));
  // Gate gradient: token 0 (1) against expert 0 slot 0 (1) and expert 1 slot 1 (1); token 2's
  // choices and token 3's second are dropped (0).
  EXPECT_EQ(ops::call1(OpKind::MoeGateGrad, {x, buf, eg}, a).to(Device::cpu()).to_vector(),
            (std::vector<double>{1, 1, 121, 121, 0, 0, 961, 0}));
}

TEST(CudaMoe, EmptyShapesGiveTheCpusResults) {
  HAP_REQUIRE_GPU();
  const int64_t E = 3, cap = 2;
  const ops::MoeAttrs a{E, cap};
  // No tokens, no features, no choices: outputs of zeros or of no elements.
  for (const Shape& s :
       std::vector<Shape>{{2, 0, 4, 2}, {2, 5, 0, 2}, {2, 5, 4, 0}, {0, 5, 4, 2}}) {
    const int64_t G = s[0], T = s[1], C = s[2], k = s[3];
    SCOPED_TRACE("G=" + std::to_string(G) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                 " k=" + std::to_string(k));
    const Tensor x = randn({G, T, C}, 1, 0, f64()), w = randn({G, T, k}, 2, 0, f64());
    const Tensor b = randn({G, E, cap, C}, 3, 0, f64()), ids = random_ids({G, T, k}, E, 4);
    expect_equal(ops::call1(OpKind::MoeDispatch, {gpu(x), gpu(ids), gpu(w)}, a),
                 ops::call1(OpKind::MoeDispatch, {x, ids, w}, a), "moe_dispatch");
    expect_equal(ops::call1(OpKind::MoeCombine, {gpu(b), gpu(ids), gpu(w)}, a),
                 ops::call1(OpKind::MoeCombine, {b, ids, w}, a), "moe_combine");
    expect_equal(ops::call1(OpKind::MoeGateGrad, {gpu(x), gpu(b), gpu(ids)}, a),
                 ops::call1(OpKind::MoeGateGrad, {x, b, ids}, a), "moe_gate_grad");
  }
}

TEST(CudaMoe, BadExpertIdsRaiseTheCpusError) {
  HAP_REQUIRE_GPU();
  using test_util::error_of;
  // The slots are scanned first choices first: token 1's first choice (9) is reported before
  // token 0's second (7), which comes first in memory.
  const Tensor ids = Tensor::from_vector(std::vector<int64_t>{0, 7, 9, 0}, {1, 2, 2});
  const Tensor x = randn({1, 2, 3}, 5), b = randn({1, 4, 2, 3}, 6);
  const ops::MoeAttrs a{4, 2};
  const std::string dispatch_cpu = error_of([&] {
    ops::call1(OpKind::MoeDispatch, {x, ids, Tensor()}, a);
  });
  EXPECT_HAS(dispatch_cpu, "moe_dispatch: expert id 9 at [0, 1, 0] is outside [0, 4)");
  EXPECT_EQ(error_of([&] {
              ops::call1(OpKind::MoeDispatch, {gpu(x), gpu(ids), Tensor()}, a);
            }),
            dispatch_cpu);
  EXPECT_EQ(error_of([&] {
              ops::call1(OpKind::MoeCombine, {gpu(b), gpu(ids), Tensor()}, a);
            }),
            error_of([&] {
              ops::call1(OpKind::MoeCombine, {b, ids, Tensor()}, a);
            }));
  EXPECT_EQ(error_of([&] {
              ops::call1(OpKind::MoeGateGrad, {gpu(x), gpu(b), gpu(ids)}, a);
            }),
            error_of([&] {
              ops::call1(OpKind::MoeGateGrad, {x, b, ids}, a);
            }));
  const Tensor negative = Tensor::from_vector(std::vector<int64_t>{0, -1}, {1, 2, 1});
  EXPECT_HAS(error_of([&] {
               ops::call1(OpKind::MoeDispatch, {gpu(x), gpu(negative), Tensor()}, a);
             }),
             "moe_dispatch: expert id -1 at [0, 1, 0] is outside [0, 4)");
}

}  // namespace
}  // namespace hap
