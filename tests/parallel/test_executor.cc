// Exactness of the SPMD executor (DESIGN contract 1): for every strategy, the distributed loss and
// every gathered gradient equal the single-device ones, with uneven ratios and sizes that do not
// divide, and parameters still match after 10 AdamW steps with dropout on.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "core/allocator.h"
#include "core/rng.h"
#include "exactness.h"
#include "models/clip.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "models/optim.h"
#include "ops/functional.h"
#include "parallel/executor.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"
#include "synth/shard_layout.h"
#include "synth/synthesizer.h"
#include "tests/factor_broadcast_util.h"
#include "tests/zero_storage_util.h"

namespace hap::parallel {
namespace {

using testing::box;
using testing::close_parameters;
using testing::cluster_for;
using testing::compare_with_one_device;
using testing::rel_err;
using testing::world;

// A two-layer classifier with dropout: logits = fc2(drop(gelu(fc1(x)))), loss = CE.
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  Mlp(int64_t d, int64_t h, int64_t k, double p) : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions(d, h)));
    drop = register_module("drop", std::make_shared<nn::Dropout>(nn::DropoutOptions(p)));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions(h, k)));
    reset_parameters(11);
    set_random_seed(11);
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor l = cross_entropy(fc2->forward(drop->forward(gelu(fc1->forward(x)))), y);
    if (is_training()) advance_random_step();
    return l;
  }
};

void check_mlp(synth::Strategy strategy, double dropout, int steps) {
  SCOPED_TRACE(synth::strategy_name(strategy));
  const int64_t B = 11, D = 7, H = 10, K = 5;
  Mlp ref(D, H, K, dropout), shape_model(D, H, K, dropout);
  Tensor x = randn({B, D}, 3, 0);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < B; ++i) labels.push_back((i * 7 + 3) % K);
  Tensor y = Tensor::from_vector(labels, {B});

  Tensor xm = Tensor::meta({B, D}, DType::F32), ym = Tensor::meta({B}, DType::I64);
  synth::Graph g = synth::trace([&] { return shape_model.loss(xm, ym); },
                                shape_model.named_parameters(), {{"x", xm}, {"y", ym}});
  compare_with_one_device(
      g, strategy, synth::SegmentMode::Single, ref, [&] { return ref.loss(x, y); },
      {{"x", x}, {"y", y}}, steps, 1e-2, 0.5, close_parameters);
}

TEST(Executor, MlpMatchesOneDeviceUnderDataParallelEven) {
  check_mlp(synth::Strategy::DpEv, 0.0, 1);
}
TEST(Executor, MlpMatchesOneDeviceUnderDataParallelProportional) {
  check_mlp(synth::Strategy::DpCp, 0.0, 1);
}
TEST(Executor, MlpMatchesOneDeviceUnderTensorParallel) { check_mlp(synth::Strategy::Tp, 0.0, 1); }
TEST(Executor, MlpMatchesOneDeviceUnderHap) { check_mlp(synth::Strategy::Hap, 0.0, 1); }
TEST(Executor, MlpParametersMatchAfterTenAdamWStepsWithDropout) {
  for (auto s :
       {synth::Strategy::DpEv, synth::Strategy::DpCp, synth::Strategy::Tp, synth::Strategy::Hap})
    check_mlp(s, 0.2, 10);
}

// A linear classifier on whole features, as a language model's head after its last norm.
struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> head;
  Classifier(int64_t d, int64_t k) : Module("Classifier") {
    head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions(d, k)));
    reset_parameters(12);
  }
  Tensor loss(const Tensor& x, const Tensor& y) { return cross_entropy(head->forward(x), y); }
};

// A classifier over a vocabulary that does not divide (37): under tp the head's weight is split
// over the vocabulary (its input is whole: column-parallel), so cross_entropy runs
// vocabulary-parallel (logits Sharded(1), targets whole) and must still give the one-device loss
// and gradients, ignored targets included.
TEST(Executor, VocabularyParallelCrossEntropyMatchesOneDevice) {
  const int64_t B = 9, D = 6, K = 37;
  for (int steps : {1, 4}) {
    Classifier ref(D, K), shape_model(D, K);
    Tensor x = randn({B, D}, 4, 0);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < B; ++i) labels.push_back(i == 4 ? -100 : (i * 11 + 5) % K);
    Tensor y = Tensor::from_vector(labels, {B});
    Tensor xm = Tensor::meta({B, D}, DType::F32), ym = Tensor::meta({B}, DType::I64);
    synth::Graph g = synth::trace([&] { return shape_model.loss(xm, ym); },
                                  shape_model.named_parameters(), {{"x", xm}, {"y", ym}});
    auto uses_vocab_parallel_ce = [&](const synth::DistributedProgram& plan) {
      if (world().size() < 2) return;
      const synth::Cluster cluster = cluster_for(world().size());
      const synth::CostModel cm(g, cluster);
      bool found = false;
      for (const synth::Instruction& in : plan.instructions) {
        if (in.kind != synth::InstrKind::Compute ||
            g.nodes[in.node].kind != ops::OpKind::CrossEntropy)
          continue;
        found = in.signature >= 0 && cm.input_prop(in.node, in.signature, 0) == Prop::sharded(1);
      }
      EXPECT_TRUE(found) << "the tp plan does not split cross_entropy over the vocabulary";
    };
    compare_with_one_device(
        g, synth::Strategy::Tp, synth::SegmentMode::Single, ref, [&] { return ref.loss(x, y); },
        {{"x", x}, {"y", y}}, steps, 1e-2, 0.5, close_parameters, uses_vocab_parallel_ce);
  }
}

