// Module: registration rules and their messages, dotted names in registration order, tied
// parameters, modes, dtype conversion, name-keyed deterministic initialisation and the dropout
// random streams.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model_test_util.h"
#include "models/layers.h"
#include "models/module.h"
#include "ops/functional.h"

namespace hap::nn {
namespace {

using hap::testing::error_of;
using hap::testing::same_values;
using hap::testing::stats_of;

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, _] : m.named_parameters()) out.push_back(n);
  return out;
}

// A module with its own parameter and two Linear children, registered in a chosen order.
struct Pair : Module {
  Tensor scale;
  std::shared_ptr<Linear> a, b;
  explicit Pair(bool a_first) : Module("Pair") {
    scale = register_parameter("scale", Tensor::ones({3}));
    if (a_first) {
      a = register_module("a", std::make_shared<Linear>(LinearOptions(3, 4)));
      b = register_module("b", std::make_shared<Linear>(LinearOptions(4, 2).bias(false)));
    } else {
      b = register_module("b", std::make_shared<Linear>(LinearOptions(4, 2).bias(false)));
      a = register_module("a", std::make_shared<Linear>(LinearOptions(3, 4)));
    }
  }
};

// Exposes the protected random draw.
struct Drawer : Module {
  Drawer() : Module("Drawer") {}
  RandomDraw draw() { return next_random_draw(); }
};

TEST(Module, RejectsParameterAndSubmoduleNamesWithADot) {
  Module m;
  EXPECT_EQ(error_of([&] { m.register_parameter("a.b", Tensor::zeros({2})); }),
            "Parameter name must not contain a dot (got 'a.b')");
  EXPECT_EQ(error_of([&] { m.register_module("a.b", std::make_shared<Module>()); }),
            "Submodule name must not contain a dot (got 'a.b')");
}

TEST(Module, RejectsEmptyAndDuplicateNames) {
  Module m("Custom");
  EXPECT_HAS(error_of([&] { m.register_parameter("", Tensor::zeros({2})); }),
             "Parameter name must not be empty (in Custom)");
  EXPECT_HAS(error_of([&] { m.register_module("", std::make_shared<Module>()); }),
             "Submodule name must not be empty");
  m.register_parameter("w", Tensor::zeros({2}));
  m.register_module("child", std::make_shared<Module>());
  EXPECT_HAS(error_of([&] { m.register_parameter("w", Tensor::zeros({2})); }),
             "Parameter name 'w' is already used by a parameter of Custom");
  EXPECT_HAS(error_of([&] { m.register_module("w", std::make_shared<Module>()); }),
             "Submodule name 'w' is already used by a parameter of Custom");
  EXPECT_HAS(error_of([&] { m.register_parameter("child", Tensor::zeros({2})); }),
             "Parameter name 'child' is already used by a submodule of Custom");
  EXPECT_HAS(error_of([&] { m.register_module("child", std::make_shared<Module>()); }),
             "Submodule name 'child' is already used by a submodule of Custom");
}

TEST(Module, RejectsUndefinedIntegerGradAndCyclicRegistrations) {
  Module m("Custom");
  EXPECT_HAS(error_of([&] { m.register_parameter("u", Tensor()); }), "undefined tensor");
  EXPECT_HAS(error_of([&] {
               m.register_parameter("ids",
                                    Tensor::arange(4, TensorOptions{}.with_dtype(DType::I64)));
             }),
             "only floating-point parameters can require grad");
  Tensor ids = m.register_parameter(
      "ids", Tensor::arange(4, TensorOptions{}.with_dtype(DType::I64)), /*requires_grad=*/false);
  EXPECT_FALSE(ids.requires_grad());
  EXPECT_HAS(error_of([&] { m.register_module("null", std::shared_ptr<Module>()); }), "is null");
  auto child = std::make_shared<Module>("Child");
  auto parent = std::make_shared<Module>("Parent");
  parent->register_module("child", child);
  EXPECT_HAS(error_of([&] { child->register_module("parent", parent); }), "cycles");
}

TEST(Module, RegisterParameterSetsRequiresGradAndReturnsTheSameTensor) {
  Module m;
  Tensor t = Tensor::zeros({2, 2});
  Tensor p = m.register_parameter("w", t);
  EXPECT_TRUE(p.same(t));
  EXPECT_TRUE(t.requires_grad());
  Tensor frozen = m.register_parameter("frozen", Tensor::zeros({2}), false);
  EXPECT_FALSE(frozen.requires_grad());
}

