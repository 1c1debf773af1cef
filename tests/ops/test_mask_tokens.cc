// mask_tokens (BERT's masked-LM corruption): the share of chosen positions and the 80/10/10 rule,
// targets that pair with the corrupted ids, draws that depend only on (seed, stream, logical
// position) so that a shard draws its slice, and the errors for bad attributes.
#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/op.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using test_util::error_of;

// ids i64 [rows, cols] with values in [0, vocab) (none equal to mask_id = vocab).
Tensor token_ids(int64_t rows, int64_t cols, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v;
  for (double u : rand({rows, cols}, seed).to_vector())
    v.push_back(std::min(static_cast<int64_t>(u * static_cast<double>(vocab)), vocab - 1));
  return Tensor::from_vector(v, {rows, cols});
}

TEST(MaskTokens, ChoosesTheShareAskedForAndFollowsTheEightyTenTenRule) {
  const int64_t V = 50, rows = 200, cols = 300;
  Tensor ids = token_ids(rows, cols, V, 1);
  auto [in, tgt] = mask_tokens(ids, 0.15, /*mask_id=*/V, V, /*seed=*/9, /*stream=*/4);
  const std::vector<double> x = ids.to_vector(), c = in.to_vector(), t = tgt.to_vector();
  double chosen = 0, masked = 0, kept = 0, replaced = 0, changed_unchosen = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (t[i] == -100) {
      changed_unchosen += c[i] != x[i];
      continue;
    }
    ++chosen;
    EXPECT_EQ(t[i], x[i]) << "a target is the original id";
    if (c[i] == V)
      ++masked;
    else if (c[i] == x[i])
      ++kept;  // (a random replacement may also draw the same id: 1 in 50)
    else
      ++replaced;
    EXPECT_TRUE(c[i] >= 0 && c[i] <= V) << c[i];
  }
  const double n = static_cast<double>(x.size());
  EXPECT_EQ(changed_unchosen, 0) << "positions not chosen keep their ids";
  EXPECT_NEAR(chosen / n, 0.15, 0.005);
  EXPECT_NEAR(masked / chosen, 0.8, 0.01);
  EXPECT_NEAR(kept / chosen, 0.1 + 0.1 / V, 0.01);
  EXPECT_NEAR(replaced / chosen, 0.1 - 0.1 / V, 0.01);
}

TEST(MaskTokens, DrawsDependOnlyOnSeedStreamAndLogicalPosition) {
  Tensor ids = token_ids(6, 10, 30, 2);
  auto [a_in, a_tgt] = mask_tokens(ids, 0.5, 30, 30, 5, 1);
  auto [b_in, b_tgt] = mask_tokens(ids, 0.5, 30, 30, 5, 1);
  auto [c_in, c_tgt] = mask_tokens(ids, 0.5, 30, 30, 5, 2);
  auto [d_in, d_tgt] = mask_tokens(ids, 0.5, 30, 30, 6, 1);
  EXPECT_EQ(a_in.to_vector(), b_in.to_vector());
  EXPECT_EQ(a_tgt.to_vector(), b_tgt.to_vector());
  EXPECT_NE(a_tgt.to_vector(), c_tgt.to_vector()) << "another stream (step) draws afresh";
  EXPECT_NE(a_tgt.to_vector(), d_tgt.to_vector()) << "another seed draws afresh";
  // A shard (rows 2..4, columns 3..9) given its place in the logical tensor draws its slice.
  ops::MaskTokensAttrs attrs{0.5, 30, 30, -100, true, 5, 1, {{6, 10}, {2, 3}}};
  Tensor shard = slice(slice(ids, 0, 2, 5), 1, 3, 10).contiguous();
  Tensor part = ops::call1(ops::OpKind::MaskTokens, {shard}, attrs);
  EXPECT_EQ(part.to_vector(), slice(slice(a_tgt, 0, 2, 5), 1, 3, 10).contiguous().to_vector());
}

TEST(MaskTokens, ProbabilityOneChoosesEveryPositionAndZeroNone) {
  Tensor ids = token_ids(3, 7, 10, 3);
  EXPECT_EQ(mask_tokens(ids, 1.0, 10, 10, 1, 1).second.to_vector(), ids.to_vector());
  auto [in, tgt] = mask_tokens(ids, 0.0, 10, 10, 1, 1);
  EXPECT_EQ(in.to_vector(), ids.to_vector());
  for (double t : tgt.to_vector()) EXPECT_EQ(t, -100);
}

// The largest vocabulary allowed (2^32) draws random tokens from all of it (a 32-bit modulo by
// 2^32 would divide by zero).
TEST(MaskTokens, AVocabularyOfTwoToTheThirtyTwoDrawsAnyToken) {
  Tensor ids = token_ids(4, 50, 10, 5);
  ops::MaskTokensAttrs a{1.0, 7, int64_t{1} << 32, -100, false, 3, 2, {}};
  const std::vector<double> out = ops::call1(ops::OpKind::MaskTokens, {ids}, a).to_vector();
  int randoms = 0;
  for (double t : out) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 4294967296.0);
    randoms += t >= 10;  // a draw outside the inputs' range 0..9 and not the mask id
  }
  EXPECT_GT(randoms, 5) << "about 10% of 200 chosen positions become random tokens";
}

TEST(MaskTokens, BadAttributesAndInputsAreNamed) {
  Tensor ids = token_ids(2, 3, 10, 4);
  EXPECT_HAS(error_of([&] { mask_tokens(ids, 1.5, 10, 10, 1, 1); }), "probability");
  EXPECT_HAS(error_of([&] { mask_tokens(ids, 0.1, 10, 0, 1, 1); }), "vocab");
  EXPECT_HAS(error_of([&] { mask_tokens(randn({2, 3}, 1), 0.1, 10, 10, 1, 1); }), "must be i64");
}

}  // namespace
}  // namespace hap