// A model whose forward makes its own tensor (a position table): a graph constant, of which
// every rank reads its part under whatever split the plan gives it.
struct WithConstants : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  int64_t T, C, K;
  WithConstants(int64_t t, int64_t c, int64_t k) : Module("WithConstants"), T(t), C(c), K(k) {
    fc = register_module("fc", std::make_shared<nn::Linear>(nn::LinearOptions(c, k)));
    reset_parameters(5);
  }
  Tensor loss(const Tensor& x, const Tensor& y) {  // x: [B, T, C], y: [B * T]
    Tensor positions = reshape(Tensor::arange(T * C), {T, C}) * 0.01;
    return cross_entropy(reshape(fc->forward(x + positions), {-1, K}), y);
  }
};

TEST(Executor, TensorsMadeInsideForwardAreConstantsEveryRankReads) {
  const int64_t B = 5, T = 4, C = 6, K = 7;
  for (auto strategy : {synth::Strategy::DpEv, synth::Strategy::Tp, synth::Strategy::Hap}) {
    SCOPED_TRACE(synth::strategy_name(strategy));
    WithConstants ref(T, C, K), shape_model(T, C, K);
    Tensor x = randn({B, T, C}, 8, 0);
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < B * T; ++i) labels.push_back((i * 5 + 2) % K);
    Tensor y = Tensor::from_vector(labels, {B * T});
    Tensor xm = Tensor::meta({B, T, C}, DType::F32), ym = Tensor::meta({B * T}, DType::I64);
    synth::Graph g = synth::trace([&] { return shape_model.loss(xm, ym); },
                                  shape_model.named_parameters(), {{"x", xm}, {"y", ym}});
    bool constant = false;
    for (const synth::GraphTensor& t : g.tensors)
      constant = constant || t.role == synth::TensorRole::Constant;
    ASSERT_TRUE(constant);
    compare_with_one_device(
        g, strategy, synth::SegmentMode::Single, ref, [&] { return ref.loss(x, y); },
        {{"x", x}, {"y", y}}, 2, 1e-2, 0.0, close_parameters);
  }
}

nn::GPTConfig tiny_gpt(double dropout) {
  nn::GPTConfig c;
  c.vocab_size = 23;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 12;
  c.dropout = dropout;
  c.seed = 5;
  return c;
}

// The traced graph of GPT `cfg` on a [B, T] batch of ids and targets.
synth::Graph gpt_graph(const nn::GPTConfig& cfg, int64_t B, int64_t T) {
  std::shared_ptr<nn::GPT> shape_model;
  {
    MetaGuard meta;
    shape_model = std::make_shared<nn::GPT>(cfg);
  }
  Tensor im = Tensor::meta({B, T}, DType::I64), tm = Tensor::meta({B, T}, DType::I64);
  return synth::trace([&] { return shape_model->loss(im, tm); }, shape_model->named_parameters(),
                      {{"idx", im}, {"targets", tm}});
}

