// Autograd adjoints of the collectives: gradients through small distributed computations equal
// the single-device gradients (f64), under the convention of parallel/autograd_collectives.h
// (the gradient of a Replicated tensor is Partial, of Sharded(d) is Sharded(d), of Partial is
// Replicated).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "ops/functional.h"
#include "parallel/autograd_collectives.h"
#include "parallel_test_util.h"

namespace hap::parallel {
namespace {

namespace pf = hap::parallel::functional;
using testing::all_splits;
using testing::both_methods;
using testing::close_values;
using testing::logical_tensor;
using testing::ratios_for;
using testing::shape_with;
using testing::shard_of;
using testing::world;

constexpr double kTol = 1e-12;

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

Tensor f64(const Shape& shape, uint64_t seed, uint64_t stream = 0) {
  return logical_tensor(shape, DType::F64, seed, stream);
}

std::string case_name(int64_t dim, testing::Split s, CollectiveMethod m,
                      const std::vector<int64_t>& lengths) {
  return "dim " + std::to_string(dim) + " " + testing::split_name(s) + " " + method_name(m) +
         " lengths " + testing::lengths_str(lengths);
}

TEST(AllGatherGrad, IsTheReduceScatterOfThePartialOutputGradient) {
  // L = sum(all_gather(x)^2 * C): the gathered tensor is Replicated, so the loss goes through
  // to_partial before backward.
  const int n = world().size(), me = world().rank();
  uint64_t seed = 1000;
  for (int64_t dim : {0, 1, 2})
    for (testing::Split s : all_splits())
      for (CollectiveMethod m : both_methods()) {
        std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, s));
        SCOPED_TRACE(case_name(dim, s, m, lengths));
        Tensor X = f64(shape_with(dim, 7), ++seed), C = f64(shape_with(dim, 7), seed, 99);

        Tensor x = leaf(shard_of(X, dim, lengths, me));
        Tensor g = pf::all_gather(world(), x, dim, lengths, m);
        pf::to_partial(world(), sum(g * g * C)).backward();

        Tensor Xr = leaf(X.clone());
        sum(Xr * Xr * C).backward();
        EXPECT_TRUE(close_values(x.grad(), shard_of(Xr.grad(), dim, lengths, me), kTol));
      }
}

TEST(ReplicatedLoss, SeededOnEveryRankCountsEveryRanksCopy) {
  // Pins the convention down: a Replicated loss is Partial-seeded by to_partial; seeding 1 on
  // every rank instead scales the gradient by the number of ranks.
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, testing::Split::Uneven));
  Tensor X = f64({7, 3}, 1100);
  Tensor x = leaf(shard_of(X, 0, lengths, me));
  Tensor g = pf::all_gather(world(), x, 0, lengths, CollectiveMethod::Grouped);
  sum(g * g).backward();
  EXPECT_TRUE(close_values(x.grad(), shard_of(X * (2.0 * n), 0, lengths, me), kTol));
}

TEST(ReduceScatterGrad, IsTheAllGatherOfTheShardedOutputGradient) {
  // Every rank holds an addend X_r of S = sum_r X_r; L = sum_r sum(z_r^2 * C_r) with z the
  // reduce-scattered S: a Partial loss, seeded with 1 on every rank. dL/dX_r = 2 S C on every rank.
  const int n = world().size(), me = world().rank();
  uint64_t seed = 1200;
  for (int64_t dim : {0, 1, 2})
    for (testing::Split s : all_splits())
      for (CollectiveMethod m : both_methods()) {
        std::vector<int64_t> lengths = shard_lengths(11, ratios_for(n, s));
        SCOPED_TRACE(case_name(dim, s, m, lengths));
        ++seed;
        Shape shape = shape_with(dim, 11);
        Tensor C = f64(shape, seed, 99);
        std::vector<Tensor> addends;
        for (int r = 0; r < n; ++r) addends.push_back(leaf(f64(shape, seed, r)));

        Tensor x = leaf(addends[me].detach().clone());
        Tensor z = pf::reduce_scatter(world(), x, dim, lengths, m);
        sum(z * z * shard_of(C, dim, lengths, me)).backward();

        Tensor S = addends[0];
        for (int r = 1; r < n; ++r) S = S + addends[r];
        sum(S * S * C).backward();
        EXPECT_TRUE(close_values(x.grad(), addends[me].grad(), kTol));
      }
}

