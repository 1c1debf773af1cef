// BERT: its structure at the paper's size (shape-only), the inputs of each objective, the
// masked-LM draws (fresh per training step, fixed in evaluation), and attention that is causal or
// bidirectional by objective.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/rng.h"
#include "models/bert.h"
#include "models/moe.h"
#include "models/zoo.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap::nn {
namespace {

using test_util::error_of;

std::shared_ptr<Model> bert(std::map<std::string, OptionValue> set, int64_t batch = 2) {
  const ModelEntry& e = find_model("bert");
  Options o(e.options);
  for (auto& [k, v] : set) o.set(k, v);
  return build_model(e, o, batch, 5);
}

const std::map<std::string, OptionValue> kSmall = {{"seq_len", int64_t{12}},
                                                   {"n_layer", int64_t{1}},
                                                   {"n_head", int64_t{2}},
                                                   {"n_embd", int64_t{8}},
                                                   {"hidden", int64_t{16}}};

Tensor byte_ids(int64_t B, int64_t T, uint64_t seed) {
  std::vector<int64_t> v;
  for (double u : rand({B, T}, seed).to_vector()) v.push_back(static_cast<int64_t>(u * 256) % 256);
  return Tensor::from_vector(v, {B, T});
}

TEST(Bert, ThePaperSizeIsBertBaseOnBytesAndMlmAddsAMaskToken) {
  MetaGuard meta;
  auto causal = bert({});
  EXPECT_EQ(causal->num_parameters(), 85944832);
  auto& b = dynamic_cast<BERT&>(*causal);
  EXPECT_EQ(b.blocks->size(), 12u);
  EXPECT_TRUE(b.blocks->at<TransformerBlock>(0)->attn->options().causal());
  EXPECT_EQ(b.wte->weight.shape(), (Shape{256, 768}));
  EXPECT_EQ(causal->inputs(4).size(), 2u);
  auto mlm = bert({{"objective", std::string("mlm")}});
  EXPECT_EQ(mlm->num_parameters(), 85944832 + 768 + 1) << "one more embedding row and bias";
  auto& m = dynamic_cast<BERT&>(*mlm);
  EXPECT_FALSE(m.blocks->at<TransformerBlock>(0)->attn->options().causal());
  const std::vector<InputSpec> in = mlm->inputs(4);
  ASSERT_EQ(in.size(), 1u) << "a masked-LM makes its own targets";
  EXPECT_EQ(in[0].name, "idx");
  EXPECT_EQ(in[0].num_classes, 256) << "the data gives bytes; the [MASK] id 256 is the model's";
  EXPECT_EQ(find_model("bert").data, "bytes");
}

TEST(Bert, MaskedLmDrawsAfreshEachStepAndTheSameInEveryEvaluation) {
  auto opts = kSmall;
  opts["objective"] = std::string("mlm");
  opts["mask_prob"] = 0.5;
  auto model = bert(opts, 3);
  auto& m = dynamic_cast<BERT&>(*model);
  Tensor idx = byte_ids(3, 12, 1);
  model->train();
  model->set_random_step(0);
  const auto step0 = m.masked(idx);
  model->set_random_step(1);
  const auto step1 = m.masked(idx);
  EXPECT_NE(step0.second.to_vector(), step1.second.to_vector());
  model->eval();
  EXPECT_EQ(m.masked(idx).second.to_vector(), step0.second.to_vector())
      << "evaluation uses step 0's draw, whatever the step";
  // The corrupted ids use the [MASK] id (256) and targets are -100 or the original byte.
  const std::vector<double> x = idx.to_vector(), c = step0.first.to_vector(),
                            t = step0.second.to_vector();
  int masked = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    masked += c[i] == 256;
    EXPECT_TRUE(t[i] == -100 || t[i] == x[i]) << i;
    if (t[i] == -100) {
      EXPECT_EQ(c[i], x[i]) << i;
    }
  }
  EXPECT_GT(masked, 0);
  // The loss is the cross-entropy of the corrupted ids' logits at the chosen positions.
  model->train();
  model->set_random_step(0);
  const double loss = model->loss({{"idx", idx}}).item();
  model->set_random_step(0);
  auto [ci, ct] = m.masked(idx);
  model->set_random_step(0);
  const double expect =
      cross_entropy(reshape(m.forward(ci), {-1, 257}), reshape(ct, {-1}), -100).item();
  EXPECT_NEAR(loss, expect, 1e-6);
}

TEST(Bert, CausalAttentionHidesTheFutureAndMlmAttentionDoesNot) {
  for (const std::string objective : {"causal", "mlm"}) {
    auto opts = kSmall;
    opts["objective"] = objective;
    auto model = bert(opts, 1);
    auto& m = dynamic_cast<BERT&>(*model);
    model->eval();
    Tensor a = byte_ids(1, 12, 2);
    std::vector<double> v = a.to_vector();
    v[11] = static_cast<double>((static_cast<int64_t>(v[11]) + 1) % 256);  // change the last token
    std::vector<int64_t> w(v.begin(), v.end());
    const std::vector<double> la = m.forward(a).to_vector();
    const std::vector<double> lb = m.forward(Tensor::from_vector(w, {1, 12})).to_vector();
    double first_position_change = 0;
    for (int k = 0; k < 256; ++k) first_position_change += std::abs(la[k] - lb[k]);
    if (objective == "causal") {
      EXPECT_EQ(first_position_change, 0) << "position 0 cannot see position 11";
    } else {
      EXPECT_GT(first_position_change, 1e-6) << "every position sees every other";
    }
  }
}

