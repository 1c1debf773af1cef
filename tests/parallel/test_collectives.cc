// Uneven collectives against single-process references: every collective, both methods, f32,
// f64 and bf16, dims 0/1/2, sizes that do not divide (7, 11), fewer elements than ranks, a
// zero-length shard, everything on one rank, and non-contiguous inputs. Sums must equal the
// rank-order left fold bitwise (the determinism contract), so comparisons are exact.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/collectives.h"
#include "parallel_test_util.h"

namespace hap::parallel {
namespace {

using testing::all_splits;
using testing::both_methods;
using testing::logical_tensor;
using testing::ratios_for;
using testing::same_values;
using testing::shape_with;
using testing::shard_of;
using testing::world;

const std::vector<int64_t> kSizes = {7, 11, 1, 0};

std::string case_name(const char* what, DType dt, int64_t dim, int64_t size, testing::Split s,
                      CollectiveMethod m, const std::vector<int64_t>& lengths) {
  return std::string(what) + " " + dtype_name(dt) + " dim " + std::to_string(dim) + " size " +
         std::to_string(size) + " " + testing::split_name(s) + " " + method_name(m) + " lengths " +
         testing::lengths_str(lengths);
}

TEST(AllGather, ReassemblesTheLogicalTensorOnEveryRank) {
  const int n = world().size(), me = world().rank();
  uint64_t seed = 0;
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I64})
    for (int64_t dim : {0, 1, 2})
      for (int64_t size : kSizes)
        for (testing::Split s : all_splits())
          for (CollectiveMethod m : both_methods()) {
            std::vector<int64_t> lengths = shard_lengths(size, ratios_for(n, s));
            SCOPED_TRACE(case_name("all_gather", dt, dim, size, s, m, lengths));
            Tensor full = logical_tensor(shape_with(dim, size), dt, ++seed);
            Tensor got = all_gather(world(), shard_of(full, dim, lengths, me), dim, lengths, m);
            EXPECT_TRUE(same_values(got, full));
          }
}

TEST(ReduceScatter, GivesEachRankItsSliceOfTheRankOrderSumBitwise) {
  const int n = world().size(), me = world().rank();
  uint64_t seed = 100;
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (int64_t dim : {0, 1, 2})
      for (int64_t size : kSizes)
        for (testing::Split s : all_splits())
          for (CollectiveMethod m : both_methods()) {
            std::vector<int64_t> lengths = shard_lengths(size, ratios_for(n, s));
            SCOPED_TRACE(case_name("reduce_scatter", dt, dim, size, s, m, lengths));
            ++seed;
            std::vector<Tensor> addends;  // every rank's addend, rebuilt everywhere
            for (int r = 0; r < n; ++r)
              addends.push_back(logical_tensor(shape_with(dim, size), dt, seed, r));
            Tensor expected = shard_of(testing::rank_order_sum(addends), dim, lengths, me);
            Tensor got = reduce_scatter(world(), addends[me], dim, lengths, m);
            EXPECT_TRUE(same_values(got, expected));
          }
}

TEST(AllReduce, GivesEveryRankTheRankOrderSumBitwise) {
  const int n = world().size(), me = world().rank();
  uint64_t seed = 200;
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I64})
    for (Shape shape : {Shape{}, Shape{1}, Shape{0, 3}, Shape{3, 5}, Shape{2, 3, 7}})
      for (CollectiveMethod m : both_methods()) {
        SCOPED_TRACE(std::string("all_reduce ") + dtype_name(dt) + " " + shape_str(shape) + " " +
                     method_name(m));
        ++seed;
        std::vector<Tensor> addends;
        for (int r = 0; r < n; ++r) {
          Tensor a = logical_tensor(shape, DType::F64, seed, r);
          addends.push_back(dt == DType::I64 ? a.to(DType::F64).to(DType::I64) : a.to(dt));
        }
        Tensor got = all_reduce(world(), addends[me], m);
        EXPECT_TRUE(same_values(got, testing::rank_order_sum(addends)));
      }
}