void check_gpt(synth::Strategy strategy, double dropout, int steps,
               synth::SegmentMode segments = synth::SegmentMode::Single,
               const std::function<void(nn::GPTConfig&)>& configure = {},
               const std::function<void(const synth::Graph&, const synth::DistributedProgram&)>&
                   check_plan = {},
               const std::optional<synth::Cluster>& cluster = std::nullopt) {
  SCOPED_TRACE(synth::strategy_name(strategy));
  const int64_t B = 7, T = 6;
  nn::GPTConfig cfg = tiny_gpt(dropout);
  if (configure) configure(cfg);
  nn::GPT ref(cfg);
  std::vector<int64_t> ids, tg;
  for (int64_t i = 0; i < B * T; ++i) {
    ids.push_back((i * 5 + 1) % cfg.vocab_size);
    tg.push_back(i % 9 == 4 ? -100 : (i * 3 + 2) % cfg.vocab_size);
  }
  Tensor idx = Tensor::from_vector(ids, {B, T}), targets = Tensor::from_vector(tg, {B, T});

  const synth::Graph g = gpt_graph(cfg, B, T);
  const double lr = 3e-3;
  compare_with_one_device(
      g, strategy, segments, ref, [&] { return ref.loss(idx, targets); },
      {{"idx", idx}, {"targets", targets}}, steps, lr, 0.0,
      testing::close_parameters_with_attention(lr, steps),
      [&](const synth::DistributedProgram& plan) {
        if (check_plan) check_plan(g, plan);
      },
      cluster);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// tp is Megatron's: the q, k, v projections and the MLP's first layer column-parallel (weights
// stored Sharded on their output features; q, k and v in whole heads), attention head-parallel,
// the attention and MLP output projections row-parallel, no activation all-gathered (one
// all-reduce after each row-parallel product); and it is exact. 4 heads of width 4 over 2-4 ranks
// with uneven ratios: some ranks hold more heads than others (or none).
TEST(Executor, GptTensorParallelIsHeadParallelAttentionAndExact) {
  constexpr int64_t kHeads = 4, kWidth = 16, kHeadDim = kWidth / kHeads;
  check_gpt(
      synth::Strategy::Tp, 0.0, 2, synth::SegmentMode::Single,
      [](nn::GPTConfig& c) {
        c.n_head = kHeads;
        c.n_embd = kWidth;
      },
      [](const synth::Graph& g, const synth::DistributedProgram& plan) {
        if (world().size() < 2) return;
        const synth::ShardLayout layout(g, plan.instructions, plan.ratios);
        int checked = 0;
        for (const synth::GraphTensor& t : g.tensors) {
          if (t.role != synth::TensorRole::Parameter) continue;
          const Prop p = plan.storage[static_cast<size_t>(t.id)];
          SCOPED_TRACE(t.name + " stored " + p.str());
          if (ends_with(t.name, "attn.qkv.weight") || ends_with(t.name, "attn.qkv.bias")) {
            EXPECT_TRUE(p == Prop::sharded(1));  // the output features of q, k and v alike
            for (int64_t len : layout.lengths(t.id, 1, 0)) EXPECT_EQ(len % kHeadDim, 0);
            ++checked;
          } else if (ends_with(t.name, "mlp.fc.weight")) {
            EXPECT_TRUE(p == Prop::sharded(0));  // column-parallel
            ++checked;
          } else if (ends_with(t.name, "attn.proj.weight") ||
                     ends_with(t.name, "mlp.proj.weight")) {
            EXPECT_TRUE(p == Prop::sharded(1));  // row-parallel
            ++checked;
          }
        }
        EXPECT_EQ(checked, 2 * 5);  // 2 blocks
        int heads_sharded = 0, row_parallel = 0;
        for (const synth::Instruction& in : plan.instructions) {
          if (in.kind == synth::InstrKind::AllGather) {
            const synth::GraphTensor& t = g.tensors[static_cast<size_t>(in.tensor)];
            EXPECT_EQ(t.role, synth::TensorRole::Parameter) << "an activation gathered: " << t.name;
          }
          if (in.kind != synth::InstrKind::Compute || in.signature < 0) continue;
          const synth::GraphNode& n = g.nodes[static_cast<size_t>(in.node)];
          const ops::ShardSignature sig =
              synth::signatures_of(g, n)[static_cast<size_t>(in.signature)];
          if (n.kind == ops::OpKind::Attention) {
            EXPECT_TRUE(sig.inputs[0] == Prop::sharded(1))
                << "attention's q [B, H, T, D]: by heads";
            heads_sharded += sig.inputs[0] == Prop::sharded(1);
          }
          if (n.kind == ops::OpKind::Linear && sig.outputs[0] == Prop::partial()) ++row_parallel;
        }
        EXPECT_EQ(heads_sharded, 2);
        EXPECT_EQ(row_parallel, 2 * 2);  // each block's attention and MLP output projections
      });
}

TEST(Executor, GptMatchesOneDeviceUnderDataParallelEven) {
  check_gpt(synth::Strategy::DpEv, 0.0, 1);
}
TEST(Executor, GptMatchesOneDeviceUnderDataParallelProportional) {
  check_gpt(synth::Strategy::DpCp, 0.0, 1);
}
TEST(Executor, GptMatchesOneDeviceUnderTensorParallel) { check_gpt(synth::Strategy::Tp, 0.0, 1); }
TEST(Executor, GptMatchesOneDeviceUnderHap) { check_gpt(synth::Strategy::Hap, 0.0, 1); }

TEST(Executor, GptMatchesOneDeviceWithOneRatioVectorPerBlock) {
  check_gpt(synth::Strategy::Hap, 0.0, 1, synth::SegmentMode::PerBlock);
}

TEST(Executor, GptParametersMatchAfterTenAdamWStepsWithDropout) {
  for (auto s :
       {synth::Strategy::DpEv, synth::Strategy::DpCp, synth::Strategy::Tp, synth::Strategy::Hap})
    check_gpt(s, 0.1, 10);
}

// Ranks on two nodes joined by a slow link: the gradient all-reduces (dp-cp, hap) and tp's
// activation all-reduces run hierarchically, and the loss, the gradients and the parameters
// after AdamW steps with dropout are still those of one device.
TEST(Executor, HierarchicalAllReducesMatchOneDevice) {
  const int n = world().size();
  if (n < 3) GTEST_SKIP() << "two nodes with one of several ranks need 3 ranks or more";
  for (auto strategy : {synth::Strategy::DpCp, synth::Strategy::Tp, synth::Strategy::Hap})
    check_gpt(
        strategy, 0.1, 3, synth::SegmentMode::Single, {},
        [strategy](const synth::Graph&, const synth::DistributedProgram& plan) {
          int hierarchical = 0, activations = 0;
          for (const synth::Instruction& in : plan.instructions) {
            if (in.method != CollectiveMethod::Hierarchical) continue;
            ++hierarchical;
            activations += in.kind == synth::InstrKind::AllReduce;
          }
          EXPECT_GT(hierarchical, 0) << "no all-reduce runs hierarchically";
          if (strategy == synth::Strategy::Tp) {
            EXPECT_GT(activations, 0);
          }
          ASSERT_EQ(plan.nodes.size(), static_cast<size_t>(world().size()));
          for (int r = 0; r < world().size(); ++r)
            EXPECT_EQ(plan.nodes[r], r < (world().size() + 1) / 2 ? 0 : 1);
        },
        testing::two_node_cluster_for(n));
}

// A [B, T] batch of ids and targets for a tiny GPT (the one the comparisons below run).
std::map<std::string, Tensor> tiny_batch(const nn::GPTConfig& cfg, int64_t B, int64_t T) {
  std::vector<int64_t> ids, tg;
  for (int64_t i = 0; i < B * T; ++i) {
    ids.push_back((i * 5 + 1) % cfg.vocab_size);
    tg.push_back((i * 3 + 2) % cfg.vocab_size);
  }
  return {{"idx", Tensor::from_vector(ids, {B, T})}, {"targets", Tensor::from_vector(tg, {B, T})}};
}

// The executor's parameters: this rank's shards of the reference model's, on `device`.
void load_reference(Executor& ex, const std::vector<std::pair<std::string, Tensor>>& named,
                    const Device& device) {
  ex.materialize_parameters(
      [&](const std::string& name, const Shape& local, const LogicalSlice& s) {
        for (const auto& [n, p] : named)
          if (n == name) return box(p, local, s).to(device);
        ADD_FAILURE() << "unknown parameter " << name;
        return Tensor();
      });
}

// The local loss of a forward on this rank's rows of `data`.
Tensor forward_on(Executor& ex, const std::map<std::string, Tensor>& data, const Device& device,
                  const ForwardOptions& options = {}) {
  return ex.forward(
      [&](const std::string& name, const Shape& local_shape, const LogicalSlice& s) {
        return box(data.at(name), local_shape, s).to(device);
      },
      options);
}

// One forward (dropout streams from `random_offset`) and backward of `plan` beside the reference
// model's parameters: what the forward left allocated on the host, the loss, every gradient.
struct StepResult {
  double held = 0, loss = 0;
  std::map<std::string, Tensor> grads;
  size_t recomputed_runs = 0;                         // Executor::recomputed_runs
  size_t values_held = 0;                             // Executor::values_held after the forward
  BackwardStats backward;                             // Executor::last_backward
  std::array<uint64_t, kNumCollectiveStats> calls{};  // each kind's calls (collective_stats)
  // All-gather calls of the forward and backward.
  uint64_t all_gathers() const { return calls[static_cast<size_t>(CollectiveStat::AllGather)]; }
};
StepResult run_step(const synth::Graph& g, const synth::DistributedProgram& plan,
                    const std::vector<std::pair<std::string, Tensor>>& named,
                    const std::map<std::string, Tensor>& data, uint64_t random_offset,
                    const ExecutorOptions& options = {}) {
  const Device device = testing::test_device();
  Executor ex(g, plan, testing::device_world(), options);
  load_reference(ex, named, device);
  ForwardOptions fo;
  fo.random_offset = random_offset;
  StepResult r;
  r.recomputed_runs = ex.recomputed_runs();
  reset_collective_stats();
  const size_t before = cpu_allocator_stats().allocated_bytes;
  Tensor local = forward_on(ex, data, device, fo);
  r.held = static_cast<double>(cpu_allocator_stats().allocated_bytes) - static_cast<double>(before);
  r.values_held = ex.values_held();
  r.loss = ex.global_loss(local);
  ex.backward(local);
  r.backward = ex.last_backward();
  for (int k = 0; k < kNumCollectiveStats; ++k)
    r.calls[static_cast<size_t>(k)] = collective_stats().calls[k];
  for (const auto& [name, p] : named)
    r.grads[name] = ex.gathered_grad(name).to(Device::cpu()).contiguous();
  return r;
}

// The same loss and every gradient bit for bit.
void expect_same_step(const StepResult& a, const StepResult& b, const std::string& what) {
  EXPECT_EQ(b.loss, a.loss) << what;
  for (const auto& [name, x] : a.grads) {
    const Tensor& y = b.grads.at(name);
    ASSERT_TRUE(y.defined()) << name;
    ASSERT_EQ(x.shape(), y.shape()) << name;
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(),
                          static_cast<size_t>(x.numel()) * dtype_size(x.dtype())),
              0)
        << name << ": " << what << " changed the gradient";
  }
}

