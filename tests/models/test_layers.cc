// The layers against plain references: Linear, Embedding, LayerNorm, RMSNorm outputs; Dropout
// in train and eval and its random streams; attention causality; block shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "model_test_util.h"
#include "models/layers.h"
#include "ops/functional.h"

namespace hap::nn {
namespace {

using hap::testing::error_of;
using hap::testing::same_values;

TEST(Linear, ComputesXWTransposePlusBias) {
  Linear lin(LinearOptions(3, 2));
  lin.weight.copy_from(Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}));
  lin.bias.copy_from(Tensor::from_vector(std::vector<double>{0.5, -1}, {2}));
  Tensor x = Tensor::from_vector(std::vector<double>{1, 0, -1, 2, 1, 0}, {2, 3});
  Tensor y = lin.forward(x);
  EXPECT_EQ(y.shape(), (Shape{2, 2}));
  EXPECT_EQ(y.to_vector(), (std::vector<double>{1 - 3 + 0.5, 4 - 6 - 1, 2 + 2 + 0.5, 8 + 5 - 1}));
}

TEST(Embedding, PicksRows) {
  Embedding emb(EmbeddingOptions(4, 2));
  emb.weight.copy_from(
      Tensor::from_vector(std::vector<double>{0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}));
  Tensor ids = Tensor::from_vector(std::vector<int64_t>{3, 0, 2}, {1, 3});
  Tensor y = emb.forward(ids);
  EXPECT_EQ(y.shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(y.to_vector(), (std::vector<double>{30, 31, 0, 1, 20, 21}));
}

TEST(LayerNorm, NormalisesTheLastDim) {
  LayerNorm ln(LayerNormOptions(4));
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, -2, 0, 2, 4}, {2, 4});
  std::vector<double> y = ln.forward(x).to_vector();
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int c = 0; c < 4; ++c) mean += y[r * 4 + c] / 4;
    for (int c = 0; c < 4; ++c) var += (y[r * 4 + c] - mean) * (y[r * 4 + c] - mean) / 4;
    EXPECT_NEAR(mean, 0, 1e-6);
    EXPECT_NEAR(var, 1, 1e-4);  // eps 1e-5 against variances 1.25 and 5
  }
  LayerNorm no_bias(LayerNormOptions(4).bias(false));
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_TRUE(same_values(no_bias.forward(x), ln.forward(x)));
}

TEST(RMSNorm, DividesByTheRootMeanSquare) {
  RMSNorm rms(RMSNormOptions(2).eps(0.0 + 1e-12));
  Tensor x = Tensor::from_vector(std::vector<double>{3, 4}, {1, 2});
  double r = std::sqrt((9.0 + 16.0) / 2);
  std::vector<double> y = rms.forward(x).to_vector();
  EXPECT_NEAR(y[0], 3 / r, 1e-6);
  EXPECT_NEAR(y[1], 4 / r, 1e-6);
}

Tensor ones_input() { return Tensor::ones({64, 64}); }

TEST(Dropout, IsTheIdentityInEvalModeAndForPZero) {
  Dropout drop(DropoutOptions(0.5));
  Tensor x = ones_input();
  drop.eval();
  EXPECT_TRUE(drop.forward(x).same(x));
  Dropout none(DropoutOptions(0.0));
  EXPECT_TRUE(none.forward(x).same(x));
}

TEST(Dropout, ZeroesAboutPAndScalesTheRestInTraining) {
  Dropout drop(DropoutOptions(0.25));
  std::vector<double> y = drop.forward(ones_input()).to_vector();
  int64_t zeros = 0;
  for (double v : y) {
    if (v == 0) {
      ++zeros;
    } else {
      EXPECT_NEAR(v, 1 / 0.75, 1e-6);
    }
  }
  EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(y.size()), 0.25, 0.03);
}

TEST(Dropout, MasksDifferPerCallButAreReproducible) {
  Dropout a(DropoutOptions(0.5)), b(DropoutOptions(0.5));
  Tensor x = ones_input();
  Tensor a1 = a.forward(x), a2 = a.forward(x);
  EXPECT_FALSE(same_values(a1, a2));
  EXPECT_TRUE(same_values(a1, b.forward(x)));  // a fresh module replays the same sequence
  EXPECT_TRUE(same_values(a2, b.forward(x)));
}

// Two dropouts inside one model: masks follow (seed, step * kRandomStreamsPerStep + index).
struct TwoDrops : Module {
  std::shared_ptr<Dropout> d1, d2;
  TwoDrops() : Module("TwoDrops") {
    d1 = register_module("d1", std::make_shared<Dropout>(0.5));
    d2 = register_module("d2", std::make_shared<Dropout>(0.5));
  }
};

TEST(Dropout, InAModelMasksFollowTheSeedStepAndModuleIndex) {
  TwoDrops m;
  m.set_random_seed(1234);
  Tensor x = ones_input();
  Tensor y1 = m.d1->forward(x), y2 = m.d2->forward(x);
  EXPECT_FALSE(same_values(y1, y2));               // per layer
  EXPECT_TRUE(same_values(y1, m.d1->forward(x)));  // same step: same mask
  EXPECT_TRUE(same_values(y2, dropout(x, 0.5, true, 1234, 2)));
  m.advance_random_step();
  Tensor z1 = m.d1->forward(x);
  EXPECT_FALSE(same_values(y1, z1));  // per step
  EXPECT_TRUE(same_values(z1, dropout(x, 0.5, true, 1234, kRandomStreamsPerStep + 1)));
  TwoDrops again;
  again.set_random_seed(1234);
  again.set_random_step(1);
  EXPECT_TRUE(same_values(z1, again.d1->forward(x)));  // reproducible from (seed, step)
}