TEST(AllReduceGrad, IsTheAllReduceOfThePartialOutputGradient) {
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(11, ratios_for(n, testing::Split::Uneven));
  for (CollectiveMethod m : both_methods()) {
    SCOPED_TRACE(method_name(m));
    Shape shape = {11, 3};
    Tensor C = f64(shape, 1300, 99);
    std::vector<Tensor> addends;
    for (int r = 0; r < n; ++r) addends.push_back(leaf(f64(shape, 1300, r)));
    Tensor S = addends[0];
    for (int r = 1; r < n; ++r) S = S + addends[r];

    // (a) Replicated compute after the all-reduce: L = sum(Y^3), Y = sum_r X_r.
    Tensor x = leaf(addends[me].detach().clone());
    Tensor y = pf::all_reduce(world(), x, m);
    pf::to_partial(world(), sum(y * y * y)).backward();
    sum(S * S * S).backward();
    EXPECT_TRUE(close_values(x.grad(), addends[me].grad(), kTol));

    // (b) Sharded compute after the all-reduce: each rank uses only its slice of Y, so the
    // gradient reaching the all-reduce differs per rank and must be summed.
    for (Tensor& a : addends) a.zero_grad();
    Tensor x2 = leaf(addends[me].detach().clone());
    Tensor y2 = pf::all_reduce(world(), x2, m);
    Tensor ys = pf::shard_slice(world(), y2, 0, lengths);
    sum(ys * ys * shard_of(C, 0, lengths, me)).backward();
    sum(S * S * C).backward();
    EXPECT_TRUE(close_values(x2.grad(), addends[me].grad(), kTol));
  }
}

TEST(AllToAllGrad, IsTheReverseAllToAll) {
  const int n = world().size(), me = world().rank();
  uint64_t seed = 1400;
  for (auto [split_dim, concat_dim] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {2, 0}})
    for (testing::Split s : all_splits())
      for (CollectiveMethod m : both_methods()) {
        Shape shape = {3, 4, 5};
        shape[split_dim] = 7;
        shape[concat_dim] = 11;
        std::vector<int64_t> ls = shard_lengths(7, ratios_for(n, s));
        std::vector<int64_t> lc = shard_lengths(11, ratios_for(n, testing::Split::Uneven));
        SCOPED_TRACE(std::string("split ") + std::to_string(split_dim) + " concat " +
                     std::to_string(concat_dim) + " " + case_name(split_dim, s, m, ls));
        Tensor X = f64(shape, ++seed), C = f64(shape, seed, 99);

        Tensor x = leaf(shard_of(X, concat_dim, lc, me));
        Tensor y = pf::all_to_all(world(), x, split_dim, concat_dim, ls, lc, m);
        sum(y * y * shard_of(C, split_dim, ls, me)).backward();  // Partial loss

        Tensor Xr = leaf(X.clone());
        sum(Xr * Xr * C).backward();
        EXPECT_TRUE(close_values(x.grad(), shard_of(Xr.grad(), concat_dim, lc, me), kTol));
      }
}

