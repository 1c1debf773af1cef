// GPT: parameter names, shapes and counts, GPT-2 initialisation, forward/loss at init, input
// checks, dropout reproducibility, overfitting one batch with AdamW, and a finite-difference
// gradient check in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "core/rng.h"
#include "model_test_util.h"
#include "models/clip.h"
#include "models/gpt.h"
#include "models/optim.h"
#include "ops/functional.h"

namespace hap::nn {
namespace {

using hap::testing::error_of;
using hap::testing::same_values;
using hap::testing::stats_of;

GPTConfig gpt_mini() {
  GPTConfig c;
  c.vocab_size = 256;
  c.block_size = 128;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 256;
  return c;
}

GPTConfig gpt_tiny() {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 7;
  return c;
}

Tensor ids(const std::vector<int64_t>& v, int64_t B, int64_t T) {
  return Tensor::from_vector(v, {B, T});
}

// Deterministic token ids in [0, V).
Tensor token_batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor u = rand({B, T}, seed);
  std::vector<int64_t> v;
  for (double x : u.to_vector()) v.push_back(std::min<int64_t>(V - 1, static_cast<int64_t>(x * V)));
  return ids(v, B, T);
}

TEST(GPT, ParameterNamesAndShapesFollowTheGpt2Layout) {
  GPTConfig c = gpt_tiny();
  GPT model(c);
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, Shape>> expected = {{"wte.weight", {c.vocab_size, C}},
                                                         {"wpe.weight", {c.block_size, C}}};
  for (int i = 0; i < c.n_layer; ++i) {
    std::string p = "blocks." + std::to_string(i) + ".";
    expected.push_back({p + "ln1.weight", {C}});
    expected.push_back({p + "ln1.bias", {C}});
    expected.push_back({p + "attn.qkv.weight", {3, C, C}});
    expected.push_back({p + "attn.qkv.bias", {3, C}});
    expected.push_back({p + "attn.proj.weight", {C, C}});
    expected.push_back({p + "attn.proj.bias", {C}});
    expected.push_back({p + "ln2.weight", {C}});
    expected.push_back({p + "ln2.bias", {C}});
    expected.push_back({p + "mlp.fc.weight", {4 * C, C}});
    expected.push_back({p + "mlp.fc.bias", {4 * C}});
    expected.push_back({p + "mlp.proj.weight", {C, 4 * C}});
    expected.push_back({p + "mlp.proj.bias", {C}});
  }
  expected.push_back({"ln_f.weight", {C}});
  expected.push_back({"ln_f.bias", {C}});
  auto named = model.named_parameters();
  ASSERT_EQ(named.size(), expected.size());
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(named[i].first, expected[i].first);
    EXPECT_EQ(named[i].second.shape(), expected[i].second) << named[i].first;
    EXPECT_TRUE(named[i].second.requires_grad());
  }
}

TEST(GPT, GptMiniHasTheClosedFormParameterCount) {
  GPTConfig c = gpt_mini();
  GPT model(c);
  const int64_t V = 256, T = 128, C = 256, L = 4;
  const int64_t closed_form = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_EQ(closed_form, 3257856);
  EXPECT_EQ(model.num_parameters(), closed_form);
  EXPECT_EQ(c.num_parameters(), closed_form);
  // Without biases: no .bias parameters anywhere.
  c.bias = false;
  GPT no_bias(c);
  EXPECT_EQ(no_bias.num_parameters(), V * C + T * C + L * (12 * C * C + 2 * C) + C);
  EXPECT_EQ(c.num_parameters(), no_bias.num_parameters());
  for (const auto& [name, _] : no_bias.named_parameters())
    EXPECT_EQ(name.find(".bias"), std::string::npos) << name;
}