TEST(Module, NamedParametersAreDottedOwnFirstThenChildrenInRegistrationOrder) {
  Pair a_first(true), b_first(false);
  EXPECT_EQ(names_of(a_first),
            (std::vector<std::string>{"scale", "a.weight", "a.bias", "b.weight"}));
  EXPECT_EQ(names_of(b_first),
            (std::vector<std::string>{"scale", "b.weight", "a.weight", "a.bias"}));
  EXPECT_EQ(a_first.parameters().size(), 4u);
  EXPECT_EQ(a_first.named_parameters(/*recurse=*/false).size(), 1u);
  EXPECT_EQ(a_first.num_parameters(), 3 + 12 + 4 + 8);
  EXPECT_TRUE(a_first.parameter("a.weight").same(a_first.a->weight));
  EXPECT_HAS(
      error_of([&] { a_first.parameter("c.weight"); }),
      "Pair has no parameter named 'c.weight' (it has 4: scale, a.weight, a.bias, b.weight)");
}

TEST(Module, TiedParametersAndSharedSubmodulesAreListedOnceUnderTheirFirstName) {
  Module root("Root");
  auto emb = root.register_module("emb", std::make_shared<Embedding>(EmbeddingOptions(5, 3)));
  auto head = root.register_module("head", std::make_shared<Module>("Head"));
  head->register_parameter("tied", emb->weight);
  auto shared = std::make_shared<Linear>(LinearOptions(3, 3));
  root.register_module("first", shared);
  root.register_module("second", shared);
  EXPECT_EQ(names_of(root), (std::vector<std::string>{"emb.weight", "first.weight", "first.bias"}));
  std::vector<std::string> modules;
  for (const auto& [n, m] : root.named_modules()) modules.push_back(n + ":" + m->type_name());
  EXPECT_EQ(modules,
            (std::vector<std::string>{":Root", "emb:Embedding", "head:Head", "first:Linear"}));
}

TEST(Module, NamedModulesIsPreOrderWithFullNames) {
  TransformerBlock block(TransformerBlockOptions(8, 2));
  std::vector<std::string> names;
  for (const auto& [n, _] : block.named_modules()) names.push_back(n);
  EXPECT_EQ(names,
            (std::vector<std::string>{"", "ln1", "attn", "attn.qkv", "attn.proj", "attn.resid_drop",
                                      "ln2", "mlp", "mlp.fc", "mlp.proj", "mlp.drop"}));
  EXPECT_EQ(block.named_children().size(), 4u);
}

TEST(Module, TrainAndEvalApplyToTheWholeTree) {
  Pair m(true);
  EXPECT_TRUE(m.is_training());
  m.eval();
  EXPECT_FALSE(m.is_training());
  EXPECT_FALSE(m.a->is_training());
  m.train();
  EXPECT_TRUE(m.b->is_training());
  m.a->train(false);  // a subtree can differ
  EXPECT_TRUE(m.is_training());
  EXPECT_FALSE(m.a->is_training());
}

