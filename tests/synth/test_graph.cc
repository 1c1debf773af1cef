// The tracer: what a model's forward becomes as a graph (ops in program order with their module
// paths, tensors with shapes, dtypes and roles, FLOPs and bytes, consumers), and tensors the
// forward creates itself become Constants that keep their data.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>

#include "models/gpt.h"
#include "models/layers.h"
#include "models/module.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "synth/graph.h"
#include "tests/test_util.h"

namespace hap::synth {
namespace {

// fc2(relu(fc1(x))) + positions, its mean as the loss; `positions` is made inside forward.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions(3, 5)));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions(5, 2).bias(false)));
  }
  Tensor loss(const Tensor& x) {
    Tensor positions = Tensor::arange(2);  // [2]: a constant of this forward
    return mean(fc2->forward(relu(fc1->forward(x))) + positions);
  }
};

Graph trace_net(Net& net, int64_t batch) {
  Tensor x = Tensor::meta({batch, 3}, DType::F32);
  return trace([&] { return net.loss(x); }, net.named_parameters(), {{"x", x}});
}

TEST(Tracer, RecordsOpsInProgramOrderWithShapesRolesAndModulePaths) {
  Net net;
  const Graph g = trace_net(net, 4);
  std::vector<ops::OpKind> kinds;
  for (const GraphNode& n : g.nodes) kinds.push_back(n.kind);
  EXPECT_EQ(kinds,
            (std::vector<ops::OpKind>{ops::OpKind::Linear, ops::OpKind::Relu, ops::OpKind::Linear,
                                      ops::OpKind::Add, ops::OpKind::Mean}));
  // Each layer's ops carry its path in the module tree; the model's own ops none.
  EXPECT_EQ(g.nodes[0].module, "fc1");
  EXPECT_EQ(g.nodes[1].module, "");
  EXPECT_EQ(g.nodes[2].module, "fc2");
  EXPECT_EQ(g.nodes[3].module, "");

  auto tensor = [&](int id) -> const GraphTensor& { return g.tensors[static_cast<size_t>(id)]; };
  const GraphTensor& x = tensor(g.nodes[0].inputs[0]);
  EXPECT_EQ(x.role, TensorRole::Input);
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.shape, (Shape{4, 3}));
  const GraphTensor& w1 = tensor(g.nodes[0].inputs[1]);
  EXPECT_EQ(w1.role, TensorRole::Parameter);
  EXPECT_EQ(w1.name, "fc1.weight");
  EXPECT_EQ(w1.shape, (Shape{5, 3}));
  EXPECT_EQ(tensor(g.nodes[0].inputs[2]).name, "fc1.bias");
  EXPECT_EQ(g.nodes[2].inputs[2], -1) << "fc2 has no bias: an omitted optional input";
  EXPECT_EQ(tensor(g.nodes[1].outputs[0]).shape, (Shape{4, 5}));
  EXPECT_EQ(tensor(g.nodes[1].outputs[0]).role, TensorRole::Activation);
  EXPECT_EQ(tensor(g.nodes[1].outputs[0]).producer, 1);
  EXPECT_EQ(tensor(g.nodes[1].outputs[0]).consumers, (std::vector<int>{2}));
  EXPECT_EQ(g.loss, g.nodes[4].outputs[0]);
  EXPECT_EQ(tensor(g.loss).role, TensorRole::Loss);
  EXPECT_EQ(tensor(g.loss).shape, Shape{});
  EXPECT_EQ(g.parameter_count(), 5 * 3 + 5 + 2 * 5);
}

TEST(Tracer, CountsFlopsAndBytesFromTheRegistry) {
  Net net;
  const Graph g = trace_net(net, 4);
  EXPECT_DOUBLE_EQ(g.nodes[0].flops, 2.0 * 4 * 3 * 5);  // x W^T: a multiply-add per weight and row
  EXPECT_DOUBLE_EQ(g.nodes[2].flops, 2.0 * 4 * 5 * 2);
  // Bytes: every input and output of the call, f32.
  EXPECT_DOUBLE_EQ(g.nodes[1].bytes, 4.0 * (4 * 5 + 4 * 5));
  double total = 0;
  for (const GraphNode& n : g.nodes) total += n.flops;
  EXPECT_DOUBLE_EQ(g.total_flops(), total);
}

TEST(Tracer, ATensorMadeInsideForwardIsAConstantWithItsData) {
  Net net;
  const Graph g = trace_net(net, 4);
  const GraphTensor& c = g.tensors[static_cast<size_t>(g.nodes[3].inputs[1])];
  EXPECT_EQ(c.role, TensorRole::Constant);
  EXPECT_EQ(c.name, "const" + std::to_string(c.id));
  EXPECT_EQ(c.shape, Shape{2});
  ASSERT_TRUE(c.value.defined());
  EXPECT_EQ(c.value.to_vector(), (std::vector<double>{0, 1}));
}

TEST(Tracer, AConstantMadeUnderAMetaGuardHasNoDataToKeep) {
  Tensor x = Tensor::meta({2}, DType::F32);
  const Graph g = trace(
      [&] {
        Tensor shape_only;
        {
          MetaGuard meta;
          shape_only = Tensor::ones({2});
        }
        return sum(x * shape_only);
      },
      {}, {{"x", x}});
  const GraphTensor& c = g.tensors[static_cast<size_t>(g.nodes[0].inputs[1])];
  EXPECT_EQ(c.role, TensorRole::Constant);
  EXPECT_FALSE(c.value.defined());
}