TEST(GPT, InitialisationFollowsGpt2) {
  GPT model(gpt_mini());
  const double resid_std = 0.02 / std::sqrt(2.0 * 4);
  for (const auto& [name, p] : model.named_parameters()) {
    auto s = stats_of(p);
    bool resid = name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight");
    if (name.ends_with("ln1.weight") || name.ends_with("ln2.weight") || name == "ln_f.weight") {
      EXPECT_EQ(s.min, 1.0) << name;
      EXPECT_EQ(s.max, 1.0) << name;
    } else if (name.ends_with(".bias")) {
      EXPECT_EQ(s.min, 0.0) << name;
      EXPECT_EQ(s.max, 0.0) << name;
    } else {
      double expected_std = resid ? resid_std : 0.02;
      EXPECT_NEAR(s.mean, 0.0, 0.05 * expected_std) << name;
      EXPECT_NEAR(s.std, expected_std, 0.03 * expected_std) << name;
      EXPECT_EQ(model.init_rule_of(name), ParamInit::normal(0, expected_std)) << name;
    }
  }
}

TEST(GPT, InitIsDeterministicAndKeyedByName) {
  GPTConfig c = gpt_tiny();
  GPT a(c), b(c);
  for (const auto& [name, p] : a.named_parameters())
    EXPECT_TRUE(same_values(p, b.parameter(name))) << name;
  // A deeper model shares the names of the first blocks, and their values (the residual
  // projections excepted: their std depends on n_layer).
  GPTConfig deeper = c;
  deeper.n_layer = 3;
  GPT d(deeper);
  EXPECT_TRUE(same_values(a.parameter("blocks.1.attn.qkv.weight"),
                          d.parameter("blocks.1.attn.qkv.weight")));
  EXPECT_TRUE(same_values(a.parameter("wte.weight"), d.parameter("wte.weight")));
  EXPECT_FALSE(same_values(a.parameter("blocks.0.attn.qkv.weight"),
                           a.parameter("blocks.1.attn.qkv.weight")));
  GPTConfig reseeded = c;
  reseeded.seed = 8;
  EXPECT_FALSE(same_values(a.parameter("wte.weight"), GPT(reseeded).parameter("wte.weight")));
}

TEST(GPT, ForwardGivesLogitsAndTheInitialLossIsNearLnV) {
  GPTConfig c = gpt_mini();
  GPT model(c);
  Tensor idx = token_batch(2, 64, c.vocab_size, 3);
  Tensor targets = token_batch(2, 64, c.vocab_size, 4);
  NoGradGuard no_grad;
  EXPECT_EQ(model.forward(idx).shape(), (Shape{2, 64, 256}));
  // Near ln V; the tied head gives the input token's own logit ~ |wte row|^2 / std(x) ~ 3.6, which
  // raises the expected loss of random targets to about ln V + 0.12.
  double loss = model.loss(idx, targets).item();
  EXPECT_GT(loss, std::log(256.0) - 0.05);
  EXPECT_LT(loss, std::log(256.0) + 0.25);
}

TEST(GPT, LossIgnoresTargetsOfMinus100) {
  GPT model(gpt_tiny());
  Tensor idx = ids({1, 2, 3, 4}, 1, 4);
  NoGradGuard no_grad;
  Tensor logits = model.forward(idx);  // [1, 4, V]
  double full = model.loss(idx, ids({5, 6, 7, 8}, 1, 4)).item();
  double partial = model.loss(idx, ids({5, -100, 7, -100}, 1, 4)).item();
  auto nll = [&](int t, int target) {
    std::vector<double> row;
    row.reserve(11);
    for (int v = 0; v < 11; ++v) row.push_back(logits.item_at(t * 11 + v));
    double m = *std::max_element(row.begin(), row.end()), z = 0;
    for (double x : row) z += std::exp(x - m);
    return m + std::log(z) - row[target];
  };
  EXPECT_NEAR(full, (nll(0, 5) + nll(1, 6) + nll(2, 7) + nll(3, 8)) / 4, 1e-5);
  EXPECT_NEAR(partial, (nll(0, 5) + nll(2, 7)) / 2, 1e-5);
}

