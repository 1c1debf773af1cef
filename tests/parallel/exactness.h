// Exactness against one device (DESIGN contract 1), shared by the executor and model tests: plan
// a traced graph with a strategy on this world's ranks, train it beside the same model on one
// device, and compare losses, gradients and parameters.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "autograd/grad_mode.h"
#include "models/clip.h"
#include "models/module.h"
#include "models/optim.h"
#include "ops/functional.h"
#include "parallel/executor.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"
#include "synth/synthesizer.h"

namespace hap::parallel::testing {

inline synth::Cluster cluster_for(int n) {
  // Shares 0.5/0.3/0.2 for 3 ranks; other sizes get uneven FLOP/s as well. The devices are slow
  // (MFLOP/s) so that splitting the work pays even for these tiny models and hap distributes;
  // with GFLOP/s devices their microseconds of compute cost less than one collective's latency
  // and replicating everything is (rightly) the cheapest plan.
  std::vector<double> flops = {5, 3, 2, 1.5};
  synth::Cluster c;
  c.name = "test";
  std::vector<synth::Device> devs;
  for (int i = 0; i < n; ++i)
    devs.push_back({"d" + std::to_string(i), "cpu", flops[i] * 1e6, int64_t{1} << 32, -1});
  c.add_node("n0", {1e9, 1e-5}, devs);
  return c;
}

// cluster_for(n) as two nodes, the first ceil(n / 2) ranks and the rest, joined by a link much
// slower than the one inside them (the hierarchical all-reduce is priced cheaper there).
inline synth::Cluster two_node_cluster_for(int n) {
  const synth::Cluster one = cluster_for(n);
  synth::Cluster c;
  c.name = "test-two-nodes";
  c.inter_node = {1e6, 1e-3};
  std::vector<synth::Device> first, second;
  for (int i = 0; i < n; ++i) (i < (n + 1) / 2 ? first : second).push_back(one.devices[i]);
  c.add_node("n0", {1e9, 1e-5}, first);
  if (!second.empty()) c.add_node("n1", {1e9, 1e-5}, second);
  return c;
}

// The box `slice` of a full tensor (all of it for an empty slice), as a fresh tensor.
inline Tensor box(const Tensor& full, const Shape& local, const LogicalSlice& slice) {
  return box_of(full, local, slice).clone();
}

// ||a - b|| / ||b||.
inline double rel_err(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * (x[i] - y[i]);
    den += y[i] * y[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// The default final check of compare_with_one_device.
inline void close_parameters(const std::string& name, const Tensor& got, const Tensor& expected) {
  EXPECT_LE(rel_err(got, expected), 1e-4) << name;
}

// The query, key and value biases of one attention layer as [3C]: query and value to a relative
// 1e-4, the key part to the absolute bound below.
inline void close_qkv_bias(const std::string& name, const Tensor& got, const Tensor& expected,
                           int64_t C, double lr, int steps) {
  EXPECT_LE(rel_err(narrow(got, 0, 0, C), narrow(expected, 0, 0, C)), 1e-4) << name << " (query)";
  EXPECT_LE(rel_err(narrow(got, 0, 2 * C, C), narrow(expected, 0, 2 * C, C)), 1e-4)
      << name << " (value)";
  std::vector<double> a = narrow(got, 0, C, C).to_vector(),
                      e = narrow(expected, 0, C, C).to_vector();
  for (int64_t i = 0; i < C; ++i)
    EXPECT_NEAR(a[i], e[i], 5 * lr * steps) << name << " key element " << i;
}

// The final check for models with attention (parameters named "*attn.qkv.bias", [3, C] holding
// the query, key and value biases): the key row has a gradient that is exactly zero in exact
// arithmetic (softmax is invariant to a per-row shift), so Adam turns rounding noise there into
// updates of size ~lr; that slice alone gets an absolute bound of its updates' size after
// `steps` steps at `lr` (as in the PyTorch oracle test, tests/oracle/test_gpt_oracle.cc). The
// query and value rows and every other parameter are held to a relative 1e-4.
inline std::function<void(const std::string&, const Tensor&, const Tensor&)>
close_parameters_with_attention(double lr, int steps) {
  return [=](const std::string& name, const Tensor& got, const Tensor& expected) {
    const std::string suffix = "attn.qkv.bias";
    const bool qkv_bias = name.size() >= suffix.size() &&
                          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (!qkv_bias || got.dim() != 2 || got.size(0) != 3)
      return close_parameters(name, got, expected);
    const int64_t C = got.size(1);
    close_qkv_bias(name, reshape(got, {3 * C}), reshape(expected, {3 * C}), C, lr, steps);
  };
}

// The plan must really distribute: tp shards some parameter, dp an input, hap either or slices
// a tensor to work on shards.
inline void expect_distributed(const synth::Graph& g, const synth::DistributedProgram& plan,
                               synth::Strategy strategy) {
  if (world().size() < 2) return;
  bool sharded = false;
  for (const synth::GraphTensor& t : g.tensors) {
    bool param = t.role == synth::TensorRole::Parameter, input = t.role == synth::TensorRole::Input;
    bool wanted = strategy == synth::Strategy::Tp    ? param
                  : strategy == synth::Strategy::Hap ? param || input
                                                     : input;
    if (wanted) sharded = sharded || plan.storage[t.id].kind == ops::PropKind::Sharded;
  }
  // hap may also read an input whole and slice it for free (Replicated -> Sharded).
  if (strategy == synth::Strategy::Hap)
    for (const synth::Instruction& in : plan.instructions)
      sharded = sharded || in.kind == synth::InstrKind::Slice;
  EXPECT_TRUE(sharded) << "the " << plan.strategy << " plan keeps everything replicated";
}

// Plans `g` with `strategy` on this world and trains it for `steps` AdamW steps beside `ref` on one
// device (global-norm clipping at `clip` when > 0; edit_plan, if given, changes the plan first),
// checking the loss at every step, every
// gradient at the first, and every parameter at the end (final_check(name, distributed, one
// device); by default a relative error of at most 1e-4). The model's buffers (running statistics)
// start from copies of ref's and are compared after the last step (relative 1e-4), as is the
// loss of one evaluation forward, which uses them (relative 1e-5).
inline void compare_with_one_device(
    const synth::Graph& g, synth::Strategy strategy, synth::SegmentMode segments, nn::Module& ref,
    const std::function<Tensor()>& ref_loss, const std::map<std::string, Tensor>& data, int steps,
    double lr, double clip,
    const std::function<void(const std::string&, const Tensor&, const Tensor&)>& final_check,
    const std::function<void(const synth::DistributedProgram&)>& check_plan = {},
    const std::optional<synth::Cluster>& cluster = std::nullopt,
    const std::function<void(synth::DistributedProgram&)>& edit_plan = {}) {
  synth::SynthesisOptions opt;
  opt.strategy = strategy;
  opt.segments = segments;
  opt.select_devices = false;  // every rank takes part (tiny models would run best on one)
  synth::DistributedProgram plan =
      synth::synthesize(g, cluster ? *cluster : cluster_for(world().size()), opt);
  if (edit_plan) edit_plan(plan);
  expect_distributed(g, plan, strategy);
  if (check_plan) check_plan(plan);

  // The distributed program runs on test_device() (HAP_TEST_DEVICE), the reference on the CPU.
  const Device device = test_device();
  Executor ex(g, plan, device_world());
  auto named = ref.named_parameters();
  ex.materialize_parameters(
      [&](const std::string& name, const Shape& local, const LogicalSlice& s) {
        for (auto& [n, p] : named)
          if (n == name) return box(p, local, s).to(device);
        ADD_FAILURE() << "unknown parameter " << name;
        return Tensor();
      });
  std::vector<std::pair<std::string, Tensor>> states;
  for (const auto& [name, b] : ref.named_buffers()) states.emplace_back(name, b.to(device).clone());
  ex.set_states(states);
  auto inputs = [&](const std::string& name, const Shape& local, const LogicalSlice& s) {
    return box(data.at(name), local, s).to(device);
  };
  optim::AdamW dist_opt(optim::weight_decay_groups(ex.parameters(), 0.1),
                        {lr, {0.9, 0.95}, 1e-8, 0.1});
  optim::AdamW ref_opt(optim::weight_decay_groups(named, 0.1), {lr, {0.9, 0.95}, 1e-8, 0.1});
  for (int step = 0; step < steps; ++step) {
    Tensor local = ex.forward(
        inputs, {.random_offset = static_cast<uint64_t>(step) * nn::kRandomStreamsPerStep});
    double loss = ex.global_loss(local);
    dist_opt.zero_grad();
    ex.backward(local);
    ref_opt.zero_grad();
    Tensor expected = ref_loss();
    expected.backward();
    EXPECT_LE(std::abs(loss - expected.item()) / std::abs(expected.item()), 1e-5)
        << "step " << step;
    if (step == 0) {
      for (auto& [name, p] : named) {
        EXPECT_LE(rel_err(ex.gathered_grad(name), p.grad()), 1e-4) << name;
      }
    }
    if (clip > 0) {
      double norm = ex.global_grad_norm();
      double ref_norm = nn::clip_grad_norm_(ref.parameters(), clip);
      EXPECT_LE(std::abs(norm - ref_norm) / ref_norm, 1e-4) << "step " << step;
      if (norm > clip) ex.scale_grads(clip / (norm + 1e-6));
    }
    dist_opt.step();
    ref_opt.step();
  }
  for (auto& [name, p] : named) final_check(name, ex.gathered_value(name), p);
  const auto ref_buffers = ref.named_buffers();
  ASSERT_EQ(ex.states().size(), ref_buffers.size());
  for (size_t i = 0; i < ref_buffers.size(); ++i) {
    EXPECT_EQ(ex.states()[i].first, ref_buffers[i].first);
    EXPECT_LE(rel_err(ex.states()[i].second, ref_buffers[i].second), 1e-4) << ref_buffers[i].first;
  }
  NoGradGuard no_grad;
  const double eval_loss = ex.global_loss(ex.forward(inputs, {.training = false}));
  ref.eval();
  const double ref_eval_loss = ref_loss().item();
  ref.train();
  EXPECT_LE(std::abs(eval_loss - ref_eval_loss) / std::abs(ref_eval_loss), 1e-5) << "evaluation";
}

}  // namespace hap::parallel::testing