TEST(Tracer, TheLossMustBeAScalarComputedByTracedOps) {
  Tensor x = Tensor::meta({2, 2}, DType::F32);
  EXPECT_HAS(test_util::error_of([&] {
               trace([&] { return x * 2.0; }, {}, {{"x", x}});
             }),
             "scalar loss");
  EXPECT_HAS(test_util::error_of([&] {
               trace([&] { return Tensor::ones({}); }, {}, {{"x", x}});
             }),
             "not computed by traced ops");
}

TEST(Tracer, BufferUpdatesBecomeStateUpdatesAndEvaluationSelects) {
  nn::BatchNorm bn(nn::BatchNormOptions(3).momentum(0.2));
  Tensor x = Tensor::meta({4, 3, 5}, DType::F32);
  const Graph g = trace([&] { return mean(bn.forward(x)); }, bn.named_parameters(), {{"x", x}},
                        bn.named_buffers());
  std::set<std::string> states;
  for (const GraphTensor& t : g.tensors)
    if (t.role == TensorRole::State) states.insert(t.name);
  EXPECT_EQ(states, (std::set<std::string>{"running_mean", "running_var"}));
  ASSERT_EQ(g.state_updates.size(), 2u);
  const double n = 4 * 5;
  const double takes[2] = {0.2, 0.2 * n / (n - 1)};  // the variance unbiased
  for (size_t i = 0; i < 2; ++i) {
    const StateUpdate& u = g.state_updates[i];
    EXPECT_EQ(g.tensors[static_cast<size_t>(u.state)].name,
              i == 0 ? "running_mean" : "running_var");
    EXPECT_DOUBLE_EQ(u.keep, 0.8);
    EXPECT_DOUBLE_EQ(u.take, takes[i]);
    const GraphTensor& value = g.tensors[static_cast<size_t>(u.value)];
    ASSERT_GE(value.producer, 0);
    EXPECT_EQ(g.nodes[static_cast<size_t>(value.producer)].kind, ops::OpKind::Mean);
  }
  int selects = 0;
  for (const GraphNode& node : g.nodes) selects += node.kind == ops::OpKind::TrainEvalSelect;
  EXPECT_EQ(selects, 2);
  EXPECT_NE(g.str().find("state"), std::string::npos);

  // Buffers not passed as states cannot be updated.
  EXPECT_HAS(test_util::error_of([&] {
               trace([&] { return mean(bn.forward(x)); }, bn.named_parameters(), {{"x", x}});
             }),
             "not one of the model's buffers");
}

TEST(Tracer, GptBlocksTraceUnderTheirModulePaths) {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 4;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  std::shared_ptr<nn::GPT> gpt;
  {
    MetaGuard meta;
    gpt = std::make_shared<nn::GPT>(c);
  }
  Tensor idx = Tensor::meta({3, 4}, DType::I64), targets = Tensor::meta({3, 4}, DType::I64);
  const Graph g = trace([&] { return gpt->loss(idx, targets); }, gpt->named_parameters(),
                        {{"idx", idx}, {"targets", targets}});
  std::set<std::string> modules;
  for (const GraphNode& n : g.nodes) modules.insert(n.module);
  for (const char* m : {"wte", "blocks.0.ln1", "blocks.0.attn.qkv", "blocks.0.attn",
                        "blocks.1.mlp.fc", "blocks.1.mlp", "blocks.1", "ln_f", ""})
    EXPECT_TRUE(modules.count(m)) << "no op traced under '" << m << "'";
  // A block's residual adds run in the block itself.
  int adds_in_block = 0;
  for (const GraphNode& n : g.nodes)
    adds_in_block += n.kind == ops::OpKind::Add && n.module == "blocks.1";
  EXPECT_EQ(adds_in_block, 2);
}

// A bf16 graph does not depend on the device that traces it (a plan file made on a CPU serves
// GPU ranks): where the GPU has bf16 kernels the CPU lacks (attention's flash kernels, the
// elementwise ops), a trace still records the CPU's form, casts as nodes. (Shape-only tensors on
// a CUDA device need no GPU.)
TEST(Tracer, ABf16GraphIsTheSameWhicheverDeviceTracesIt) {
  auto graph_on = [](Device d) {
    const Tensor x = Tensor::meta({2, 2, 8, 16}, DType::F32, d);
    const Tensor w = Tensor::meta({16, 16}, DType::F32, d);
    return trace(
        [&] {
          ops::AutocastGuard mixed(DType::BF16);
          const Tensor h = linear(x, w);  // bf16 out
          const Tensor a = scaled_dot_product_attention(h, h, h, true);
          return mean(gelu(a) + x);  // gelu of bf16; bf16 + f32
        },
        {{"w", w}}, {{"x", x}});
  };
  const Graph cpu = graph_on(Device::cpu());
  const Graph gpu = graph_on(Device::cuda(0));
  ASSERT_EQ(gpu.nodes.size(), cpu.nodes.size());
  int casts = 0;
  for (size_t i = 0; i < cpu.nodes.size(); ++i) {
    EXPECT_EQ(gpu.nodes[i].kind, cpu.nodes[i].kind) << "node " << i;
    casts += cpu.nodes[i].kind == ops::OpKind::Cast;
  }
  EXPECT_GE(casts, 4);  // attention's operands and output, gelu's, the widening for the add
  for (size_t t = 0; t < cpu.tensors.size(); ++t) {
    EXPECT_EQ(gpu.tensors[t].dtype, cpu.tensors[t].dtype) << "tensor " << t;
  }
}

}  // namespace
}  // namespace hap::synth
