// Every model of the zoo, distributed, equals one process (DESIGN contract 1): built by name at a
// small size that does not divide evenly over the ranks, traced through its declared inputs, fed
// a batch its own default dataset reads, planned with each strategy on uneven devices (one ratio
// vector per block), and trained beside the same model on one device: the loss of every step,
// every gradient of the first step and every parameter after the last agree.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/rng.h"
#include "exactness.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "ops/functional.h"
#include "parallel_test_util.h"
#include "train/dataset.h"
#include "train/trace.h"

namespace hap::parallel {
namespace {

using testing::compare_with_one_device;
using testing::world;

// A small text file for models that read the byte corpus (the same text on every rank). Each
// process writes its own file: test programs run concurrently under ctest -j, and a name shared
// between them let one truncate the file while another was reading it.
struct TextFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("hap_test_models_" + std::to_string(::getpid()) + ".txt"))
                         .string();
  TextFile() {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i)
      out << "The quick brown fox " << i * 7 << " jumps over the lazy dog.\n";
  }
  ~TextFile() { std::remove(path.c_str()); }
};

std::string text_file() {
  static const TextFile file;
  return file.path;
}

struct ModelCase {
  std::string model;
  std::map<std::string, nn::OptionValue> options;  // over the entry's defaults
  int64_t batch = 7;
  double lr = 2e-3;
};

void check_model(const ModelCase& c, synth::Strategy strategy, int steps, double dropout) {
  SCOPED_TRACE(c.model + " under " + synth::strategy_name(strategy) + ", dropout " +
               std::to_string(dropout));
  const nn::ModelEntry& entry = nn::find_model(c.model);
  nn::Options options(entry.options);
  for (const auto& [k, v] : c.options) options.set(k, v);
  if (dropout > 0) options.set("dropout", dropout);
  const uint64_t seed = 21;
  std::shared_ptr<nn::Model> ref = nn::build_model(entry, options, c.batch, seed), shape_model;
  {
    MetaGuard meta;
    shape_model = nn::build_model(entry, options, c.batch, seed);
  }
  const synth::Graph g = train::trace_model(*shape_model, c.batch);

  const train::DatasetEntry& data = train::find_dataset(entry.data);
  nn::Options data_options(data.options);
  if (entry.data == "bytes") data_options.set("path", text_file());
  const nn::Batch batch = train::open_dataset(data, data_options, ref->inputs(c.batch), seed)
                              ->read(train::Split::kTrain, 0, 0, c.batch);
  std::map<std::string, Tensor> tensors(batch.begin(), batch.end());

  ref->train();
  // dp-ep: expert weights (parameters of 3 or more dims that are a batched product's second
  // operand) split by expert, the rest whole.
  auto check_plan = [&](const synth::DistributedProgram& plan) {
    if (strategy != synth::Strategy::DpEp || world().size() < 2) return;
    std::vector<bool> expert(g.tensors.size(), false);
    for (const synth::GraphNode& n : g.nodes)
      if (n.kind == ops::OpKind::MatMul && n.inputs.size() > 1 && n.inputs[1] >= 0 &&
          g.tensors[static_cast<size_t>(n.inputs[1])].role == synth::TensorRole::Parameter &&
          g.tensors[static_cast<size_t>(n.inputs[1])].shape.size() >= 3)
        expert[static_cast<size_t>(n.inputs[1])] = true;
    int experts = 0;
    for (const synth::GraphTensor& t : g.tensors) {
      if (t.role != synth::TensorRole::Parameter) continue;
      const ops::Prop& p = plan.storage[t.id];
      if (expert[static_cast<size_t>(t.id)]) {
        ++experts;
        EXPECT_TRUE(p.kind == ops::PropKind::Sharded && p.dim == 0) << t.name;
      } else {
        EXPECT_EQ(p.kind, ops::PropKind::Replicated) << t.name;
      }
    }
    EXPECT_GT(experts, 0);
  };
  compare_with_one_device(
      g, strategy, synth::SegmentMode::PerBlock, *ref, [&] { return ref->loss(batch); }, tensors,
      steps, c.lr, 0.5, testing::close_parameters_with_attention(c.lr, steps), check_plan);
}

// Width 4 (not 2): with two channels per stage, ReLUs die and the activations that reach the
// classifier are so small that f32 rounding differences between shardings dominate them.
const ModelCase kVgg{
    "vgg19", {{"width", int64_t{4}}, {"hidden", int64_t{12}}, {"num_classes", int64_t{5}}}, 7};