TEST(CausalSelfAttention, OutputsDoNotDependOnLaterPositions) {
  CausalSelfAttention attn(CausalSelfAttentionOptions(8, 2));
  attn.reset_parameters(5);
  NoGradGuard no_grad;
  Tensor x = randn({2, 5, 8}, 1);
  Tensor y = attn.forward(x);
  EXPECT_EQ(y.shape(), (Shape{2, 5, 8}));
  Tensor x2 = x.clone();
  float* p = x2.data<float>();
  for (int b = 0; b < 2; ++b)
    for (int c = 0; c < 8; ++c) p[(b * 5 + 4) * 8 + c] += 1.0f;  // change the last position
  std::vector<double> y1 = y.to_vector(), y2 = attn.forward(x2).to_vector();
  bool last_changed = false;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < 5; ++t)
      for (int c = 0; c < 8; ++c) {
        size_t i = (b * 5 + t) * 8 + c;
        if (t < 4) {
          EXPECT_EQ(y1[i], y2[i]) << "b " << b << " t " << t;
        } else {
          last_changed = last_changed || y1[i] != y2[i];
        }
      }
  EXPECT_TRUE(last_changed);
  EXPECT_HAS(error_of([&] {
               attn.forward(randn({2, 5, 6}, 1));
             }),
             "expected x of shape [B, T, 8], got [2, 5, 6]");
}

// Adds 1 to position t of every sequence of x [B, T, C] (f32).
Tensor bump(const Tensor& x, int64_t t) {
  Tensor y = x.clone();
  float* p = y.data<float>();
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) p[(b * T + t) * C + c] += 1.0f;
  return y;
}

// Whether any output at positions [from, to) of [B, T, C] differs.
bool any_differs(const Tensor& a, const Tensor& b, int64_t from, int64_t to) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  const int64_t B = a.size(0), T = a.size(1), C = a.size(2);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = from; t < to; ++t)
      for (int64_t c = 0; c < C; ++c)
        if (x[static_cast<size_t>((i * T + t) * C + c)] !=
            y[static_cast<size_t>((i * T + t) * C + c)])
          return true;
  return false;
}

TEST(SelfAttention, BidirectionalOutputsDependOnLaterPositions) {
  SelfAttention attn(SelfAttentionOptions(8, 2).causal(false));
  attn.reset_parameters(5);
  NoGradGuard no_grad;
  Tensor x = randn({2, 5, 8}, 1);
  Tensor y = attn.forward(x), y2 = attn.forward(bump(x, 4));
  EXPECT_TRUE(any_differs(y, y2, 0, 1)) << "position 0 sees position 4 when not causal";
}

TEST(SelfAttention, PaddedKeysChangeNoOtherPosition) {
  for (bool causal : {false, true}) {
    SelfAttention attn(SelfAttentionOptions(8, 2).causal(causal));
    attn.reset_parameters(6);
    NoGradGuard no_grad;
    Tensor x = randn({2, 5, 8}, 2);
    // Positions 3 and 4 of every sequence are padding.
    Tensor mask = Tensor::from_vector(std::vector<double>{1, 1, 1, 0, 0, 1, 1, 1, 0, 0}, {2, 5},
                                      TensorOptions{}.with_dtype(DType::U8));
    Tensor y = attn.forward(x, mask), y2 = attn.forward(bump(x, 4), mask);
    EXPECT_FALSE(any_differs(y, y2, 0, 4)) << (causal ? "causal" : "bidirectional");
    // The masked result at the kept positions equals running the kept prefix alone.
    Tensor prefix = attn.forward(contiguous(slice(x, 1, 0, 3)));
    const std::vector<double> a = slice(y, 1, 0, 3).to_vector(), b = prefix.to_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
  }
}

TEST(TransformerBlock, KeepsTheShapeAndIsResidualAtZeroWeights) {
  TransformerBlock block(TransformerBlockOptions(8, 2));
  Tensor x = randn({2, 3, 8}, 2);
  EXPECT_EQ(block.forward(x).shape(), (Shape{2, 3, 8}));
  // With the output projections at zero both branches add nothing.
  block.attn->proj->weight.zero_();
  block.attn->proj->bias.zero_();
  block.mlp->proj->weight.zero_();
  block.mlp->proj->bias.zero_();
  EXPECT_TRUE(same_values(block.forward(x), x));
  TransformerBlock wide(TransformerBlockOptions(8, 2).hidden(24).causal(false));
  EXPECT_EQ(wide.mlp->fc->weight.shape(), (Shape{24, 8}));
  EXPECT_FALSE(wide.attn->options().causal());
  MLP mlp(MLPOptions(8).hidden(16));
  EXPECT_EQ(mlp.fc->weight.shape(), (Shape{16, 8}));
  EXPECT_EQ(mlp.forward(x).shape(), (Shape{2, 3, 8}));
}

}  // namespace
}  // namespace hap::nn