// A strategy's program for graph g on all of this world's ranks.
synth::DistributedProgram plan_on_all(const synth::Graph& g, synth::Strategy strategy) {
  synth::SynthesisOptions opt;
  opt.strategy = strategy;
  opt.select_devices = false;
  return synth::synthesize(g, cluster_for(world().size()), opt);
}

// The tiny GPT (batch 7 x 6, dropout 0.2 unless given): its parameters, a batch, its graph and
// its dp-cp program on this world's ranks.
struct TinyDpCpGpt {
  explicit TinyDpCpGpt(double dropout = 0.2) : cfg(tiny_gpt(dropout)) {}
  nn::GPTConfig cfg;
  nn::GPT ref{cfg};
  std::vector<std::pair<std::string, Tensor>> named = ref.named_parameters();
  std::map<std::string, Tensor> data = tiny_batch(cfg, 7, 6);
  synth::Graph graph = gpt_graph(cfg, 7, 6);
  synth::DistributedProgram plan = plan_on_all(graph, synth::Strategy::DpCp);
};

// Segments recomputed in backward (their activations dropped after the forward, the segment run
// again under autograd::checkpoint when the backward pass reaches it) give the loss and every
// gradient bit for bit what the recorded program gives, with dropout on (the same masks drawn
// again), under every strategy's program (collectives inside the recomputed runs), recomputing
// every segment or every other one.
TEST(Executor, RecomputedSegmentsGiveTheRecordedGradientsBitForBit) {
  const TinyDpCpGpt m;
  const synth::Graph& g = m.graph;
  for (auto strategy : {synth::Strategy::Hap, synth::Strategy::DpCp, synth::Strategy::Tp}) {
    SCOPED_TRACE(synth::strategy_name(strategy));
    synth::DistributedProgram plan = plan_on_all(g, strategy);
    const size_t segments = plan.ratios.size();
    ASSERT_GE(segments, 3u);  // the blocks and the rest
    StepResult step[3];
    for (int mode = 0; mode < 3; ++mode) {
      plan.recompute.assign(mode == 0 ? 0 : segments, false);
      for (size_t s = 0; s < plan.recompute.size(); ++s) plan.recompute[s] = mode == 1 || s % 2;
      step[mode] = run_step(g, plan, m.named, m.data, 3);
      if (mode > 0) {
        EXPECT_GT(step[mode].recomputed_runs, 0u);
      }
    }
    // What the forward leaves alive for backward (host memory; on GPU ranks, the host's share).
    if (testing::test_device().is_cpu()) {
      EXPECT_LT(step[1].held, 0.7 * step[0].held)
          << "recomputing every segment kept " << step[1].held
          << " bytes after the forward, the recorded program " << step[0].held;
      EXPECT_LT(step[2].held, step[0].held);
    }
    for (int mode = 1; mode < 3; ++mode)
      expect_same_step(step[0], step[mode], "recomputation (mode " + std::to_string(mode) + ")");
  }
}