const ModelCase kVit{"vit",
                     {{"image_size", int64_t{12}},
                      {"patch_size", int64_t{3}},
                      {"in_channels", int64_t{2}},
                      {"num_classes", int64_t{5}},
                      {"n_layer", int64_t{2}},
                      {"n_head", int64_t{3}},
                      {"n_embd", int64_t{18}},
                      {"hidden", int64_t{20}}},
                     7};

const std::map<std::string, nn::OptionValue> kBertSize = {
    {"vocab_size", int64_t{256}}, {"seq_len", int64_t{9}}, {"n_layer", int64_t{2}},
    {"n_head", int64_t{3}},       {"n_embd", int64_t{18}}, {"hidden", int64_t{22}}};
const ModelCase kBert{"bert", kBertSize, 7};
ModelCase bert_mlm() {
  ModelCase c{"bert", kBertSize, 7};
  c.options["objective"] = std::string("mlm");
  c.options["mask_prob"] = 0.3;
  return c;
}

ModelCase vgg_bn() {
  ModelCase c = kVgg;
  c.options["batch_norm"] = true;
  // Batch statistics over 7 images (28 values per channel in the last stage) make this
  // trajectory ill-conditioned: at lr 2e-3 the f32 rounding differences between shardings grow
  // about 1.7x per step and pass 1e-5 in the loss after 8 steps, for every strategy alike (at
  // lr 1e-3 with width 8 as well), while the first step's loss and gradients agree to 1e-5 and
  // 1e-4. At lr 5e-4 ten steps stay within the bounds.
  c.lr = 5e-4;
  return c;
}

// BERT-MoE: 5 experts (dividing no rank count), capacity 3 slots per expert for 9 tokens and 2
// choices each, so some choices are dropped.
ModelCase bert_moe() {
  ModelCase c{"bert_moe", kBertSize, 7};
  c.options["num_experts"] = int64_t{5};
  c.options["capacity_factor"] = 1.2;
  return c;
}

class Models : public ::testing::TestWithParam<synth::Strategy> {};

TEST_P(Models, Vgg19MatchesOneDevice) { check_model(kVgg, GetParam(), 1, 0.0); }
TEST_P(Models, Vgg19ParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(kVgg, GetParam(), 10, 0.1);
}

TEST_P(Models, VitMatchesOneDevice) { check_model(kVit, GetParam(), 1, 0.0); }
TEST_P(Models, VitParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(kVit, GetParam(), 10, 0.1);
}

TEST_P(Models, BertMatchesOneDevice) { check_model(kBert, GetParam(), 1, 0.0); }
TEST_P(Models, BertParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(kBert, GetParam(), 10, 0.1);
}
TEST_P(Models, BertMaskedLmMatchesOneDevice) { check_model(bert_mlm(), GetParam(), 1, 0.0); }
TEST_P(Models, BertMaskedLmParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(bert_mlm(), GetParam(), 10, 0.1);
}

TEST_P(Models, VggBatchNormMatchesOneDevice) { check_model(vgg_bn(), GetParam(), 1, 0.0); }
TEST_P(Models, VggBatchNormParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(vgg_bn(), GetParam(), 10, 0.1);
}

// Models with experts also run under dp-ep (DeepSpeed-MoE's expert parallelism), whose plan
// stores the expert weights split by expert and every other parameter whole.
class ExpertModels : public ::testing::TestWithParam<synth::Strategy> {};

TEST_P(ExpertModels, MixtureOfExpertsMatchesOneDevice) {
  check_model(bert_moe(), GetParam(), 1, 0.0);
}
TEST_P(ExpertModels, MixtureOfExpertsParametersMatchAfterTenAdamWStepsWithDropout) {
  check_model(bert_moe(), GetParam(), 10, 0.1);
}

std::string strategy_label(const ::testing::TestParamInfo<synth::Strategy>& info) {
  std::string n = synth::strategy_name(info.param);
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Strategies, ExpertModels,
                         ::testing::Values(synth::Strategy::DpEv, synth::Strategy::DpCp,
                                           synth::Strategy::Tp, synth::Strategy::Hap,
                                           synth::Strategy::DpEp),
                         strategy_label);

INSTANTIATE_TEST_SUITE_P(Strategies, Models,
                         ::testing::Values(synth::Strategy::DpEv, synth::Strategy::DpCp,
                                           synth::Strategy::Tp, synth::Strategy::Hap),
                         strategy_label);

}  // namespace
}  // namespace hap::parallel
