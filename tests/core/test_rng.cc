// The counter-based generator: Philox known answers, and the slice property that lets a shard draw
// exactly its part of the logical tensor's numbers (DESIGN.md contract 2).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/philox.h"
#include "core/rng.h"

namespace hap {
namespace {

using Fill = void (*)(const Tensor&, uint64_t, uint64_t, const LogicalSlice&);

void normal(const Tensor& t, uint64_t seed, uint64_t stream, const LogicalSlice& s) {
  fill_normal(t, seed, stream, 0.5, 2.0, s);
}
void uniform(const Tensor& t, uint64_t seed, uint64_t stream, const LogicalSlice& s) {
  fill_uniform(t, seed, stream, -3.0, 5.0, s);
}
void bernoulli(const Tensor& t, uint64_t seed, uint64_t stream, const LogicalSlice& s) {
  fill_bernoulli(t, seed, stream, 0.3, s);
}

// The box [offset, offset + local) of a row-major logical tensor, in row-major order.
std::vector<double> box_of(const std::vector<double>& whole, const Shape& logical,
                           const Shape& local, const std::vector<int64_t>& offset) {
  Strides st = contiguous_strides(logical);
  std::vector<double> out;
  int64_t n = shape_numel(local);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, flat = 0;
    for (int64_t d = static_cast<int64_t>(local.size()) - 1; d >= 0; --d) {
      flat += (rem % local[d] + offset[d]) * st[d];
      rem /= local[d];
    }
    out.push_back(whole[flat]);
  }
  return out;
}

struct SliceCase {
  Shape logical;
  Shape local;
  std::vector<int64_t> offset;
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  using W = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}),
            (W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (W{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (W{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, WordsUseIndexStreamAndSeedAsCounterAndKey) {
  uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull,
           index = 0x1122334455667788ull;
  auto w = philox_words(seed, stream, index);
  auto want =
      philox4x32({0x55667788u, 0x11223344u, 0x76543210u, 0xfedcba98u}, {0x89abcdefu, 0x01234567u});
  EXPECT_EQ(w, want);
  float u = philox_uniform(seed, stream, index);
  EXPECT_EQ(u, static_cast<float>(want[0] >> 8) / 16777216.0f);
}

TEST(Rng, SliceOfTheLogicalTensorEqualsTheWholeTensorsSlice) {
  const std::vector<SliceCase> cases = {
      {{37}, {11}, {13}},                 // 1-D interior
      {{37}, {37}, {0}},                  // the whole, as a slice
      {{9, 14}, {3, 14}, {6, 0}},         // a row block (Sharded(0))
      {{9, 14}, {9, 5}, {0, 7}},          // a column block (Sharded(1))
      {{9, 14}, {4, 6}, {2, 3}},          // a 2-D box
      {{5, 6, 7}, {2, 3, 4}, {3, 2, 1}},  // a 3-D box
      {{5, 6, 7}, {1, 1, 7}, {4, 5, 0}},  // the last row
      {{5, 6, 7}, {5, 0, 7}, {0, 6, 0}},  // empty at the end of a dim
  };
  for (Fill fill : {&normal, &uniform, &bernoulli}) {
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
      for (const SliceCase& c : cases) {
        Tensor whole = Tensor::empty(c.logical, TensorOptions{}.with_dtype(dt));
        fill(whole, 42, 3, {});
        Tensor local = Tensor::empty(c.local, TensorOptions{}.with_dtype(dt));
        fill(local, 42, 3, LogicalSlice{c.logical, c.offset});
        EXPECT_EQ(local.to_vector(), box_of(whole.to_vector(), c.logical, c.local, c.offset))
            << "logical " << shape_str(c.logical) << " local " << shape_str(c.local) << " dtype "
            << dtype_name(dt);
      }
    }
  }
}

TEST(Rng, ShardsTileTheLogicalTensorWithUnevenLengths) {
  // Three ranks holding uneven row blocks [3, 5, 2] of a [10, 6] tensor reassemble the whole.
  Shape logical = {10, 6};
  Tensor whole = Tensor::empty(logical);
  fill_normal(whole, 9, 1, 0.0, 1.0);
  std::vector<double> gathered;
  int64_t start = 0;
  for (int64_t rows : {3, 5, 2}) {
    Tensor shard = Tensor::empty({rows, 6});
    fill_normal(shard, 9, 1, 0.0, 1.0, LogicalSlice{logical, {start, 0}});
    std::vector<double> v = shard.to_vector();
    gathered.insert(gathered.end(), v.begin(), v.end());
    start += rows;
  }
  EXPECT_EQ(gathered, whole.to_vector());
}

TEST(Rng, ValueDependsOnlyOnSeedStreamAndLogicalIndex) {
  // Element i of a fill is the generator at index i, whatever the tensor's shape.
  Tensor a = Tensor::empty({4, 5}, TensorOptions{}.with_dtype(DType::F64));
  fill_normal(a, 5, 2, 0.0, 1.0);
  Tensor b = Tensor::empty({20}, TensorOptions{}.with_dtype(DType::F64));
  fill_normal(b, 5, 2, 0.0, 1.0);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  for (int64_t i = 0; i < 20; ++i)
    EXPECT_EQ(b.item_at(i), philox_normal(5, 2, static_cast<uint64_t>(i)));
  Tensor u = Tensor::empty({20}, TensorOptions{}.with_dtype(DType::F64));
  fill_uniform(u, 5, 2, 0.0, 1.0);
  for (int64_t i = 0; i < 20; ++i)
    EXPECT_EQ(u.item_at(i), static_cast<double>(philox_uniform(5, 2, static_cast<uint64_t>(i))));
}

TEST(Rng, SameSeedAndStreamReproduceDifferentOnesDiffer) {
  Tensor a = randn({1000}, 1, 0), a2 = randn({1000}, 1, 0);
  Tensor b = randn({1000}, 1, 1), c = randn({1000}, 2, 0);
  EXPECT_EQ(a.to_vector(), a2.to_vector());
  auto count_equal = [](const Tensor& x, const Tensor& y) {
    std::vector<double> u = x.to_vector(), v = y.to_vector();
    int n = 0;
    for (size_t i = 0; i < u.size(); ++i) n += u[i] == v[i];
    return n;
  };
  EXPECT_EQ(count_equal(a, b), 0);
  EXPECT_EQ(count_equal(a, c), 0);
  EXPECT_EQ(count_equal(b, c), 0);
  // Streams that differ only in their high 32 bits and seeds that differ only in their high bits
  // are different generators too.
  Tensor hs = randn({1000}, 1, uint64_t(1) << 32),
         hseed = randn({1000}, 1 + (uint64_t(1) << 32), 0);
  EXPECT_EQ(count_equal(a, hs), 0);
  EXPECT_EQ(count_equal(a, hseed), 0);
}

TEST(Rng, NormalDrawsHaveUnitMomentsAndGaussianTails) {
  const int64_t n = 100000;
  Tensor x = randn({n}, 1234, 7, TensorOptions{}.with_dtype(DType::F64));
  std::vector<double> v = x.to_vector();
  double s = 0, s2 = 0, s3 = 0, s4 = 0;
  int beyond2 = 0;
  for (double a : v) {
    s += a;
    s2 += a * a;
    s3 += a * a * a;
    s4 += a * a * a * a;
    beyond2 += std::fabs(a) > 2.0;
    ASSERT_TRUE(std::isfinite(a));
  }
  double mean = s / n, var = s2 / n - mean * mean;
  // Standard errors at n = 1e5: mean 0.0032, variance 0.0045, skew 0.0077, kurtosis 0.015.
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.02);
  EXPECT_NEAR(s3 / n, 0.0, 0.05);
  EXPECT_NEAR(s4 / n, 3.0, 0.1);
  EXPECT_NEAR(beyond2 / static_cast<double>(n), 0.0455, 0.004);
  // Mean and std arguments shift and scale.
  Tensor y = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::F64));
  fill_normal(y, 1234, 7, 3.0, 0.5);
  std::vector<double> w = y.to_vector();
  for (int64_t i = 0; i < n; i += 997) EXPECT_NEAR(w[i], 3.0 + 0.5 * v[i], 1e-12);
}