// The executor runs a recomputed segment's forward collectives again in the backward pass, as the
// cost model prices them (CostModel::recompute_factor): with every segment recomputed, each
// collective kind is called once more per forward instruction the cost model marks as run
// again (a reshard that moves its shards is an all-gather), and no other collective more often.
TEST(Executor, RecomputationRunsAgainTheForwardCollectivesTheCostModelPricesAgain) {
  const TinyDpCpGpt m(0.0);
  const synth::Graph& g = m.graph;
  for (auto strategy : {synth::Strategy::Tp, synth::Strategy::Hap}) {
    SCOPED_TRACE(synth::strategy_name(strategy));
    synth::DistributedProgram plan = plan_on_all(g, strategy);
    plan.recompute.clear();
    const StepResult plain = run_step(g, plan, m.named, m.data, 3);
    plan.recompute.assign(plan.ratios.size(), true);
    const StepResult again = run_step(g, plan, m.named, m.data, 3);
    ASSERT_GT(again.recomputed_runs, 0u);
    synth::CostModel cm(g, cluster_for(world().size()));
    cm.set_recompute(plan.node_segment, plan.recompute);
    std::array<uint64_t, kNumCollectiveStats> expected{};
    auto count = [&](CollectiveStat k) { ++expected[static_cast<size_t>(k)]; };
    for (const synth::Instruction& in : plan.instructions) {
      // The collectives an op makes itself (OpDef::own_collectives, which the cost model prices
      // with it: the cross-entropy's sum of target counts over split rows, its gather of each
      // rank's log-sum-exp over a split vocabulary): the forward's again where recomputed.
      if (in.kind == synth::InstrKind::Compute && cm.recomputed(in.node) && in.signature >= 0)
        for (const ops::OwnCollective& c :
             synth::own_collectives_of(g, g.nodes[static_cast<size_t>(in.node)],
                                       cm.signatures(in.node)[static_cast<size_t>(in.signature)]))
          if (c.forward)
            count(c.kind == ops::OwnCollective::Kind::AllGather ? CollectiveStat::AllGather
                                                                : CollectiveStat::ReduceScatter);
      if (cm.recompute_factor(in) == 1.0) continue;
      switch (in.kind) {
        case synth::InstrKind::AllGather:
          count(CollectiveStat::AllGather);
          break;
        case synth::InstrKind::ReduceScatter:
          count(CollectiveStat::ReduceScatter);
          break;
        case synth::InstrKind::AllReduce:
          count(CollectiveStat::AllReduce);
          break;
        case synth::InstrKind::AllToAll:
          count(CollectiveStat::AllToAll);
          break;
        case synth::InstrKind::Reshard:  // priced (and run) where the shard lengths differ
          if (in.cost_s > 0) count(CollectiveStat::AllGather);
          break;
        default:
          ADD_FAILURE() << "run again: " << synth::instr_name(in.kind);
      }
    }
    for (int k = 0; k < kNumCollectiveStats; ++k) {
      const size_t i = static_cast<size_t>(k);
      EXPECT_EQ(again.calls[i] - plain.calls[i], expected[i])
          << collective_stat_name(static_cast<CollectiveStat>(k)) << ": " << plain.calls[i]
          << " calls without recomputation, " << again.calls[i] << " with";
    }
    // Megatron's blocks all-reduce their activations in the forward pass.
    if (strategy == synth::Strategy::Tp && world().size() > 1) {
      EXPECT_GT(expected[static_cast<size_t>(CollectiveStat::AllReduce)], 0u);
    }
    expect_same_step(plain, again, "recomputation");
  }
}

// forward() drops each value from the executor's value map after its last forward reader
// (autograd holds what backward needs): only the loss stays, under every strategy's program and
// with recomputed segments, and the step is the one that kept them, bit for bit. (A bf16 GPT on
// two CPU ranks held 333 / 501 MiB at its peak with every value kept to the end of the step,
// 234 / 332 MiB since; f32 299 / 436 -> 269 / 383 MiB.)
TEST(Executor, ForwardKeepsNoValueButTheLoss) {
  const TinyDpCpGpt m;
  for (auto strategy : {synth::Strategy::DpCp, synth::Strategy::Tp, synth::Strategy::Hap}) {
    SCOPED_TRACE(synth::strategy_name(strategy));
    synth::DistributedProgram plan = plan_on_all(m.graph, strategy);
    const StepResult kept = run_step(m.graph, plan, m.named, m.data, 2);
    EXPECT_EQ(kept.values_held, 1u);
    plan.recompute.assign(plan.ratios.size(), false);
    for (size_t s = 0; s < plan.recompute.size(); s += 2) plan.recompute[s] = true;
    const StepResult recomputed = run_step(m.graph, plan, m.named, m.data, 2);
    EXPECT_EQ(recomputed.values_held, 1u);
    EXPECT_GT(recomputed.recomputed_runs, 0u);
    expect_same_step(kept, recomputed, "recomputing every other segment");
  }
}