TEST(Module, ZeroGradDropsEveryGradient) {
  Pair m(true);
  for (auto& p : m.parameters()) p.set_grad(Tensor::ones(p.shape()));
  m.zero_grad();
  for (auto& p : m.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(Module, ToConvertsParametersInPlaceKeepingHandlesValid) {
  Pair m(true);
  m.reset_parameters(3);
  Tensor w = m.a->weight;  // a handle held outside the module
  std::vector<double> before = w.to_vector();
  w.set_grad(Tensor::ones(w.shape()));
  m.to(DType::F64);
  EXPECT_EQ(w.dtype(), DType::F64);
  EXPECT_EQ(m.a->weight.dtype(), DType::F64);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_FALSE(w.grad().defined());
  std::vector<double> after = w.to_vector();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(static_cast<float>(after[i]), before[i]);
  EXPECT_HAS(error_of([&] { m.to(DType::I64); }), "floating-point");
}

// Buffers: named like parameters, kept apart from them, converted by to() and reset by
// reset_parameters() through the init rules (BatchNorm: running_mean zeros, running_var ones).
TEST(Module, BuffersAreNamedConvertedAndResetLikeParameters) {
  struct Net : Module {
    std::shared_ptr<BatchNorm> norm;
    Tensor count;
    Net() : Module("Net") {
      count = register_buffer("count", Tensor::zeros({1}));
      norm = register_module("norm", std::make_shared<BatchNorm>(BatchNormOptions(3)));
    }
  } net;
  std::vector<std::string> names;
  for (const auto& [n, _] : net.named_buffers()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"count", "norm.running_mean", "norm.running_var"}));
  EXPECT_EQ(net.named_parameters().size(), 2u);  // norm.weight, norm.bias
  EXPECT_TRUE(same_values(net.buffer("norm.running_var"), Tensor::ones({3})));
  EXPECT_HAS(error_of([&] { net.buffer("norm.weight"); }), "no buffer named 'norm.weight'");
  EXPECT_HAS(error_of([&] { net.register_buffer("count", Tensor::zeros({1})); }),
             "already used by a buffer");
  EXPECT_HAS(error_of([&] { net.register_parameter("count", Tensor::zeros({1})); }),
             "already used by a buffer");
  Tensor trained = Tensor::zeros({2});
  trained.set_requires_grad(true);
  EXPECT_HAS(error_of([&] { net.register_buffer("w", trained); }), "does not require grad");

  // A training forward moves the statistics; reset_parameters puts them back.
  net.norm->forward(randn({4, 3}, 7) * 3.0 + 2.0);
  EXPECT_FALSE(same_values(net.norm->running_mean, Tensor::zeros({3})));
  net.reset_parameters(1);
  EXPECT_TRUE(same_values(net.norm->running_mean, Tensor::zeros({3})));
  EXPECT_TRUE(same_values(net.norm->running_var, Tensor::ones({3})));
  const Tensor handle = net.norm->running_var;
  net.to(DType::F64);
  EXPECT_EQ(handle.dtype(), DType::F64);
  EXPECT_EQ(net.buffer("count").dtype(), DType::F64);
}

TEST(Module, Fnv1aMatchesTheReferenceValues) {
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(param_stream("blocks.0.attn.qkv.weight"), fnv1a64("blocks.0.attn.qkv.weight"));
}

TEST(Module, InitDependsOnSeedAndFullNameNotConstructionOrder) {
  Pair a_first(true), b_first(false);
  a_first.reset_parameters(42);
  b_first.reset_parameters(42);
  EXPECT_TRUE(same_values(a_first.a->weight, b_first.a->weight));
  EXPECT_TRUE(same_values(a_first.b->weight, b_first.b->weight));
  // The parameter's values are exactly those of a normal draw with its own name's stream.
  Tensor expected = Tensor::empty({4, 3});
  fill_normal(expected, 42, fnv1a64("a.weight"), 0.0, 0.02);
  EXPECT_TRUE(same_values(a_first.a->weight, expected));
  // Another seed, or another name, gives other values.
  Pair other(true);
  other.reset_parameters(43);
  EXPECT_FALSE(same_values(a_first.a->weight, other.a->weight));
  Module renamed;
  auto c = renamed.register_module("c", std::make_shared<Linear>(LinearOptions(3, 4)));
  renamed.reset_parameters(42);
  EXPECT_FALSE(same_values(c->weight, a_first.a->weight));
  // Resetting again reproduces the values exactly.
  std::vector<double> first = a_first.a->weight.to_vector();
  a_first.a->weight.fill_(7.0);
  a_first.reset_parameters(42);
  EXPECT_EQ(a_first.a->weight.to_vector(), first);
}

TEST(Module, LayerDefaultsAreGpt2Rules) {
  Module root;
  auto lin = root.register_module("lin", std::make_shared<Linear>(LinearOptions(256, 512)));
  auto ln = root.register_module("ln", std::make_shared<LayerNorm>(LayerNormOptions(16)));
  auto rms = root.register_module("rms", std::make_shared<RMSNorm>(RMSNormOptions(16)));
  root.reset_parameters(1);
  auto s = stats_of(lin->weight);
  EXPECT_NEAR(s.mean, 0.0, 1e-3);
  EXPECT_NEAR(s.std, 0.02, 0.0005);
  EXPECT_EQ(stats_of(lin->bias).max, 0.0);
  EXPECT_EQ(stats_of(lin->bias).min, 0.0);
  EXPECT_EQ(stats_of(ln->weight).min, 1.0);
  EXPECT_EQ(stats_of(ln->weight).max, 1.0);
  EXPECT_EQ(stats_of(ln->bias).max, 0.0);
  EXPECT_EQ(stats_of(rms->weight).min, 1.0);
  EXPECT_EQ(root.init_rule_of("lin.weight"), ParamInit::normal(0, 0.02));
  EXPECT_EQ(root.init_rule_of("ln.bias"), ParamInit::zeros());
}

