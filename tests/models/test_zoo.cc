// The model zoo and the Model interface: models are found by name with their typed options, a
// program registers its own, options are checked (types, ranges, required keys, the entry's
// cross-key rules with the batch size), GPT declares its inputs, and module paths follow the tree.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap::nn {
namespace {

using test_util::error_of;

Options gpt_options() {
  const ModelEntry& e = find_model("gpt");
  Options o(e.options);
  o.set("block_size", int64_t{16});
  o.set("n_layer", int64_t{2});
  o.set("n_head", int64_t{2});
  o.set("n_embd", int64_t{8});
  return o;
}

TEST(Zoo, GptIsRegisteredWithItsOptions) {
  const ModelEntry& e = find_model("gpt");
  EXPECT_EQ(e.name, "gpt");
  std::vector<std::string> names;
  for (const OptionSpec& s : e.options) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"vocab_size", "block_size", "seq_len", "n_layer",
                                             "n_head", "n_embd", "dropout", "bias"}));
  EXPECT_EQ(model_names(), (std::vector<std::string>{"bert", "bert_moe", "gpt", "vgg19", "vit"}));
}

TEST(Zoo, AnUnknownNameListsTheRegisteredOnes) {
  const std::string m = error_of([] { find_model("gtp"); });
  EXPECT_HAS(m, "no model named 'gtp'");
  EXPECT_HAS(m, "'gpt'");
}

TEST(Zoo, BuildChecksTheOptionsAndTheCrossKeyRules) {
  const ModelEntry& e = find_model("gpt");
  auto model = build_model(e, gpt_options(), /*batch_size=*/4, /*seed=*/3);
  EXPECT_EQ(model->type_name(), "GPT");
  EXPECT_EQ(model->init_seed(), 3u);
  Options bad = gpt_options();
  bad.set("n_embd", int64_t{9});
  try {
    build_model(e, bad, 4, 3);
    FAIL() << "expected an OptionError";
  } catch (const OptionError& err) {
    EXPECT_EQ(err.key(), "n_embd");
    EXPECT_HAS(err.expectation(), "a multiple of model.n_head = 2");
  }
  Options missing(e.options);  // block_size, n_layer, n_head, n_embd are required
  EXPECT_HAS(error_of([&] { build_model(e, missing, 4, 3); }), "required");
  Options wrong_type = gpt_options();
  wrong_type.set("dropout", std::string("high"));
  EXPECT_HAS(error_of([&] { build_model(e, wrong_type, 4, 3); }), "dropout: expected a number");
  Options out_of_range = gpt_options();
  out_of_range.set("dropout", 1.0);
  EXPECT_HAS(error_of([&] { build_model(e, out_of_range, 4, 3); }),
             "dropout: expected a number in [0, 1)");
}

TEST(Zoo, GptDeclaresItsInputsAndItsLossReadsThem) {
  Options o = gpt_options();
  o.set("seq_len", int64_t{8});
  auto model = build_model(find_model("gpt"), o, 3, 1);
  const std::vector<InputSpec> in = model->inputs(3);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].name, "idx");
  EXPECT_EQ(in[0].shape, (Shape{3, 8}));
  EXPECT_EQ(in[0].dtype, DType::I64);
  EXPECT_EQ(in[0].batch_dim, 0);
  EXPECT_EQ(in[0].num_classes, 256);
  EXPECT_EQ(in[1].name, "targets");
  EXPECT_TRUE(in[1].may_ignore);
  EXPECT_EQ(model->tokens_per_example(), 8);
  std::vector<int64_t> ids(24);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 11 % 256);
  Tensor t = Tensor::from_vector(ids, {3, 8});
  const double loss = model->loss(Batch{{"idx", t}, {"targets", t}}).item();
  EXPECT_NEAR(loss, std::log(256.0), 0.2) << "at initialisation, close to a uniform guess";
  EXPECT_HAS(error_of([&] { model->loss(Batch{{"idx", t}}); }), "no input 'targets'");
}

// A program's own model, registered and built by name like the built-in ones.
class Line : public Model {
 public:
  explicit Line(int64_t width) : Model("Line") {
    fc = register_module("fc", std::make_shared<Linear>(LinearOptions(width, 1)));
  }
  std::vector<InputSpec> inputs(int64_t batch) const override {
    return {{"x", {batch, fc->options().in_features()}}, {"y", {batch, 1}}};
  }
  Tensor loss(const Batch& b) override {
    return mean(pow(fc->forward(b.at("x")) - b.at("y"), 2.0));
  }
  std::shared_ptr<Linear> fc;
};

TEST(Zoo, AProgramRegistersItsOwnModelOnce) {
  ModelEntry e;
  e.name = "line-test";
  e.options = {OptionSpec::integer("width", 3, 1, 100, "inputs")};
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    auto m = std::make_shared<Line>(o.integer("width"));
    m->reset_parameters(seed);
    return m;
  };
  register_model(e);
  EXPECT_HAS(error_of([&] { register_model(e); }), "already registered");
  const ModelEntry& found = find_model("line-test");
  auto model = build_model(found, Options(found.options), 5, 1);
  EXPECT_EQ(model->inputs(5)[0].shape, (Shape{5, 3}));
  ModelEntry nameless = e;
  nameless.name = "";
  EXPECT_HAS(error_of([&] { register_model(nameless); }), "name is empty");
}

// Ranks build models shape-only and draw their shards of each parameter from its init rule, so
// every parameter of every model in the zoo needs one.
TEST(Zoo, EveryParameterOfEveryModelHasAnInitRule) {
  for (const std::string& name : model_names()) {
    if (name == "line-test") continue;
    const ModelEntry& e = find_model(name);
    Options o(e.options);
    for (const OptionSpec& s : e.options)
      if (!o.has(s.name) && s.type == OptionType::Integer) o.set(s.name, int64_t{4});
    MetaGuard meta;
    auto m = build_model(e, o, 2, 1);
    for (const auto& [param, t] : m->named_parameters())
      EXPECT_NE(m->init_rule_of(param).kind, ParamInit::Kind::Keep) << name << ": " << param;
  }
}

TEST(Module, PathsFollowTheTreeAndTheFirstRegistration) {
  auto root = std::make_shared<Module>("Root");
  auto blocks = root->register_module("blocks", std::make_shared<ModuleList>());
  auto inner = std::make_shared<Module>("Inner");
  auto leaf = inner->register_module("fc", std::make_shared<Linear>(LinearOptions(2, 2)));
  EXPECT_EQ(leaf->path(), "fc") << "before the inner module is placed";
  blocks->push_back(inner);  // registering a subtree renames it below its new parent
  EXPECT_EQ(inner->path(), "blocks.0");
  EXPECT_EQ(leaf->path(), "blocks.0.fc");
  root->register_module("shared", leaf);  // a second registration keeps the first name
  EXPECT_EQ(leaf->path(), "blocks.0.fc");
  EXPECT_EQ(root->path(), "");
}

}  // namespace
}  // namespace hap::nn