// The tiny GPT's dp-cp program (batch 7 x 6, dropout 0.1, per-block segments), edited by `edit`:
// 3 AdamW steps match one device.
// The program's all-gathers and reduce-scatters made hierarchical, its ranks in two nodes (the
// first half and the rest).
void make_gathers_hierarchical(synth::DistributedProgram& plan) {
  const int n = static_cast<int>(plan.ratios.at(0).size());
  plan.nodes.clear();
  for (int r = 0; r < n; ++r) plan.nodes.push_back(r < (n + 1) / 2 ? 0 : 1);
  for (synth::Instruction& in : plan.instructions)
    if (in.kind == synth::InstrKind::AllGather || in.kind == synth::InstrKind::ReduceScatter)
      in.method = CollectiveMethod::Hierarchical;
}

void expect_edited_dp_cp_gpt_matches_one_device(
    const std::function<void(const synth::Graph&, synth::DistributedProgram&)>& edit) {
  const int64_t B = 7, T = 6;
  const nn::GPTConfig cfg = tiny_gpt(0.1);
  nn::GPT ref(cfg);
  const std::map<std::string, Tensor> data = tiny_batch(cfg, B, T);
  const synth::Graph g = gpt_graph(cfg, B, T);
  const double lr = 3e-3;
  const int steps = 3;
  compare_with_one_device(
      g, synth::Strategy::DpCp, synth::SegmentMode::PerBlock, ref,
      [&] { return ref.loss(data.at("idx"), data.at("targets")); }, data, steps, lr, 0.0,
      testing::close_parameters_with_attention(lr, steps), {}, std::nullopt,
      [&](synth::DistributedProgram& plan) { edit(g, plan); });
}

// ZeRO storage (synth::SearchSpace::zero_storage): the dp-cp program with its parameters stored
// Sharded(0), all-gathered before use (the copies kept for backward, or not kept and gathered
// again there, also inside segments recomputed in backward), their gradients reduce-scattered
// and their AdamW steps on the shards: 3 steps with dropout match one device; also with the
// gathers and reduce-scatters hierarchical, the ranks in two nodes.
TEST(Executor, ZeroStorageMatchesOneDevice) {
  for (auto [regather, recompute, hierarchical] :
       {std::tuple{false, false, false}, std::tuple{true, false, false},
        std::tuple{true, true, false}, std::tuple{false, false, true},
        std::tuple{true, true, true}}) {
    SCOPED_TRACE(std::string(regather ? "gathered again in backward" : "gathered copies kept") +
                 (recompute ? ", every segment recomputed" : "") +
                 (hierarchical ? ", hierarchical" : ""));
    expect_edited_dp_cp_gpt_matches_one_device(
        [&](const synth::Graph& g, synth::DistributedProgram& plan) {
          EXPECT_GE(test_util::apply_zero_storage(g, plan, regather), 4);
          if (recompute) plan.recompute.assign(plan.ratios.size(), true);
          if (hierarchical) make_gathers_hierarchical(plan);
        });
  }
}

// ZeRO storage's gathers run in buckets (ExecutorOptions::bucket_parameter_gathers: one
// all-gather per bucket started at the start of the forward, with overlap nonblocking and
// completed where first read, the gradients' reduce-scatters in the backward pass's buckets,
// overlapped or after it) give the loss and every gradient bit for bit
// what one differentiable all-gather per parameter gives, padded and grouped, and gather in
// fewer collectives.
TEST(Executor, BucketedParameterGathersEqualOneGatherEachBitForBit) {
  const TinyDpCpGpt m;
  const synth::Graph& g = m.graph;
  const auto& named = m.named;
  const auto& data = m.data;
  synth::DistributedProgram plan = m.plan;
  const int zero = test_util::apply_zero_storage(g, plan, false);
  ASSERT_GE(zero, 4);
  for (auto [method, overlap] :
       {std::pair{CollectiveMethod::Grouped, true}, std::pair{CollectiveMethod::Padded, true},
        std::pair{CollectiveMethod::Grouped, false},
        std::pair{CollectiveMethod::Hierarchical, true},
        std::pair{CollectiveMethod::Hierarchical, false}}) {
    SCOPED_TRACE(std::string(synth::method_name(method)) + (overlap ? ", overlapped" : ""));
    if (method == CollectiveMethod::Hierarchical) make_gathers_hierarchical(plan);
    for (synth::Instruction& in : plan.instructions)
      if (in.kind == synth::InstrKind::AllGather) in.method = method;
    ExecutorOptions one_each, bucketed;
    one_each.bucket_parameter_gathers = false;
    one_each.overlap_grad_comm = bucketed.overlap_grad_comm = overlap;
    bucketed.bucket_bytes = 4096;  // several buckets of each kind
    // Several gather buckets too: with overlap, in flight together, each completed where the
    // forward pass first reads one of its parameters.
    bucketed.gather_bucket_bytes = 4096;
    const StepResult a = run_step(g, plan, named, data, 3, one_each);
    const StepResult b = run_step(g, plan, named, data, 3, bucketed);
    expect_same_step(a, b, "bucketing the parameter gathers");
    EXPECT_EQ(a.backward.scatter_buckets, 0);
    if (world().size() > 1) {
      EXPECT_GE(b.backward.scatter_buckets, 2);
      EXPECT_LT(b.all_gathers(), a.all_gathers());
      EXPECT_GE(b.all_gathers(), 2u);
      if (overlap) {
        EXPECT_GE(b.backward.started_during_backward, 1);
      }
    }
  }
  // With the default bucket size (every parameter fits one), one all-gather gathers them all
  // (one each before: the other all-gathers are the program's own, of activations), and the
  // parameters whose all-reduces sit between the gathered ones (the q, k, v stacks, read through
  // views) do not split the reduce-scatters: one bucket of each.
  ExecutorOptions one_each;
  one_each.bucket_parameter_gathers = false;
  const StepResult a = run_step(g, plan, named, data, 3, one_each);
  const StepResult c = run_step(g, plan, named, data, 3);
  if (world().size() > 1) {
    EXPECT_EQ(c.all_gathers(), a.all_gathers() - static_cast<uint64_t>(zero) + 1);
    EXPECT_EQ(c.backward.scatter_buckets, 1);
    EXPECT_EQ(c.backward.buckets, 2);
  }
}