// A parent's rule overrides its children's; a parameter nobody has a rule for keeps its values.
struct Overriding : Module {
  std::shared_ptr<Linear> lin;
  Tensor raw;
  Overriding() : Module("Overriding") {
    lin = register_module("lin", std::make_shared<Linear>(LinearOptions(2, 2)));
    raw = register_parameter("raw", Tensor::full({3}, 5.0));
  }
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor&) const override {
    if (name == "lin.bias") return ParamInit::constant(0.5);
    return std::nullopt;
  }
};

TEST(Module, OutermostInitRuleWinsAndUnruledParametersAreKept) {
  Overriding m;
  m.reset_parameters(9);
  EXPECT_EQ(m.lin->bias.to_vector(), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(m.raw.to_vector(), (std::vector<double>{5, 5, 5}));
  EXPECT_EQ(m.init_rule_of("raw"), ParamInit::keep());
  EXPECT_EQ(m.init_rule_of("lin.weight"), ParamInit::normal(0, 0.02));
}

TEST(Module, InitOfASliceEqualsTheSliceOfTheWholeInit) {
  Tensor whole = Tensor::empty({6, 5});
  init_parameter(whole, ParamInit::normal(0, 0.02), 11, "x.weight");
  // Rows [2, 5) and columns [1, 4), as a shard would hold them.
  Tensor part = Tensor::empty({3, 3});
  init_parameter(part, ParamInit::normal(0, 0.02), 11, "x.weight", LogicalSlice{{6, 5}, {2, 1}});
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 3; ++c)
      EXPECT_EQ(part.item_at(r * 3 + c), whole.item_at((r + 2) * 5 + (c + 1)));
}

TEST(Module, RandomStreamsAreStepTimesStreamsPerStepPlusModuleIndex) {
  Module root("Root");
  auto d1 = root.register_module("d1", std::make_shared<Drawer>());
  auto d2 = root.register_module("d2", std::make_shared<Drawer>());
  // Unbound: a private state (seed 0, index 0) that advances after each draw.
  EXPECT_EQ(d1->draw().stream, 0u);
  EXPECT_EQ(d1->draw().stream, kRandomStreamsPerStep);
  root.set_random_seed(77);
  EXPECT_EQ(d1->module_index(), 1u);
  EXPECT_EQ(d2->module_index(), 2u);
  RandomDraw a = d1->draw(), b = d2->draw(), a_again = d1->draw();
  EXPECT_EQ(a.seed, 77u);
  EXPECT_EQ(a.stream, 1u);
  EXPECT_EQ(b.stream, 2u);
  EXPECT_EQ(a_again.stream, 1u);  // bound: only the model advances the step
  root.advance_random_step();
  EXPECT_EQ(d2->random_step(), 1u);
  EXPECT_EQ(d2->draw().stream, kRandomStreamsPerStep + 2);
  root.set_random_step(5);
  EXPECT_EQ(d1->draw().stream, 5 * kRandomStreamsPerStep + 1);
}

TEST(Module, ModuleListNamesItemsByIndex) {
  ModuleList list;
  list.push_back(std::make_shared<Linear>(LinearOptions(2, 3)));
  list.push_back(std::make_shared<LayerNorm>(LayerNormOptions(3)));
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(names_of(list), (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  EXPECT_EQ(list.at<Linear>(0)->options().out_features(), 3);
  EXPECT_HAS(error_of([&] { list.at<Linear>(1); }), "module 1 is a LayerNorm");
  EXPECT_HAS(error_of([&] { list[2]; }), "index 2 out of range for 2 modules");
}

TEST(Module, OptionsChainAndValidate) {
  LinearOptions o = LinearOptions(3, 4).bias(false);
  EXPECT_EQ(o.in_features(), 3);
  EXPECT_FALSE(o.bias());
  EXPECT_DOUBLE_EQ(LayerNormOptions(8).eps(1e-6).eps(), 1e-6);
  EXPECT_HAS(error_of([] { Linear(LinearOptions(0, 4)); }),
             "in_features and out_features must be >= 1");
  EXPECT_HAS(error_of([] { Dropout(DropoutOptions(1.0)); }), "p must be in [0, 1), got 1");
  EXPECT_HAS(error_of([] { CausalSelfAttention(CausalSelfAttentionOptions(10, 3)); }),
             "dim (10) must be divisible by n_head (3)");
  Linear no_bias(LinearOptions(3, 4).bias(false));
  EXPECT_FALSE(no_bias.bias.defined());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
}

}  // namespace
}  // namespace hap::nn