TEST(AllReduce, SumsBf16InF32AndRoundsOnce) {
  // 256 + 1 + 1 (+ 1 ...): bf16 has 8 significant bits, so rounding after every addition would
  // stay at 256; one rounding of the f32 sum does not.
  const int n = world().size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks";
  double mine = world().rank() == 0 ? 256.0 : 1.0;
  Tensor x = Tensor::full({4}, mine, TensorOptions{}.with_dtype(DType::BF16));
  Tensor got = all_reduce(world(), x, CollectiveMethod::Grouped);
  EXPECT_EQ(got.item_at(0), static_cast<double>(static_cast<float>(bf16(256.0f + (n - 1)))));
  EXPECT_GT(got.item_at(0), 256.0);
}

TEST(AllToAll, MovesShardingFromTheConcatDimToTheSplitDim) {
  const int n = world().size(), me = world().rank();
  uint64_t seed = 300;
  const std::vector<std::pair<int64_t, int64_t>> dim_pairs = {{0, 1}, {1, 0}, {0, 2}, {2, 1}};
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (auto [split_dim, concat_dim] : dim_pairs)
      for (testing::Split s : all_splits())
        for (CollectiveMethod m : both_methods()) {
          Shape shape = {3, 4, 5};
          shape[split_dim] = 7;
          shape[concat_dim] = 11;
          std::vector<int64_t> ls = shard_lengths(7, ratios_for(n, s));
          std::vector<int64_t> lc = shard_lengths(11, ratios_for(n, testing::Split::Uneven));
          SCOPED_TRACE(std::string("all_to_all ") + dtype_name(dt) + " split " +
                       std::to_string(split_dim) + " " + testing::lengths_str(ls) + " concat " +
                       std::to_string(concat_dim) + " " + testing::lengths_str(lc) + " " +
                       method_name(m));
          Tensor full = logical_tensor(shape, dt, ++seed);
          Tensor got = all_to_all(world(), shard_of(full, concat_dim, lc, me), split_dim,
                                  concat_dim, ls, lc, m);
          EXPECT_TRUE(same_values(got, shard_of(full, split_dim, ls, me)));
          // And back again: the reverse all-to-all restores the input.
          Tensor back = all_to_all(world(), got, concat_dim, split_dim, lc, ls, m);
          EXPECT_TRUE(same_values(back, shard_of(full, concat_dim, lc, me)));
        }
}

TEST(Collectives, AcceptNonContiguousInputs) {
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, testing::Split::Uneven));
  for (CollectiveMethod m : both_methods()) {
    // The logical tensor [7, 6] is the transpose of a [6, 7] buffer; shards along dim 0 are
    // strided views.
    Tensor base = logical_tensor({6, 7}, DType::F32, 400);
    Tensor full = base.as_strided({7, 6}, {1, 7}, 0);
    Tensor got = all_gather(world(), ShardSpec(0, lengths).slice_of(full, me), 0, lengths, m);
    EXPECT_TRUE(same_values(got, full.clone()));

    std::vector<Tensor> addends;
    for (int r = 0; r < n; ++r) {
      Tensor b = logical_tensor({6, 7}, DType::F32, 401, r);
      addends.push_back(b.as_strided({7, 6}, {1, 7}, 0));
    }
    Tensor rs = reduce_scatter(world(), addends[me], 0, lengths, m);
    EXPECT_TRUE(same_values(rs, shard_of(testing::rank_order_sum(addends), 0, lengths, me)));
  }
}

TEST(Collectives, AreBitwiseRepeatable) {
  const int n = world().size(), me = world().rank();
  std::vector<int64_t> lengths = shard_lengths(11, ratios_for(n, testing::Split::Uneven));
  Tensor x = logical_tensor({3, 11, 4}, DType::F32, 500, me);
  for (CollectiveMethod m : both_methods()) {
    Tensor a = reduce_scatter(world(), x, 1, lengths, m);
    Tensor b = reduce_scatter(world(), x, 1, lengths, m);
    EXPECT_TRUE(same_values(a, b));
    Tensor c = all_reduce(world(), x, m);
    EXPECT_TRUE(same_values(c, all_reduce(world(), x, m)));
  }
}