TEST(Bert, BadOptionsAndInputsAreNamed) {
  EXPECT_HAS(error_of([] { bert({{"objective", std::string("clm")}}); }), "objective");
  EXPECT_HAS(error_of([] { bert({{"mask_prob", 0.0}}); }), "mask_prob");
  EXPECT_HAS(error_of([] { bert({{"n_head", int64_t{5}}}); }), "n_embd");
  auto model = bert(kSmall);
  Tensor idx = byte_ids(2, 12, 3);
  EXPECT_HAS(error_of([&] { model->loss({{"idx", idx}}); }), "no input 'targets'");
  Tensor bad = Tensor::from_vector(std::vector<int64_t>(24, 300), {2, 12});
  EXPECT_HAS(error_of([&] { model->loss({{"idx", bad}, {"targets", idx}}); }), "300");
}

TEST(BertMoe, EverySecondBlockIsAMixtureOfExpertsWithTheCapacityOfItsOptions) {
  const ModelEntry& e = find_model("bert_moe");
  Options o(e.options);
  for (auto& [k, v] : kSmall) o.set(k, v);
  o.set("n_layer", int64_t{4});
  o.set("num_experts", int64_t{3});
  o.set("capacity_factor", 1.5);
  auto model = build_model(e, o, 2, 5);
  auto& b = dynamic_cast<BERT&>(*model);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(std::dynamic_pointer_cast<MoEBlock>((*b.blocks)[i]) != nullptr, i % 2 == 1) << i;
  auto block = std::dynamic_pointer_cast<MoEBlock>((*b.blocks)[1]);
  EXPECT_EQ(block->moe->w1.shape(), (Shape{3, 8, 16}));
  EXPECT_EQ(block->moe->w2.shape(), (Shape{3, 16, 8}));
  EXPECT_EQ(block->moe->gate->weight.shape(), (Shape{3, 8}));
  EXPECT_EQ(block->moe->capacity(12), 6) << "ceil(12 x 1.5 / 3)";
  EXPECT_EQ(block->moe->capacity(1), 1);
  // The loss adds the load-balancing losses (each E x sum_e share_e x mean prob_e >= ~1).
  Tensor idx = byte_ids(2, 12, 4);
  model->train();
  const double with_aux = model->loss({{"idx", idx}, {"targets", idx}}).item();
  const double aux = block->moe->aux_loss().item() +
                     std::dynamic_pointer_cast<MoEBlock>((*b.blocks)[3])->moe->aux_loss().item();
  EXPECT_GT(aux, 0.5);
  o.set("aux_loss_coef", 0.0);
  auto plain = build_model(e, o, 2, 5);
  EXPECT_NEAR(with_aux - plain->loss({{"idx", idx}, {"targets", idx}}).item(), 0.01 * aux, 1e-6);
}

TEST(BertMoe, ATokenWithEveryChoiceDroppedPassesThroughTheResidualAlone) {
  MoE moe(MoEOptions(4, 6, 2).top_k(1).capacity_factor(0.25));  // capacity 1 for 4 tokens
  moe.reset_parameters(3);
  Tensor x = randn({1, 4, 4}, 6);
  const std::vector<double> y = moe.forward(x).to_vector();
  int zero_rows = 0;
  for (int t = 0; t < 4; ++t) {
    bool zero = true;
    for (int c = 0; c < 4; ++c) zero = zero && y[t * 4 + c] == 0.0;
    zero_rows += zero;
  }
  EXPECT_GE(zero_rows, 2) << "2 experts x 1 slot keep at most 2 of 4 tokens";
}

TEST(BertMoe, OptionsTheLayerCannotTakeNameTheKey) {
  const ModelEntry& e = find_model("bert_moe");
  auto error_for = [&](std::map<std::string, OptionValue> set) {
    Options o(e.options);
    for (auto& [k, v] : kSmall) o.set(k, v);
    for (auto& [k, v] : set) o.set(k, v);
    return error_of([&] { build_model(e, o, 2, 1); });
  };
  EXPECT_HAS(error_for({{"num_experts", int64_t{2}}, {"top_k", int64_t{3}}}), "top_k");
  EXPECT_HAS(error_for({{"capacity_factor", 0.0}}), "capacity_factor");
  EXPECT_HAS(error_for({{"num_experts", int64_t{0}}}), "num_experts");
  EXPECT_HAS(error_for({{"num_experts", int64_t{70000}}}), "num_experts");
}

}  // namespace
}  // namespace hap::nn