TEST(Rng, UniformDrawsCoverTheIntervalEvenly) {
  const int64_t n = 100000;
  Tensor u = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::F64));
  fill_uniform(u, 77, 0, 2.0, 6.0);
  std::vector<int> bins(10, 0);
  double s = 0;
  for (double a : u.to_vector()) {
    ASSERT_GE(a, 2.0);
    ASSERT_LT(a, 6.0);
    bins[static_cast<int>((a - 2.0) / 0.4)]++;
    s += a;
  }
  EXPECT_NEAR(s / n, 4.0, 0.02);
  for (int b : bins) EXPECT_NEAR(b, n / 10, 500);  // sd ~95 per bin
}

TEST(Rng, BernoulliKeepsTheRequestedFraction) {
  const int64_t n = 100000;
  Tensor m = Tensor::empty({n});
  fill_bernoulli(m, 3, 4, 0.8);
  double kept = 0;
  for (double a : m.to_vector()) {
    ASSERT_TRUE(a == 0.0 || a == 1.0);
    kept += a;
  }
  EXPECT_NEAR(kept / n, 0.8, 0.006);  // sd 0.0013
  Tensor all = Tensor::empty({1000});
  fill_bernoulli(all, 3, 4, 1.0);
  for (double a : all.to_vector()) EXPECT_EQ(a, 1.0);
  fill_bernoulli(all, 3, 4, 0.0);
  for (double a : all.to_vector()) EXPECT_EQ(a, 0.0);
}

TEST(Rng, RandnAndRandRespectOptions) {
  Tensor a = randn({3, 4}, 8, 0, TensorOptions{}.with_dtype(DType::F64).with_requires_grad(true));
  EXPECT_EQ(a.dtype(), DType::F64);
  EXPECT_TRUE(a.requires_grad());
  Tensor b = rand({3, 4}, 8, 0, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_EQ(b.dtype(), DType::BF16);
  for (double v : b.to_vector()) {
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);  // bf16 rounding may reach 1.0
  }
  // bf16 draws are the f32 draws rounded.
  Tensor f = rand({3, 4}, 8, 0);
  EXPECT_EQ(f.to(DType::BF16).to_vector(), b.to_vector());
}

TEST(Rng, BadSlicesAndLayoutsAreUserErrors) {
  Tensor t = Tensor::empty({3, 4});
  auto msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string m = msg([&] { fill_normal(t, 1, 0, 0, 1, LogicalSlice{{10, 4}, {8, 0}}); });
  EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
  EXPECT_NE(m.find("[10, 4]"), std::string::npos) << m;
  m = msg([&] { fill_normal(t, 1, 0, 0, 1, LogicalSlice{{12}, {0}}); });
  EXPECT_NE(m.find("rank"), std::string::npos) << m;
  m = msg([&] { fill_normal(t, 1, 0, 0, 1, LogicalSlice{{10, 4}, {-1, 0}}); });
  EXPECT_NE(m.find("does not fit"), std::string::npos) << m;
  Tensor nc = t.as_strided({4, 3}, {1, 4}, 0);
  m = msg([&] { fill_uniform(nc, 1, 0, 0, 1); });
  EXPECT_NE(m.find("contiguous"), std::string::npos) << m;
}

}  // namespace
}  // namespace hap
