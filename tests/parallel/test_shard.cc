// Shard lengths from ratios (largest remainder, exact sums, ties to the lower rank), offsets,
// ShardSpec, and the errors bad ratios get. Pure functions: every rank runs the same checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "parallel/shard.h"
#include "parallel_test_util.h"

namespace hap::parallel {
namespace {

using testing::error_of;

using L = std::vector<int64_t>;

TEST(ShardLengths, GiveTheExtraElementsToTheLargestRemainders) {
  EXPECT_EQ(shard_lengths(7, {0.5, 0.3, 0.2}), (L{4, 2, 1}));      // quotas 3.5 2.1 1.4
  EXPECT_EQ(shard_lengths(11, {0.5, 0.3, 0.2}), (L{6, 3, 2}));     // quotas 5.5 3.3 2.2
  EXPECT_EQ(shard_lengths(10, {0.46, 0.27, 0.27}), (L{4, 3, 3}));  // 4.6 2.7 2.7
  EXPECT_EQ(shard_lengths(9, {0.1, 0.45, 0.45}), (L{1, 4, 4}));    // 0.9 4.05 4.05
  EXPECT_EQ(shard_lengths(100, {0.25, 0.25, 0.25, 0.25}), (L{25, 25, 25, 25}));
}

TEST(ShardLengths, BreakTiesTowardsTheLowerRank) {
  EXPECT_EQ(shard_lengths(5, {0.3, 0.7}), (L{2, 3}));  // 1.5 and 3.5 tie despite float error
  EXPECT_EQ(shard_lengths(5, {0.7, 0.3}), (L{4, 1}));
  EXPECT_EQ(shard_lengths(10, {0.45, 0.35, 0.2}), (L{5, 3, 2}));  // 4.5 3.5 2
  EXPECT_EQ(shard_lengths(2, {1.0 / 3, 1.0 / 3, 1.0 / 3}), (L{1, 1, 0}));
  EXPECT_EQ(shard_lengths(1, {0.25, 0.25, 0.25, 0.25}), (L{1, 0, 0, 0}));
  EXPECT_EQ(shard_lengths(3, {0.25, 0.25, 0.25, 0.25}), (L{1, 1, 1, 0}));
}

TEST(ShardLengths, ZeroRatiosAndZeroSizesGiveZeroLengthShards) {
  EXPECT_EQ(shard_lengths(7, {0.5, 0.0, 0.5}), (L{4, 0, 3}));
  EXPECT_EQ(shard_lengths(0, {0.5, 0.3, 0.2}), (L{0, 0, 0}));
  EXPECT_EQ(shard_lengths(4, {0.0, 0.0, 1.0}), (L{0, 0, 4}));
  EXPECT_EQ(shard_lengths(13, {1.0}), (L{13}));
}

TEST(ShardLengths, SumExactlyAndStayWithinOneOfTheQuota) {
  // Property test against the definition, over many random ratio vectors and sizes, including a
  // ratio sum that is off 1 by less than the tolerance.
  for (uint64_t trial = 0; trial < 300; ++trial) {
    Tensor u = rand({1 + static_cast<int64_t>(trial % 7)}, 42, trial);
    std::vector<double> r = u.to_vector();
    double s = std::accumulate(r.begin(), r.end(), 0.0);
    for (double& x : r) x = x / s * (1.0 + (trial % 3 == 0 ? 4e-7 : 0.0));
    int64_t n = static_cast<int64_t>(trial * 37 % 1001);
    L len = shard_lengths(n, r);
    ASSERT_EQ(std::accumulate(len.begin(), len.end(), int64_t{0}), n) << "trial " << trial;
    double rs = std::accumulate(r.begin(), r.end(), 0.0);
    for (size_t i = 0; i < r.size(); ++i) {
      double q = static_cast<double>(n) * r[i] / rs;
      EXPECT_LE(std::abs(static_cast<double>(len[i]) - q), 1.0 + 1e-9) << "trial " << trial;
      // Largest remainder: whoever got rounded up had a fraction at least as large as anyone
      // rounded down.
      for (size_t j = 0; j < r.size(); ++j) {
        double qj = static_cast<double>(n) * r[j] / rs;
        bool up_i = static_cast<double>(len[i]) > std::floor(q) + 0.5;
        bool up_j = static_cast<double>(len[j]) > std::floor(qj) + 0.5;
        if (up_i && !up_j) {
          EXPECT_GE(q - std::floor(q), qj - std::floor(qj) - 1e-9);
        }
      }
    }
  }
}

TEST(ShardLengths, RejectBadRatiosNamingTheValues) {
  std::string m = error_of([] { shard_lengths(10, {0.5, -0.1, 0.6}); });
  EXPECT_HAS(m, "ratio 1 = -0.1");
  EXPECT_HAS(m, "finite and >= 0");
  m = error_of([] { shard_lengths(10, {0.5, std::nan(""), 0.5}); });
  EXPECT_HAS(m, "ratio 1 = nan");
  m = error_of([] { shard_lengths(10, {0.5, std::numeric_limits<double>::infinity()}); });
  EXPECT_HAS(m, "ratio 1 = inf");
  m = error_of([] { shard_lengths(10, {0.5, 0.3, 0.1}); });
  EXPECT_HAS(m, "[0.5, 0.3, 0.1] sum to 0.9");
  EXPECT_HAS(m, "expected 1 within 1e-06");
  m = error_of([] { shard_lengths(10, {0.5, 0.5 + 2e-6}); });
  EXPECT_HAS(m, "sum to 1.000002");
  m = error_of([] { shard_lengths(10, {}); });
  EXPECT_HAS(m, "empty list");
  m = error_of([] { shard_lengths(-3, {1.0}); });
  EXPECT_HAS(m, "dimension size -3 is negative");
}

TEST(ShardOffsets, ArePrefixSums) {
  EXPECT_EQ(shard_offsets({4, 0, 3}), (L{0, 4, 4}));
  EXPECT_EQ(shard_offsets({}), (L{}));
}

TEST(ShardSpec, DescribesEachRanksSliceOfTheLogicalTensor) {
  ShardSpec spec = ShardSpec::from_ratios(1, 7, {0.5, 0.3, 0.2});
  EXPECT_EQ(spec.lengths, (L{4, 2, 1}));
  EXPECT_EQ(spec.offsets, (L{0, 4, 6}));
  EXPECT_EQ(spec.dim_size(), 7);
  EXPECT_EQ(spec.max_length(), 4);
  EXPECT_EQ(spec.local_shape({3, 7, 2}, 1), (Shape{3, 2, 2}));
  LogicalSlice ls = spec.logical_slice({3, 7, 2}, 2);
  EXPECT_EQ(ls.offset, (std::vector<int64_t>{0, 6, 0}));

  // A shard drawn through its logical slice equals the slice of the logical tensor.
  Tensor full = randn({3, 7, 2}, 9, 1);
  Tensor mine = Tensor::empty(spec.local_shape({3, 7, 2}, 1));
  fill_normal(mine, 9, 1, 0.0, 1.0, spec.logical_slice({3, 7, 2}, 1));
  EXPECT_TRUE(testing::same_values(mine, spec.slice_of(full, 1).clone()));

  EXPECT_HAS(error_of([&] { spec.local_shape({3, 8, 2}, 0); }), "sum to 7");
  EXPECT_HAS(error_of([&] { spec.length(3); }), "rank 3 out of range");
  EXPECT_HAS(error_of([] { ShardSpec(0, {2, -1}); }), "negative entry at rank 1");
}

}  // namespace
}  // namespace hap::parallel