TEST(Broadcast, DeliversTheRootsTensorFromAnyRoot) {
  const int n = world().size(), me = world().rank();
  for (int root = 0; root < n; ++root)
    for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
      Tensor full = logical_tensor({2, 5}, DType::F64, 600 + root).to(dt);
      // Non-roots pass nothing, or a tensor of the right shape with other values.
      Tensor mine =
          me == root ? full
                     : (me % 2 ? Tensor() : Tensor::zeros({2, 5}, TensorOptions{}.with_dtype(dt)));
      EXPECT_TRUE(same_values(broadcast(world(), mine, root), full));
    }
  // Zero elements and scalars.
  Tensor empty = me == 0 ? Tensor::empty({0, 4}) : Tensor();
  EXPECT_EQ(broadcast(world(), empty, 0).shape(), (Shape{0, 4}));
  Tensor scalar = me == 0 ? Tensor::scalar(3.5) : Tensor();
  EXPECT_EQ(broadcast(world(), scalar, 0).item(), 3.5);
}

TEST(Broadcast, ARankWithAMismatchedTensorThrowsWithoutHangingTheRoot) {
  const int n = world().size(), me = world().rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  Tensor mine = me == 0 ? Tensor::zeros({2, 5}) : Tensor::zeros({5, 2});
  if (me == 0) {
    EXPECT_EQ(broadcast(world(), mine, 0).shape(), (Shape{2, 5}));
  } else {
    std::string m = testing::error_of([&] { broadcast(world(), mine, 0); });
    EXPECT_HAS(m, "broadcast: rank " + std::to_string(me) + " passed f32[5, 2]");
    EXPECT_HAS(m, "f32[2, 5]");
  }
  // A bad root tensor makes every rank throw.
  Tensor bad = me == 0 ? Tensor::meta({2}, DType::F32) : Tensor();
  std::string m = testing::error_of([&] { broadcast(world(), bad, 0); });
  EXPECT_HAS(m, me == 0 ? "no storage" : "root rank 0's tensor is unusable");
}

TEST(Collectives, RejectBadArgumentsOnEveryRankAlike) {
  const int n = world().size();
  const CollectiveMethod g = CollectiveMethod::Grouped;
  std::vector<int64_t> too_many(static_cast<size_t>(n + 1), 1);
  EXPECT_HAS(testing::error_of([&] {
               all_gather(world(), Tensor::zeros({1, 2}), 0, too_many, g);
             }),
             "expected one per rank");
  std::vector<int64_t> lengths = shard_lengths(7, ratios_for(n, testing::Split::Uneven));
  EXPECT_HAS(testing::error_of([&] {
               reduce_scatter(world(), Tensor::zeros({8, 2}), 0, lengths, g);
             }),
             "sum to 7");
  EXPECT_HAS(testing::error_of([&] {
               reduce_scatter(world(), Tensor::zeros({7}, TensorOptions{}.with_dtype(DType::U8)), 0,
                              lengths, g);
             }),
             "cannot sum u8");
  EXPECT_HAS(testing::error_of([&] { all_gather(world(), Tensor::scalar(1.0), 0, lengths, g); }),
             "0-dim tensor");
  EXPECT_HAS(testing::error_of([&] {
               all_gather(world(), Tensor::zeros({1, 2}), 5, lengths, g);
             }),
             "out of range");
  std::vector<int64_t> big(static_cast<size_t>(n), 1000);
  EXPECT_HAS(testing::error_of([&] {
               all_gather(world(), Tensor::zeros({999, 2}), 0, big, g);
             }),
             "shard length is 1000");
  EXPECT_HAS(testing::error_of([&] {
               all_to_all(world(), Tensor::zeros({7, 2}), 1, 1, lengths, lengths, g);
             }),
             "split dim and concat dim are both 1");
}

}  // namespace
}  // namespace hap::parallel