TEST(ShardSliceGrad, EmbedsTheSliceGradientInZerosWithoutCommunication) {
  const int n = world().size(), me = world().rank();
  for (int64_t dim : {0, 2})
    for (testing::Split s : all_splits()) {
      std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, s));
      SCOPED_TRACE(case_name(dim, s, CollectiveMethod::Grouped, lengths));
      Shape shape = shape_with(dim, 7);
      Tensor X = f64(shape, 1500 + dim), C = f64(shape, 1500 + dim, 99);

      Tensor x = leaf(X.clone());  // Replicated
      Tensor y = pf::shard_slice(world(), x, dim, lengths);
      sum(y * y * shard_of(C, dim, lengths, me)).backward();  // Partial loss

      Tensor Xr = leaf(X.clone());
      sum(Xr * Xr * C).backward();
      // Locally: this rank's slice of the gradient, zeros elsewhere (a Partial gradient) ...
      Tensor expected_local = Tensor::zeros(shape, TensorOptions{}.with_dtype(DType::F64));
      ShardSpec(dim, lengths)
          .slice_of(expected_local, me)
          .copy_from(shard_of(Xr.grad(), dim, lengths, me));
      EXPECT_TRUE(close_values(x.grad(), expected_local, kTol));
      // ... whose sum over ranks is the full gradient.
      EXPECT_TRUE(close_values(all_reduce(world(), x.grad()), Xr.grad(), kTol));
    }
}

TEST(ReplicateGrad, GivesEveryRankTheFullParameterGradient) {
  // Data parallelism with uneven batch shards: y_r = x_r W, L = sum_r sum(y_r^2) / B.
  const int n = world().size(), me = world().rank();
  for (testing::Split s : all_splits())
    for (CollectiveMethod m : both_methods()) {
      std::vector<int64_t> lengths = shard_lengths(11, ratios_for(n, s));
      SCOPED_TRACE(case_name(0, s, m, lengths));
      Tensor X = f64({11, 4}, 1600), Wl = f64({4, 3}, 1601);

      Tensor W = leaf(Wl.clone());
      Tensor y = matmul(shard_of(X, 0, lengths, me), pf::replicate(world(), W, m));
      (sum(y * y) / 11.0).backward();

      Tensor Wr = leaf(Wl.clone());
      Tensor yr = matmul(X, Wr);
      (sum(yr * yr) / 11.0).backward();
      EXPECT_TRUE(close_values(W.grad(), Wr.grad(), kTol));
      // Identical bits on every rank, so replicas stay identical after the optimizer step.
      EXPECT_TRUE(testing::same_values(broadcast(world(), W.grad(), 0), W.grad()));
    }
}

TEST(DistributedMlp, TensorParallelGradientsMatchSingleDevice) {
  // Megatron-style MLP: X Replicated; W1 [H, C] Sharded(0) (column parallel) -> h Sharded(1);
  // W2 [O, H] Sharded(1) (row parallel) -> Partial; the Replicated bias b2 joins through
  // to_partial; all_reduce -> Replicated; a Replicated loss through to_partial.
  // Only uneven splits without empty shards: linear's backward cannot yet take a zero-width
  // input (reshape to [-1, 0] in ops/defs/matmul.cc).
  const int n = world().size(), me = world().rank();
  const int64_t B = 5, C = 4, H = 11, O = 3;
  for (testing::Split s : {testing::Split::Uneven})
    for (CollectiveMethod m : both_methods()) {
      std::vector<int64_t> lh = shard_lengths(H, ratios_for(n, s));
      SCOPED_TRACE(case_name(0, s, m, lh));
      Tensor Xl = f64({B, C}, 1700), W1l = f64({H, C}, 1701), b1l = f64({H}, 1702),
             W2l = f64({O, H}, 1703), b2l = f64({O}, 1704);

      Tensor X = leaf(Xl.clone());
      Tensor W1 = leaf(shard_of(W1l, 0, lh, me)), b1 = leaf(shard_of(b1l, 0, lh, me));
      Tensor W2 = leaf(shard_of(W2l, 1, lh, me));
      Tensor b2 = leaf(b2l.clone());
      Tensor h = gelu(linear(X, W1, b1));  // [B, H_r] Sharded(1)
      Tensor yp =
          linear(h, W2) + pf::to_partial(world(), pf::replicate(world(), b2, m));  // Partial
      Tensor y = pf::all_reduce(world(), yp, m);                                   // Replicated
      pf::to_partial(world(), mean(y * y)).backward();

      Tensor Xr = leaf(Xl.clone()), W1r = leaf(W1l.clone()), b1r = leaf(b1l.clone()),
             W2r = leaf(W2l.clone()), b2r = leaf(b2l.clone());
      Tensor yr = linear(gelu(linear(Xr, W1r, b1r)), W2r, b2r);
      mean(yr * yr).backward();

      EXPECT_TRUE(close_values(W1.grad(), shard_of(W1r.grad(), 0, lh, me), kTol));
      EXPECT_TRUE(close_values(b1.grad(), shard_of(b1r.grad(), 0, lh, me), kTol));
      EXPECT_TRUE(close_values(W2.grad(), shard_of(W2r.grad(), 1, lh, me), kTol));
      EXPECT_TRUE(close_values(b2.grad(), b2r.grad(), kTol));  // replicate(): full
      EXPECT_TRUE(close_values(all_reduce(world(), X.grad()), Xr.grad(), kTol));  // Partial
    }
}