// Sufficient factor broadcasting (synth::InstrKind::FactorBroadcast): the dp-cp program with the
// weight and bias gradients of its products computed whole on every rank from their inputs and
// output gradients all-gathered in backward (padded and grouped, also inside segments
// recomputed in backward) instead of all-reduced: 3 AdamW steps with dropout match one device.
TEST(Executor, FactorBroadcastMatchesOneDevice) {
  for (auto [method, recompute] : {std::pair{synth::CollectiveMethod::Grouped, false},
                                   std::pair{synth::CollectiveMethod::Padded, false},
                                   std::pair{synth::CollectiveMethod::Grouped, true}}) {
    SCOPED_TRACE(std::string(synth::method_name(method)) +
                 (recompute ? ", every segment recomputed" : ""));
    expect_edited_dp_cp_gpt_matches_one_device(
        [&](const synth::Graph& g, synth::DistributedProgram& plan) {
          if (plan.ratios.at(0).size() < 2) return;  // one rank: nothing is sharded
          EXPECT_GE(test_util::apply_factor_broadcast(g, plan, method), 4);
          if (recompute) plan.recompute.assign(plan.ratios.size(), true);
        });
  }
}

// hap planned with `opt` on cluster `c` for the tiny GPT (dropout 0.1): `check` looks at the
// program, and 3 AdamW steps of it match one device.
void expect_synthesized_gpt_matches_one_device(
    const synth::Cluster& c, synth::SynthesisOptions opt,
    const std::function<void(const synth::Graph&, const synth::DistributedProgram&)>& check) {
  const int64_t B = 7, T = 6;
  const nn::GPTConfig cfg = tiny_gpt(0.1);
  nn::GPT ref(cfg);
  const std::map<std::string, Tensor> data = tiny_batch(cfg, B, T);
  const synth::Graph g = gpt_graph(cfg, B, T);
  opt.select_devices = false;
  opt.segments = synth::SegmentMode::Single;
  const synth::DistributedProgram hap = synth::synthesize(g, c, opt);
  check(g, hap);
  const double lr = 3e-3;
  const int steps = 3;
  compare_with_one_device(
      g, synth::Strategy::Hap, synth::SegmentMode::Single, ref,
      [&] { return ref.loss(data.at("idx"), data.at("targets")); }, data, steps, lr, 0.0,
      testing::close_parameters_with_attention(lr, steps), {}, c,
      [&](synth::DistributedProgram& plan) { plan = hap; });
}

// A hap program the search made with ZeRO storage (parallel.zero_storage on, on devices whose
// optimizer step is slow enough that updating shards pays): it stores some parameter sharded
// and gathers it for use, and 3 AdamW steps with dropout match one device.
TEST(Executor, HapProgramsWithZeroStorageMatchOneDevice) {
  if (world().size() < 2) GTEST_SKIP() << "ZeRO storage needs 2 ranks or more";
  synth::Cluster c = cluster_for(world().size());
  for (synth::Device& d : c.devices) d.update_s_per_param = 1e-5;
  synth::SynthesisOptions opt;
  opt.zero_storage = synth::ZeroStorage::On;
  expect_synthesized_gpt_matches_one_device(
      c, opt, [](const synth::Graph& g, const synth::DistributedProgram& hap) {
        int gathered = 0;
        for (const synth::Instruction& in : hap.instructions)
          if (in.kind == synth::InstrKind::AllGather &&
              g.tensors[in.tensor].role == synth::TensorRole::Parameter && in.from.dim == 0 &&
              hap.storage[in.tensor] == synth::Prop::sharded(0))
            ++gathered;
        ASSERT_GT(gathered, 0) << "the search stored no parameter sharded for a whole read";
      });
}