TEST(GPT, RejectsBadInputsWithClearMessages) {
  GPT model(gpt_tiny());
  EXPECT_HAS(error_of([&] { model.forward(token_batch(1, 9, 11, 1)); }),
             "GPT: sequence length T=9 must be in [1, block_size=8]");
  EXPECT_HAS(error_of([&] {
               model.forward(ids({1, 2, 11, 3}, 2, 2));
             }),
             "GPT: token id 11 at position [1, 0] of idx is outside [0, vocab_size=11)");
  EXPECT_HAS(error_of([&] {
               model.forward(ids({1, -1}, 1, 2));
             }),
             "token id -1 at position [0, 1]");
  EXPECT_HAS(error_of([&] { model.forward(Tensor::zeros({1, 2})); }), "idx must be i64 [B, T]");
  EXPECT_HAS(error_of([&] {
               model.loss(ids({1, 2}, 1, 2), ids({1, 2, 3}, 1, 3));
             }),
             "targets shape [1, 3] differs from idx shape [1, 2]");
  EXPECT_HAS(error_of([&] {
               model.loss(ids({1, 2}, 1, 2), ids({1, 12}, 1, 2));
             }),
             "target 12 at position [0, 1] is outside [0, vocab_size=11) and is not -100");
  GPTConfig bad = gpt_tiny();
  bad.n_head = 3;
  EXPECT_HAS(error_of([&] { GPT g(bad); }), "n_embd (16) must be a multiple of n_head (3)");
}

TEST(GPT, DropoutIsReproducibleAndOffInEval) {
  GPTConfig c = gpt_tiny();
  c.dropout = 0.2;
  GPT a(c), b(c);
  Tensor idx = token_batch(2, 8, c.vocab_size, 5);
  NoGradGuard no_grad;
  Tensor a1 = a.forward(idx), a2 = a.forward(idx);
  EXPECT_FALSE(same_values(a1, a2));  // the step advanced: new masks
  EXPECT_EQ(a.random_step(), 2u);
  EXPECT_TRUE(same_values(a1, b.forward(idx)));  // same seed and step: same masks
  a.eval();
  b.eval();
  Tensor e1 = a.forward(idx);
  EXPECT_EQ(a.random_step(), 2u);  // eval does not advance
  EXPECT_TRUE(same_values(e1, b.forward(idx)));
  c.dropout = 0.0;
  GPT plain(c);
  plain.eval();
  EXPECT_TRUE(same_values(e1, plain.forward(idx)));
}

TEST(GPT, TinyModelOverfitsOneBatchWithAdamW) {
  GPTConfig c = gpt_tiny();
  c.vocab_size = 32;
  c.n_embd = 32;
  GPT model(c);
  Tensor idx = token_batch(4, 8, c.vocab_size, 11);
  Tensor targets = token_batch(4, 8, c.vocab_size, 12);
  optim::AdamW opt(optim::weight_decay_groups(model.named_parameters(), 0.01),
                   {.lr = 3e-3, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.01});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = model.loss(idx, targets);
    loss.backward();
    clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
    ASSERT_TRUE(std::isfinite(last)) << "step " << step;
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(GPT, GradientsMatchFiniteDifferencesInF64) {
  GPTConfig c;
  c.vocab_size = 7;
  c.block_size = 4;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 4;
  c.seed = 3;
  GPT model(c);
  model.to(DType::F64);
  // Perturb LayerNorm parameters and biases away from 1/0 so that their gradients are generic.
  for (const auto& [name, p] : model.named_parameters())
    if (p.dim() == 1) {
      Tensor noise = randn(p.shape(), 99, fnv1a64(name), TensorOptions{}.with_dtype(DType::F64));
      std::vector<double> v = p.to_vector(), n = noise.to_vector();
      for (size_t i = 0; i < v.size(); ++i) v[i] += 0.1 * n[i];
      p.copy_from(Tensor::from_vector(v, p.shape(), TensorOptions{}.with_dtype(DType::F64)));
    }
  Tensor idx = ids({0, 3, 6, 2, 5, 1, 1, 4}, 2, 4);
  Tensor targets = ids({3, 6, 2, 5, 1, -100, 4, 0}, 2, 4);
  std::vector<Tensor> checked;
  for (const char* name :
       {"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.bias", "blocks.0.mlp.fc.bias", "blocks.0.mlp.proj.weight", "ln_f.bias"})
    checked.push_back(model.parameter(name));
  auto f = [&](const std::vector<Tensor>&) { return model.loss(idx, targets); };
  autograd::GradcheckOptions opt;
  opt.eps = 1e-6;
  opt.atol = 1e-7;
  opt.rtol = 1e-5;
  autograd::GradcheckResult r = autograd::gradcheck(f, checked, opt);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_LT(r.max_abs_error, 1e-7);
}

}  // namespace
}  // namespace hap::nn