TEST(DistributedMlp, SequenceParallelGradientsMatchSingleDevice) {
  // Row-parallel output reduce-scattered over tokens, a token-wise op on the shard, then
  // all-gathered: y = all_gather(gelu(reduce_scatter(h W2^T))).
  const int n = world().size(), me = world().rank();
  const int64_t T = 7, H = 11, O = 3;
  for (testing::Split s : all_splits())
    for (CollectiveMethod m : both_methods()) {
      std::vector<int64_t> lh = shard_lengths(H, ratios_for(n, testing::Split::Uneven));
      std::vector<int64_t> lt = shard_lengths(T, ratios_for(n, s));
      SCOPED_TRACE(case_name(0, s, m, lt));
      Tensor Hl = f64({T, H}, 1800), W2l = f64({O, H}, 1801);

      Tensor h = leaf(shard_of(Hl, 1, lh, me));                     // Sharded(1)
      Tensor W2 = leaf(shard_of(W2l, 1, lh, me));                   // Sharded(1)
      Tensor yp = linear(h, W2);                                    // Partial [T, O]
      Tensor ys = gelu(pf::reduce_scatter(world(), yp, 0, lt, m));  // Sharded(0)
      Tensor y = pf::all_gather(world(), ys, 0, lt, m);             // Replicated
      pf::to_partial(world(), sum(y * y)).backward();

      Tensor Hr = leaf(Hl.clone()), W2r = leaf(W2l.clone());
      Tensor yr = gelu(linear(Hr, W2r));
      sum(yr * yr).backward();
      EXPECT_TRUE(close_values(h.grad(), shard_of(Hr.grad(), 1, lh, me), kTol));
      EXPECT_TRUE(close_values(W2.grad(), shard_of(W2r.grad(), 1, lh, me), kTol));
    }
}

TEST(CollectiveGrads, FlowForBf16AndF32) {
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, testing::Split::Uneven));
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor X = logical_tensor({7, 2}, dt, 1900);
    Tensor x = leaf(shard_of(X, 0, lengths, me));
    Tensor g = pf::all_gather(world(), x, 0, lengths, CollectiveMethod::Padded);
    pf::to_partial(world(), sum(g * 3.0)).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().dtype(), dt);
    EXPECT_TRUE(
        close_values(x.grad(), Tensor::full(x.shape(), 3.0, TensorOptions{}.with_dtype(dt)), 0));
  }
}

TEST(CollectiveGrads, AreNotRecordedWithoutRequiresGrad) {
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, testing::Split::Uneven));
  Tensor x = shard_of(f64({7, 2}, 2000), 0, lengths, me);
  Tensor g = pf::all_gather(world(), x, 0, lengths, CollectiveMethod::Grouped);
  EXPECT_FALSE(g.requires_grad());
}

}  // namespace
}  // namespace hap::parallel