// The same with every parameter stored sharded (parallel.zero_storage: all) on two nodes joined
// by a slow link: the search gathers them hierarchically, and 3 AdamW steps with dropout match one
// device.
TEST(Executor, HierarchicalZeroStorageProgramsMatchOneDevice) {
  if (world().size() < 3)
    GTEST_SKIP() << "two nodes with one of several ranks need 3 ranks or more";
  synth::SynthesisOptions opt;
  opt.zero_storage = synth::ZeroStorage::All;
  expect_synthesized_gpt_matches_one_device(
      testing::two_node_cluster_for(world().size()), opt,
      [](const synth::Graph& g, const synth::DistributedProgram& hap) {
        int hierarchical = 0;
        for (const synth::Instruction& in : hap.instructions)
          if (in.kind == synth::InstrKind::AllGather &&
              g.tensors[in.tensor].role == synth::TensorRole::Parameter)
            hierarchical += in.method == CollectiveMethod::Hierarchical;
        ASSERT_GT(hierarchical, 0) << "no parameter is gathered hierarchically";
      });
}

// Gathering the parameters again in backward gives the loss and every gradient bit for bit what
// keeping the gathered copies gives, and keeps less alive after the forward pass (the copies).
TEST(Executor, ZeroStorageGatheredAgainKeepsLessAndGivesTheSameGradients) {
  const TinyDpCpGpt m;
  const synth::Graph& g = m.graph;
  const auto& named = m.named;
  const auto& data = m.data;
  const synth::DistributedProgram& dp = m.plan;
  StepResult step[2];
  double gathered_bytes = 0;
  for (int regather = 0; regather < 2; ++regather) {
    synth::DistributedProgram plan = dp;
    ASSERT_GE(test_util::apply_zero_storage(g, plan, regather == 1), 4);
    if (regather == 0)
      for (const synth::Instruction& in : plan.instructions)
        if (in.kind == synth::InstrKind::AllGather &&
            g.tensors[in.tensor].role == synth::TensorRole::Parameter)
          gathered_bytes += static_cast<double>(g.tensors[in.tensor].bytes());
    step[regather] = run_step(g, plan, named, data, 5);
  }
  if (testing::test_device().is_cpu()) {
    EXPECT_LE(step[1].held, step[0].held - 0.9 * gathered_bytes)
        << "gathering again kept " << step[1].held
        << " bytes after the forward, keeping the copies " << step[0].held
        << " (the gathered copies: " << gathered_bytes << " bytes)";
  }
  expect_same_step(step[0], step[1], "gathering again");
}

// The overlapped gradient all-reduces (started from inside the backward pass, one small bucket at
// a time, on a communicator of their own) give every gradient bit for bit what the blocking ones
// after the backward pass give; under tp the backward pass's own all-reduces run on the main
// communicator meanwhile. Exactness against one device with overlap (the default) is every other
// test here.
TEST(Executor, OverlappedGradientAllReducesEqualTheBlockingOnesBitForBit) {
  const int64_t B = 7, T = 6;
  const nn::GPTConfig cfg = tiny_gpt(0.0);
  nn::GPT ref(cfg);
  const std::map<std::string, Tensor> data = tiny_batch(cfg, B, T);
  const synth::Graph g = gpt_graph(cfg, B, T);
  const Device device = testing::test_device();
  const auto named = ref.named_parameters();
  for (auto [strategy, two_nodes] :
       {std::pair{synth::Strategy::DpCp, false}, std::pair{synth::Strategy::Tp, false},
        std::pair{synth::Strategy::DpCp, true}}) {
    // On two nodes the buckets run hierarchically (three phases on communicators of their own).
    if (two_nodes && world().size() < 3) continue;
    SCOPED_TRACE(std::string(synth::strategy_name(strategy)) + (two_nodes ? " on two nodes" : ""));
    synth::SynthesisOptions opt;
    opt.strategy = strategy;
    const synth::DistributedProgram plan = synth::synthesize(
        g, two_nodes ? testing::two_node_cluster_for(world().size()) : cluster_for(world().size()),
        opt);
    if (two_nodes) {
      for (const synth::Instruction& in : plan.instructions) {
        if (in.kind == synth::InstrKind::GradAllReduce) {
          EXPECT_EQ(in.method, CollectiveMethod::Hierarchical);
        }
      }
    }
    int grad_all_reduces = 0;
    for (const synth::Instruction& in : plan.instructions)
      grad_all_reduces += in.kind == synth::InstrKind::GradAllReduce;
    std::map<std::string, Tensor> grads[2];
    for (int overlap = 0; overlap < 2; ++overlap) {
      ExecutorOptions eo;
      eo.overlap_grad_comm = overlap == 1;
      eo.bucket_bytes = 256;  // a bucket or two per parameter: many all-reduces in flight in turn
      Executor ex(g, plan, testing::device_world(), eo);
      load_reference(ex, named, device);
      Tensor local = forward_on(ex, data, device);
      ex.backward(local);
      for (const auto& [name, p] : named)
        grads[overlap][name] = ex.gathered_grad(name).to(Device::cpu()).contiguous();
      const BackwardStats& st = ex.last_backward();
      if (world().size() > 1 && grad_all_reduces > 0) {
        EXPECT_GT(st.buckets, 1);
        if (overlap == 1) {
          EXPECT_GE(st.started_during_backward, 1) << "no all-reduce overlapped the backward pass";
        } else {
          EXPECT_EQ(st.started_during_backward, 0);
        }
      }
    }
    for (const auto& [name, p] : named) {
      const Tensor& a = grads[0][name];
      const Tensor& b = grads[1][name];
      ASSERT_EQ(a.shape(), b.shape()) << name;
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(),
                            static_cast<size_t>(a.numel()) * dtype_size(a.dtype())),
                0)
          << name << ": the overlapped all-reduce changed the gradient";
    }
  }
}

}  // namespace
}  // namespace hap::parallel
