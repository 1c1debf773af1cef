// The cost model's pricing: collectives by collective_terms (what hap-profile fits links with),
// per-collective link figures, the optimizer update per stored element, memory bandwidth on top
// of FLOPs, and the tp baseline's sharded linear weights.
#include <gtest/gtest.h>

#include <algorithm>

#include "ops/functional.h"
#include "synth/synthesizer.h"
#include "tests/test_util.h"

namespace hap::synth {
namespace {

// x: [12, 10] (input) -> linear(w: [6, 10], b: [6]) -> gelu -> mean.
Graph small_graph() {
  Tensor x = Tensor::meta({12, 10}, DType::F32);
  Tensor w = Tensor::meta({6, 10}, DType::F32), b = Tensor::meta({6}, DType::F32);
  return trace([&] { return mean(gelu(linear(x, w, b))); }, {{"w", w}, {"b", b}}, {{"x", x}});
}

Cluster cluster3(Link link) {
  Cluster c;
  c.name = "three";
  std::vector<Device> devs;
  const double flops[] = {4e9, 2e9, 1e9};
  for (int i = 0; i < 3; ++i) {
    Device d;
    d.name = "d" + std::to_string(i);
    d.type = "cpu";
    d.flops_per_s = flops[i];
    d.memory_bytes = int64_t{1} << 30;
    devs.push_back(d);
  }
  c.add_node("n", link, devs);
  c.validate();
  return c;
}

int tensor_named(const Graph& g, const std::string& name) {
  for (const GraphTensor& t : g.tensors)
    if (t.name == name) return t.id;
  ADD_FAILURE() << "no tensor " << name;
  return -1;
}

// Factor broadcasting at the linear under data parallelism (x and y split along the batch):
// one all-gather of both factors (packed side by side: their shards have one length per rank),
// padded or grouped, plus the whole weight-gradient product at the slowest device. Signatures
// that read the weight split, or make a Partial, do not allow it; nor does one device.
TEST(CostModel, FactorBroadcastGathersBothFactorsAtOnceAndRunsTheWholeProduct) {
  const Link link{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  Graph g = small_graph();
  Cluster c = cluster3(link);
  CostModel cm(g, c);
  const GraphNode& lin = g.nodes[0];
  ASSERT_EQ(lin.kind, ops::OpKind::Linear);
  int dp = -1, allowed = 0;
  for (int sig = -1; sig < static_cast<int>(cm.signatures(lin.id).size()); ++sig) {
    if (!cm.factor_broadcast_allowed(lin.id, sig)) continue;
    ++allowed;
    EXPECT_EQ(cm.input_prop(lin.id, sig, 1), Prop::replicated());
    EXPECT_NE(cm.output_prop(lin.id, sig, 0).kind, PropKind::Partial);
    if (cm.input_prop(lin.id, sig, 0) == Prop::sharded(0)) dp = sig;
  }
  ASSERT_GE(dp, 0) << "the data-parallel signature does not allow factor broadcasting";
  EXPECT_LT(allowed, static_cast<int>(cm.signatures(lin.id).size()) + 1);
  const double bytes =
      static_cast<double>(g.tensors[lin.inputs[0]].bytes() + g.tensors[lin.outputs[0]].bytes());
  const double product = lin.flops / 1e9;  // the slowest device's whole dW product
  const std::vector<double> r = {0.5, 0.3, 0.2};
  for (CollectiveMethod m : {CollectiveMethod::Padded, CollectiveMethod::Grouped}) {
    const CollectiveTerms t = collective_terms(InstrKind::AllGather, m, 3, bytes, 0.5);
    EXPECT_NEAR(
        cm.factor_broadcast(lin.id, dp, m).eval(r),
        t.latency_terms * link.latency_s + t.byte_terms / link.bandwidth_bytes_per_s + product,
        1e-15)
        << method_name(m);
  }
  double best = 0;
  const CollectiveMethod m = cm.best_factor_broadcast(lin.id, dp, r, &best);
  EXPECT_EQ(best, cm.factor_broadcast(lin.id, dp, m).eval(r));
  Cluster one = cluster3(link);
  one.devices.resize(1);
  one.nodes[0].devices.resize(1);
  EXPECT_FALSE(CostModel(g, one).factor_broadcast_allowed(lin.id, dp));
}

TEST(CostModel, CollectivesArePricedByCollectiveTerms) {
  const Link link{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  Graph g = small_graph();
  Cluster c = cluster3(link);
  CostModel cm(g, c);
  const int x = tensor_named(g, "x");  // an input: no gradient flows back, one pass only
  ASSERT_FALSE(cm.requires_grad(x));
  const double bytes = static_cast<double>(g.tensors[x].bytes());
  const std::vector<double> r = {0.5, 0.3, 0.2};
  struct Case {
    InstrKind kind;
    CollectiveMethod method;
  };
  for (const Case& k : {Case{InstrKind::AllGather, CollectiveMethod::Padded},
                        Case{InstrKind::AllGather, CollectiveMethod::Grouped},
                        Case{InstrKind::ReduceScatter, CollectiveMethod::Padded},
                        Case{InstrKind::ReduceScatter, CollectiveMethod::Grouped},
                        Case{InstrKind::AllReduce, CollectiveMethod::None},
                        Case{InstrKind::AllToAll, CollectiveMethod::None}}) {
    SCOPED_TRACE(std::string(instr_name(k.kind)) + " " + method_name(k.method));
    const CollectiveTerms t = collective_terms(k.kind, k.method, 3, bytes, 0.5);
    EXPECT_GT(t.latency_terms, 0);
    EXPECT_GT(t.byte_terms, 0);
    EXPECT_NEAR(cm.communication(k.kind, x, k.method).eval(r),
                t.latency_terms * link.latency_s + t.byte_terms / link.bandwidth_bytes_per_s,
                1e-15);
  }
  // Padded moves every shard at the largest one's size; grouped moves the tensor once.
  EXPECT_DOUBLE_EQ(
      collective_terms(InstrKind::AllGather, CollectiveMethod::Padded, 3, 100, 0.5).byte_terms,
      100);
  EXPECT_DOUBLE_EQ(
      collective_terms(InstrKind::AllGather, CollectiveMethod::Grouped, 3, 100, 0.5).byte_terms,
      100);
  EXPECT_DOUBLE_EQ(
      collective_terms(InstrKind::AllGather, CollectiveMethod::Padded, 3, 100, 0.8).byte_terms,
      160);
  EXPECT_DOUBLE_EQ(
      collective_terms(InstrKind::AllReduce, CollectiveMethod::None, 1, 100, 1).byte_terms, 0);
}

// The collectives the cross-entropy's sharded run makes itself (ops/defs/loss.cc): rows split
// with a mean sum the target counts in the forward (sum_over_ranks: a regular all-gather of one
// 8-byte count per rank; the backward's scale comes through autograd, with no collective); the
// vocabulary split gathers each row's log-sum-exp per rank (grouped, as ShardContext::all_gather
// does) and reduce-scatters its gradient in the backward. They are priced into the node's compute
// (constant: every device waits as long) and into each device's time in recost, not into its own
// device compute times; a sum of the losses needs no count, one device nothing. (That the
// executor runs these: Executor.RecomputationRunsAgainTheForwardCollectivesTheCostModelPrices-
// Again, where a recomputed node's forward ones run twice.)
TEST(CostModel, TheCrossEntropysOwnCollectivesArePricedWithIt) {
  const Link link{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  auto graph = [](ops::Reduction reduction) {
    Tensor x = Tensor::meta({12, 10}, DType::F32), w = Tensor::meta({7, 10}, DType::F32);
    Tensor y = Tensor::meta({12}, DType::I64);
    return trace(
        [&] {
          return cross_entropy(linear(x, w, Tensor()), y,
                               ops::CrossEntropyAttrs{.reduction = reduction});
        },
        {{"w", w}}, {{"x", x}, {"y", y}});
  };
  auto price = [&](InstrKind kind, CollectiveMethod method, double bytes) {
    const CollectiveTerms t = collective_terms(kind, method, 3, bytes, 1.0 / 3);
    return t.latency_terms * link.latency_s + t.byte_terms / link.bandwidth_bytes_per_s;
  };
  const Graph mean_graph = graph(ops::Reduction::Mean);
  const Cluster c = cluster3(link);
  const CostModel cm(mean_graph, c);
  int node = -1;
  for (const GraphNode& n : mean_graph.nodes)
    if (n.kind == ops::OpKind::CrossEntropy) node = n.id;
  ASSERT_GE(node, 0);
  int rows = -1, vocab = -1;
  for (int s = 0; s < static_cast<int>(cm.signatures(node).size()); ++s) {
    const Prop p = cm.input_prop(node, s, 0);
    if (p.kind == PropKind::Sharded) (p.dim == 0 ? rows : vocab) = s;
  }
  ASSERT_GE(rows, 0);
  ASSERT_GE(vocab, 0);
  const double sums = price(InstrKind::AllGather, CollectiveMethod::Padded, 3 * 8);
  EXPECT_NEAR(cm.own_collectives_s(node, rows), sums, 1e-15);
  const double lse = 12 * 4 * 3;  // [12, 3] f32
  EXPECT_NEAR(cm.own_collectives_s(node, vocab),
              price(InstrKind::AllGather, CollectiveMethod::Grouped, lse) +
                  price(InstrKind::ReduceScatter, CollectiveMethod::Grouped, lse),
              1e-15);
  EXPECT_EQ(cm.own_collectives_s(node, -1), 0.0);
  // Their backward parts (step_time's split): the count's sum is the forward's alone, the
  // log-sum-exps' reduce-scatter the backward's.
  EXPECT_EQ(cm.own_collectives_backward_s(node, rows), 0.0);
  EXPECT_NEAR(cm.own_collectives_backward_s(node, vocab),
              price(InstrKind::ReduceScatter, CollectiveMethod::Grouped, lse), 1e-15);
  const std::vector<double> r = {0.5, 0.3, 0.2};
  const std::vector<double> share = cm.compute_shares(node, rows, r);
  const std::vector<double> alone = cm.compute_device_s_at(node, share);
  EXPECT_NEAR(cm.compute(node, rows).eval(share),
              *std::max_element(alone.begin(), alone.end()) + sums, 1e-15);
  // recost: the instruction costs its slowest device's compute plus the collectives.
  std::vector<Instruction> instrs(1);
  instrs[0].kind = InstrKind::Compute;
  instrs[0].node = node;
  instrs[0].signature = rows;
  const double step = recost(cm, instrs, {r});
  EXPECT_NEAR(instrs[0].cost_s, *std::max_element(alone.begin(), alone.end()) + sums, 1e-15);
  EXPECT_NEAR(step, instrs[0].cost_s, 1e-15);

  const Graph sum_graph = graph(ops::Reduction::Sum);
  const CostModel sum_cm(sum_graph, c);
  int checked = 0;
  for (const GraphNode& n : sum_graph.nodes) {
    if (n.kind != ops::OpKind::CrossEntropy) continue;
    for (int s = 0; s < static_cast<int>(sum_cm.signatures(n.id).size()); ++s) {
      if (sum_cm.input_prop(n.id, s, 0) != Prop::sharded(0)) continue;
      EXPECT_EQ(sum_cm.own_collectives_s(n.id, s), 0.0);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 1);
  Cluster one;
  one.name = "one";
  one.add_node("n", link, {c.devices[0]});
  one.validate();
  const CostModel one_cm(mean_graph, one);
  EXPECT_EQ(one_cm.own_collectives_s(node, rows), 0.0);
}

TEST(CostModel, PerCollectiveLinkFiguresReplaceTheLinksOwnForThatCollectiveOnly) {
  Link plain{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  Link profiled = plain;
  profiled.collective[static_cast<int>(Collective::AllReduce)] = {.bandwidth_bytes_per_s = 2e8,
                                                                  .latency_s = 3e-4};
  Graph g = small_graph();
  Cluster a = cluster3(plain), b = cluster3(profiled);
  CostModel ca(g, a), cb(g, b);
  const int x = tensor_named(g, "x");
  const std::vector<double> r = {0.5, 0.3, 0.2};
  const double bytes = static_cast<double>(g.tensors[x].bytes());
  const CollectiveTerms t =
      collective_terms(InstrKind::AllReduce, CollectiveMethod::None, 3, bytes, 0.5);
  EXPECT_NEAR(cb.communication(InstrKind::AllReduce, x, CollectiveMethod::None).eval(r),
              t.latency_terms * 3e-4 + t.byte_terms / 2e8, 1e-15);
  EXPECT_EQ(ca.communication(InstrKind::AllGather, x, CollectiveMethod::Padded).eval(r),
            cb.communication(InstrKind::AllGather, x, CollectiveMethod::Padded).eval(r));
}

TEST(CostModel, BottleneckTakesTheSlowestFiguresPerCollective) {
  Cluster c;
  c.name = "two-nodes";
  auto dev = [](const std::string& n) {
    Device d;
    d.name = n;
    d.type = "cpu";
    d.flops_per_s = 1e9;
    d.memory_bytes = 1 << 20;
    return d;
  };
  Link fast{.bandwidth_bytes_per_s = 1e10, .latency_s = 1e-6};
  fast.collective[static_cast<int>(Collective::AllToAll)] = {.bandwidth_bytes_per_s = 1e8,
                                                             .latency_s = 1e-3};
  c.add_node("a", fast, {dev("a0"), dev("a1")});
  c.add_node("b", {.bandwidth_bytes_per_s = 5e9, .latency_s = 2e-6}, {dev("b0"), dev("b1")});
  c.inter_node = {.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-5};
  c.validate();
  const Link all = c.bottleneck();
  EXPECT_DOUBLE_EQ(all.bandwidth_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(all.for_collective(Collective::AllToAll).bandwidth_bytes_per_s, 1e8);
  EXPECT_DOUBLE_EQ(all.for_collective(Collective::AllToAll).latency_s, 1e-3);
  EXPECT_DOUBLE_EQ(all.for_collective(Collective::AllGather).bandwidth_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(c.bottleneck({2, 3}).for_collective(Collective::AllToAll).bandwidth_bytes_per_s,
                   5e9);
}

TEST(CostModel, UpdateCostsEachDevicesStoredElements) {
  Graph g = small_graph();
  Cluster c = cluster3({.bandwidth_bytes_per_s = 1e9, .latency_s = 0});
  const int w = tensor_named(g, "w");  // 60 elements
  const std::vector<double> r = {0.5, 0.3, 0.2};
  EXPECT_EQ(CostModel(g, c).update(w, Prop::replicated()).eval(r), 0.0);  // not profiled
  c.devices[0].update_s_per_param = 1e-9;
  c.devices[1].update_s_per_param = 2e-9;
  c.devices[2].update_s_per_param = 4e-9;
  CostModel cm(g, c);
  EXPECT_NEAR(cm.update(w, Prop::replicated()).eval(r), 60 * 4e-9, 1e-20);  // the slowest, whole
  EXPECT_NEAR(cm.update(w, Prop::sharded(0)).eval(r),
              std::max({0.5 * 60 * 1e-9, 0.3 * 60 * 2e-9, 0.2 * 60 * 4e-9}), 1e-20);
  // Every parameter the search stores gets an update instruction at that price.
  int nseg = 1;
  std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
  SearchResult a = search_program(cm, {r}, seg, SearchSpace{});
  int updates = 0;
  for (const Instruction& in : a.instructions) {
    if (in.kind != InstrKind::Update) continue;
    ++updates;
    EXPECT_EQ(in.to, a.storage[in.tensor]);
    EXPECT_NEAR(in.cost_s, cm.update(in.tensor, in.to).eval(r), 1e-20);
  }
  EXPECT_EQ(updates, 2);
}

TEST(CostModel, MemoryBandwidthAddsEachOpsBytesToItsFlops) {
  Graph g = small_graph();
  const Cluster plain = cluster3({.bandwidth_bytes_per_s = 1e9, .latency_s = 0});
  Cluster c = plain;
  c.devices[1].memory_bandwidth_bytes_per_s = 5e8;
  const CostModel flops_only(g, plain);  // holds a reference: each model its own cluster
  const CostModel with_bytes(g, c);
  for (const GraphNode& n : g.nodes) {
    EXPECT_GT(with_bytes.step_bytes(n.id), 0) << ops::op_name(n.kind);
    EXPECT_DOUBLE_EQ(flops_only.device_compute_s(n.id, 1), with_bytes.step_flops(n.id) / 2e9);
    EXPECT_DOUBLE_EQ(with_bytes.device_compute_s(n.id, 1),
                     with_bytes.step_flops(n.id) / 2e9 + with_bytes.step_bytes(n.id) / 5e8);
    EXPECT_DOUBLE_EQ(with_bytes.device_compute_s(n.id, 0), with_bytes.step_flops(n.id) / 4e9);
  }
}

// Kernel overheads (Device::kernel_overhead_s, which hap-profile fits): every forward and
// backward kernel call of a node costs a device that much whatever its share, on top of the
// share's FLOPs and bytes; a device with no rows of a split node pays nothing for it, and a node
// that splits nothing costs every device its whole time and overheads.
TEST(CostModel, KernelOverheadsArePaidPerCallByEveryDeviceWithAShare) {
  Graph g = small_graph();
  Cluster c = cluster3({.bandwidth_bytes_per_s = 1e9, .latency_s = 0});
  const double overhead[] = {1e-6, 3e-6, 5e-6};
  for (int d = 0; d < 3; ++d) c.devices[d].kernel_overhead_s = overhead[d];
  const CostModel cm(g, c);
  // linear (w needs a gradient), gelu and mean each run forward and backward.
  int calls = 0;
  for (const GraphNode& n : g.nodes) {
    EXPECT_EQ(cm.kernel_calls(n.id), 2) << ops::op_name(n.kind);
    calls += cm.kernel_calls(n.id);
    for (int d = 0; d < 3; ++d) {
      EXPECT_DOUBLE_EQ(cm.fixed_compute_s(n.id, d), 2 * overhead[d]);
    }
  }
  EXPECT_EQ(cm.step_kernel_calls(), calls);
  const GraphNode& lin = g.nodes[0];
  ASSERT_EQ(lin.kind, ops::OpKind::Linear);
  // A signature that splits the linear's 12 rows, and one that splits nothing.
  int rows_sig = -2;
  for (int sig = 0; sig < static_cast<int>(cm.signatures(lin.id).size()); ++sig)
    if (cm.split_dim(lin.id, sig) == std::make_pair(lin.outputs[0], int64_t{0})) rows_sig = sig;
  ASSERT_GE(rows_sig, 0);
  const std::vector<double> r = {0.5, 0.25, 0.25};  // 6, 3 and 3 rows
  std::vector<double> t = cm.compute_device_s(lin.id, rows_sig, r);
  for (int d = 0; d < 3; ++d) {
    EXPECT_NEAR(t[d], cm.device_compute_s(lin.id, d) * r[d] + 2 * overhead[d], 1e-18) << d;
  }
  EXPECT_DOUBLE_EQ(cm.compute_s(lin.id, rows_sig, r), *std::max_element(t.begin(), t.end()));
  const LinearCost lc = cm.compute(lin.id, rows_sig);
  ASSERT_EQ(lc.fixed.size(), 3u);
  EXPECT_DOUBLE_EQ(lc.eval(r), cm.compute_s(lin.id, rows_sig, r));
  // No rows: no kernel on that device.
  t = cm.compute_device_s(lin.id, rows_sig, {0.5, 0.5, 0.0});
  EXPECT_EQ(t[2], 0.0);
  EXPECT_NEAR(t[1], cm.device_compute_s(lin.id, 1) * 0.5 + 2 * overhead[1], 1e-18);
  // Unsplit: the whole node and its overheads on every device, the slowest's is the cost.
  t = cm.compute_device_s(lin.id, -1, r);
  double worst = 0;
  for (int d = 0; d < 3; ++d) {
    EXPECT_NEAR(t[d], cm.device_compute_s(lin.id, d) + 2 * overhead[d], 1e-18) << d;
    worst = std::max(worst, t[d]);
  }
  EXPECT_DOUBLE_EQ(cm.compute_s(lin.id, -1, r), worst);
  // Recomputed, a node runs its forward kernel once more.
  CostModel again(g, c);
  again.set_recompute(std::vector<int>(g.nodes.size(), 0), {true});
  EXPECT_EQ(again.kernel_calls(lin.id), 3);
  EXPECT_DOUBLE_EQ(again.fixed_compute_s(lin.id, 2), 3 * overhead[2]);
  // Without overheads the fixed parts vanish.
  const Cluster plain = cluster3({.bandwidth_bytes_per_s = 1e9, .latency_s = 0});
  const CostModel none(g, plain);
  EXPECT_TRUE(none.compute(lin.id, rows_sig).fixed.empty());
  EXPECT_EQ(none.fixed_compute_s(lin.id, 0), 0.0);
}

// Compute between two synchronizing instructions runs on each device one kernel after another:
// recost prices the stretch at its slowest device's sum (each instruction's cost_s is its time
// on that device), not the sum of each instruction's slowest device, which differ where the
// devices' kernel overheads differ from their rates. The ratio LP minimizes the same sums: it
// gives the device that pays more per kernel fewer rows, and the step it predicts is no slower
// than the even split's.
TEST(CostModel, ComputeBetweenCollectivesIsPricedAtItsSlowestDevicesSum) {
  // x: [64, 128] -> linear 128x128 -> gelu -> linear 128x128 -> mean: a data-parallel program
  // has no collective before the loss but the gradient all-reduces, which overlap.
  Tensor x = Tensor::meta({64, 128}, DType::F32);
  Tensor w1 = Tensor::meta({128, 128}, DType::F32), w2 = Tensor::meta({128, 128}, DType::F32);
  const Graph g = trace([&] { return mean(linear(gelu(linear(x, w1)), w2)); },
                        {{"w1", w1}, {"w2", w2}}, {{"x", x}});
  Cluster c;
  c.name = "two";
  std::vector<Device> devs(2);
  for (int d = 0; d < 2; ++d) {
    devs[d].name = "d" + std::to_string(d);
    devs[d].type = "cpu";
    devs[d].flops_per_s = 1e9;
    devs[d].memory_bytes = int64_t{1} << 30;
  }
  devs[1].kernel_overhead_s = 1e-4;  // d1 pays for each kernel call
  c.add_node("n", {.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6}, devs);
  c.validate();
  const CostModel cm(g, c);
  int nseg = 1;
  const std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
  const std::vector<std::vector<double>> even = {{0.5, 0.5}};
  const SearchSpace dp{.inputs_must_shard_dim0 = true, .shard_parameters = false};
  const SearchResult a = search_program(cm, even, seg, dp);
  // With more rows on d0 its products are the slower, d1's overheads make the small ops slower.
  const std::vector<std::vector<double>> skewed = {{0.55, 0.45}};
  std::vector<Instruction> instrs = a.instructions;
  recost(cm, instrs, skewed);
  std::vector<double> per_device(2, 0.0);
  double compute = 0, maxima = 0;
  int computes = 0;
  for (const Instruction& in : instrs) {
    if (in.kind != InstrKind::Compute) {
      // (nothing that synchronizes before the last compute)
      EXPECT_TRUE(computes == static_cast<int>(g.nodes.size()) ||
                  in.kind == InstrKind::GradAllReduce || in.kind == InstrKind::ToPartial ||
                  in.kind == InstrKind::Update)
          << instr_name(in.kind);
      continue;
    }
    ++computes;
    const std::vector<double> t = cm.compute_device_s(in.node, in.signature, skewed[0]);
    for (int d = 0; d < 2; ++d) per_device[d] += t[d];
    compute += in.cost_s;
    maxima += std::max(t[0], t[1]);
  }
  EXPECT_NEAR(compute, std::max(per_device[0], per_device[1]), 1e-15);
  EXPECT_LT(compute, maxima * (1 - 1e-3));  // the two differ here
  std::vector<std::vector<double>> r;
  ASSERT_TRUE(optimize_ratios(cm, a.instructions, a.storage, nseg, 1e-3, &r));
  EXPECT_LT(r[0][1], 0.5 - 0.02);
  std::vector<Instruction> at_lp = a.instructions, at_even = a.instructions;
  EXPECT_LT(recost(cm, at_lp, r), recost(cm, at_even, even));
  // Without the overheads the two devices are alike: an even split.
  Cluster plain = c;
  plain.devices[1].kernel_overhead_s = 0;
  const CostModel pcm(g, plain);
  ASSERT_TRUE(optimize_ratios(pcm, a.instructions, a.storage, nseg, 1e-3, &r));
  EXPECT_NEAR(r[0][1], 0.5, 1e-6);
}

// A reshard between two segments whose ratios give the same whole-row shard lengths moves
// nothing (the executor hands the same shard on): zero time. Otherwise it costs what the executor
// does, an all-gather under the old ratios, whatever the size of the ratio change.
TEST(CostModel, ReshardIsFreeWhenTheShardLengthsAgreeAndAnAllGatherOtherwise) {
  const Link link{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  Graph g = small_graph();
  Cluster c = cluster3(link);
  CostModel cm(g, c);
  const int x = tensor_named(g, "x");  // [12, 10]
  const std::vector<double> a = {0.5, 0.3, 0.2};
  const std::vector<double> nearly_a = {0.5 + 1e-11, 0.3, 0.2 - 1e-11};
  const std::vector<double> b = {0.25, 0.25, 0.5};
  CollectiveMethod m = CollectiveMethod::Padded;
  EXPECT_FALSE(cm.reshard_moves(x, 0, a, nearly_a));
  EXPECT_EQ(cm.reshard_s(x, 0, a, nearly_a, &m), 0.0);
  EXPECT_EQ(m, CollectiveMethod::None);
  // 12 rows: [6, 4, 2] vs [3, 3, 6].
  ASSERT_TRUE(cm.reshard_moves(x, 0, a, b));
  double gather = 0;
  const CollectiveMethod best = cm.best_method(InstrKind::AllGather, x, a, &gather);
  EXPECT_GT(gather, 0.0);
  EXPECT_DOUBLE_EQ(cm.reshard_s(x, 0, a, b, &m), gather);
  EXPECT_EQ(m, best);
  // Ratios that differ but round to the same lengths on this dimension: 10 columns, [5, 3, 2].
  EXPECT_FALSE(cm.reshard_moves(x, 1, a, {0.51, 0.29, 0.2}));
  EXPECT_TRUE(cm.reshard_moves(x, 0, a, {0.6, 0.2, 0.2}));  // 12 rows: [7, 3, 2] (rounded)
}

// Devices compute on whole rows: with 2 rows over 4 devices two devices get a row each and the
// others none, so the slowest device's time is that of a whole row, not of a quarter batch.
TEST(CostModel, ComputeIsPricedOnWholeRowShards) {
  Tensor x = Tensor::meta({2, 10}, DType::F32);
  Tensor w = Tensor::meta({6, 10}, DType::F32);
  Graph g = trace([&] { return mean(linear(x, w)); }, {{"w", w}}, {{"x", x}});
  Cluster c;
  c.name = "four";
  std::vector<Device> devs;
  for (int i = 0; i < 4; ++i)
    devs.push_back({"d" + std::to_string(i), "cpu", 1e9, int64_t{1} << 30, -1});
  c.add_node("n", {1e9, 1e-6}, devs);
  c.validate();
  CostModel cm(g, c);
  const int lin = 0;
  ASSERT_EQ(g.nodes[lin].kind, ops::OpKind::Linear);
  int batch_split = -1;
  for (size_t s = 0; s < cm.signatures(lin).size(); ++s)
    if (cm.signatures(lin)[s].outputs[0] == Prop::sharded(0)) batch_split = static_cast<int>(s);
  ASSERT_GE(batch_split, 0);
  const std::vector<double> even(4, 0.25);
  const std::vector<double> shares = cm.compute_shares(lin, batch_split, even);
  EXPECT_EQ(shares, (std::vector<double>{0.5, 0.5, 0.0, 0.0}));
  const double whole = cm.device_compute_s(lin, 0);
  EXPECT_DOUBLE_EQ(cm.compute_s(lin, batch_split, even), whole * 0.5);
  EXPECT_DOUBLE_EQ(cm.compute(lin, batch_split).eval(even), whole * 0.25);  // the LP's relaxation
  // The all-Replicated signature splits nothing: every device does the whole node.
  EXPECT_DOUBLE_EQ(cm.compute_s(lin, -1, even), whole);
}

TEST(Synthesizer, TensorParallelBaselineShardsEveryLinearWeight) {
  Graph g = small_graph();
  // Slow links: replicating everything would be cheaper, but tp must still split the weights.
  Cluster c = cluster3({.bandwidth_bytes_per_s = 1e3, .latency_s = 1.0});
  SynthesisOptions opt;
  opt.strategy = Strategy::Tp;
  DistributedProgram p = synthesize(g, c, opt);
  EXPECT_EQ(p.storage[tensor_named(g, "w")].kind, PropKind::Sharded);
  EXPECT_EQ(p.storage[tensor_named(g, "x")].kind, PropKind::Replicated);
}

}  // namespace
}  // namespace hap::synth

namespace hap::synth {
namespace {

// x [rows, a] -> matmul(w1 [a, b]) -> matmul(w2 [b, a]) -> mean, with its two product nodes (in
// order) and its mean node.
struct TwoProducts {
  Graph graph;
  int mm[2] = {-1, -1};
  int mean_node = -1;
};
TwoProducts two_products(int64_t rows, int64_t a, int64_t b) {
  Tensor x = Tensor::meta({rows, a}, DType::F32);
  Tensor w1 = Tensor::meta({a, b}, DType::F32), w2 = Tensor::meta({b, a}, DType::F32);
  TwoProducts m;
  m.graph =
      trace([&] { return mean(matmul(matmul(x, w1), w2)); }, {{"w1", w1}, {"w2", w2}}, {{"x", x}});
  for (const GraphNode& n : m.graph.nodes) {
    if (n.kind == ops::OpKind::MatMul) (m.mm[0] < 0 ? m.mm[0] : m.mm[1]) = n.id;
    if (n.kind == ops::OpKind::Mean) m.mean_node = n.id;
  }
  HAP_CHECK(m.mm[1] >= 0 && m.mean_node >= 0, "two_products: traced graph lacks its ops");
  return m;
}

// A computation of `node` and a gradient all-reduce of `tensor`, costed by hand.
Instruction compute(int node, double cost) {
  Instruction in;
  in.kind = InstrKind::Compute;
  in.node = node;
  in.cost_s = cost;
  return in;
}
// A parameter stored Sharded(0) gathered whole for use (ZeRO storage).
Instruction param_gather(int tensor, double cost) {
  Instruction in;
  in.kind = InstrKind::AllGather;
  in.tensor = tensor;
  in.from = Prop::sharded(0);
  in.to = Prop::replicated();
  in.method = CollectiveMethod::Grouped;
  in.cost_s = cost;
  return in;
}
Instruction grad(int tensor, double cost) {
  Instruction in;
  in.kind = InstrKind::GradAllReduce;
  in.tensor = tensor;
  in.from = Prop::partial();
  in.to = Prop::replicated();
  in.method = CollectiveMethod::Grouped;
  in.cost_s = cost;
  return in;
}

// step_time: the gradient all-reduces run on a channel of their own, one bucket at a time, each
// from the moment the backward pass has completed its gradient; worked by hand on two products
// whose weights (4.5 MB each) fill a bucket each. x -> matmul(w1) -> matmul(w2) -> mean.
TEST(CostModel, StepTimeHidesGradientAllReducesBehindTheRestOfTheBackwardPass) {
  const TwoProducts m = two_products(4, 1100, 1024);
  const Graph& g = m.graph;
  const int(&mm)[2] = m.mm;
  const int mean_node = m.mean_node;
  ASSERT_GT(g.tensors[tensor_named(g, "w1")].bytes(), kGradBucketBytes);
  Cluster c = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  const std::vector<Instruction> instrs = {compute(mm[0], 3), compute(mm[1], 3),
                                           compute(mean_node, 0), grad(tensor_named(g, "w1"), 2),
                                           grad(tensor_named(g, "w2"), 2)};
  for (bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    const CostModel cm(g, c, 2, overlap);
    // Backward of x @ w1 is one product (x needs no gradient), of h @ w2 two.
    ASSERT_NEAR(cm.backward_fraction(mm[0]), 1.0 / 2, 1e-12);
    ASSERT_NEAR(cm.backward_fraction(mm[1]), 2.0 / 3, 1e-12);
    const StepTime st = step_time(cm, instrs);
    // Each bucket pays a ring all-reduce's latency, 2 (P - 1) link latencies, where each
    // instruction's cost counts half of it (one share per parameter): L more in all.
    const double L = 2 * (3 - 1) * 1e-6;
    ASSERT_DOUBLE_EQ(cm.collective_latency_s(InstrKind::GradAllReduce, CollectiveMethod::Grouped),
                     L);
    EXPECT_NEAR(st.shared_latency_s, -L, 1e-12);
    if (!overlap) {
      EXPECT_NEAR(st.step_s, 10.0 + L, 1e-12);
      EXPECT_DOUBLE_EQ(st.hidden_s, 0.0);
      continue;
    }
    // Forward 1.5 + 1; backward of the second product ends at 4.5, of the first at 6. w2's
    // gradient is reduced over [4.5, 6.5 + L/2], w1's over [6.5 + L/2, 8.5 + L]: 1.5 s hidden.
    EXPECT_NEAR(st.step_s, 8.5 + L, 1e-12);
    EXPECT_NEAR(st.hidden_s, 1.5, 1e-12);
  }
}

// A parameter stored Sharded and gathered whole, kept for backward (ZeRO storage), is gathered
// in a bucket started at the start of the forward pass and its gradient reduce-scattered in a
// bucket of the backward pass (parallel::Executor): step_time puts the all-gather (half of the
// instruction's cost) on a channel that runs while the forward pass computes what comes before
// the parameter's first reader, and the reduce-scatter (the other half) on the buckets'
// channel, where the backward pass hides it, as it does a gradient all-reduce. Gathered again
// in backward, both halves run in the passes. Worked by hand on x -> matmul(w1) -> matmul(w2)
// -> mean with w2 stored Sharded(0).
TEST(CostModel, BucketedParameterGathersHideTheirReduceScattersBehindTheBackwardPass) {
  const Link link{.bandwidth_bytes_per_s = 2e9, .latency_s = 3e-6};
  const TwoProducts m = two_products(4, 1100, 1024);
  const Graph& g = m.graph;
  const Cluster c = cluster3(link);
  const Instruction gather = param_gather(tensor_named(g, "w2"), 2);
  ASSERT_TRUE(bucketed_parameter_gather(g, gather));
  std::vector<Instruction> instrs = {compute(m.mm[0], 3), grad(tensor_named(g, "w1"), 2), gather,
                                     compute(m.mm[1], 3), compute(m.mean_node, 0)};
  // The gather's bucket and the reduce-scatter's each pay one latency (P log2 P link latencies
  // in the grouped form), which the instruction's halves count too: they cost 1 each. w1's
  // all-reduce bucket pays a ring's latency L, its cost half of it (one share of two
  // parameters).
  const CostModel cm(g, c);
  const double L = cm.collective_latency_s(InstrKind::GradAllReduce, CollectiveMethod::Grouped);
  ASSERT_DOUBLE_EQ(L, 2 * (3 - 1) * 3e-6);
  ASSERT_DOUBLE_EQ(cm.collective_latency_s(InstrKind::AllGather, CollectiveMethod::Grouped),
                   3 * 2 * 3e-6);
  // Forward: w2's gather (1) from 0 to 1 while the first product computes (1.5), then the
  // second product (1): 2.5. Backward: the second product 2.5 -> 4.5, the first 4.5 -> 6. w2's
  // reduce-scatter (1) from 4.5 to 5.5, w1's all-reduce (2 + L/2) from 6 to 8 + L/2.
  StepTime st = step_time(cm, instrs);
  EXPECT_NEAR(st.step_s, 8 + L / 2, 1e-12);
  EXPECT_NEAR(st.hidden_s, 2, 1e-12);
  EXPECT_NEAR(st.shared_latency_s, -L / 2, 1e-12);
  EXPECT_NEAR(step_time(CostModel(g, c, 2, false), instrs).step_s, 10 + L / 2, 1e-12);
  // Gathered again in backward: its forward half runs in the forward pass (1.5 + 1 + 1), its
  // backward half in the backward pass (5.5 -> 6.5, then the first product to 8), w1's
  // all-reduce from 8 to 10 + L/2.
  instrs[2].regather = true;
  ASSERT_FALSE(bucketed_parameter_gather(g, instrs[2]));
  st = step_time(cm, instrs);
  EXPECT_NEAR(st.step_s, 10 + L / 2, 1e-12);
  EXPECT_NEAR(st.hidden_s, 0, 1e-12);
}

// A link whose collectives pass only partly while the devices compute (Link::overlap: a CPU rank
// advances MPI between its ops): the channels move at that share of their pace while the passes
// compute and at full pace after. The two cases above, worked by hand with overlap 0.5 and 0.
TEST(CostModel, StepTimeMovesTheChannelsAtTheLinksOverlapShareWhileThePassesCompute) {
  const TwoProducts m = two_products(4, 1100, 1024);
  const Graph& g = m.graph;
  const int w1 = tensor_named(g, "w1"), w2 = tensor_named(g, "w2");
  for (double overlap : {0.5, 0.0}) {
    SCOPED_TRACE("overlap " + std::to_string(overlap));
    const Cluster c = cluster3(Link{
        .bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6, .collective = {}, .overlap = overlap});
    const CostModel cm(g, c);
    ASSERT_EQ(cm.overlap(), overlap);
    const double L = cm.collective_latency_s(InstrKind::GradAllReduce, CollectiveMethod::Grouped);
    // Gradient all-reduces: backward of the second product 2.5 -> 4.5, of the first 4.5 -> 6.
    // w2's bucket (2 + L/2) moves 1.5 * overlap by 6 and the rest after; w1's follows it.
    StepTime st = step_time(cm, {compute(m.mm[0], 3), compute(m.mm[1], 3), compute(m.mean_node, 0),
                                 grad(w1, 2), grad(w2, 2)});
    EXPECT_NEAR(st.step_s, 6 + (2 - 1.5 * overlap) + 2 + L, 1e-12);
    EXPECT_NEAR(st.hidden_s, 1.5 * overlap, 1e-12);
    // A bucketed parameter gather (1 of its cost 2 in the forward pass): it moves 1.5 * overlap
    // while the first product's forward computes, and the second product waits for the rest.
    const Instruction gather = param_gather(w2, 2);
    ASSERT_TRUE(bucketed_parameter_gather(g, gather));
    st = step_time(cm, {compute(m.mm[0], 3), grad(w1, 2), gather, compute(m.mm[1], 3),
                        compute(m.mean_node, 0)});
    const double forward = 1.5 + std::max(0.0, 1 - 1.5 * overlap) + 1;
    // Backward: 2 + 1.5 after the forward pass; w2's reduce-scatter (1) ready when the second
    // product's backward ends, moving at the overlap share until the first product's ends.
    const double backward_end = forward + 3.5;
    const double scatter_end = backward_end + (1 - 1.5 * overlap);
    EXPECT_NEAR(st.step_s, scatter_end + 2 + L / 2, 1e-12);
    EXPECT_NEAR(st.hidden_s, 10 + L / 2 - st.step_s, 1e-12);
    if (overlap == 0) {
      EXPECT_NEAR(st.hidden_s, 0, 1e-12);
    }
  }
  // Out of [0, 1]: refused where the cluster is checked.
  Cluster bad = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  for (Node& n : bad.nodes) n.link.overlap = 1.5;
  EXPECT_HAS(test_util::error_of([&] { bad.validate(); }), "overlap: expected a number in [0, 1]");
}

// The channels share the link with the passes' own collectives, which come first (the pass
// waits on them): a bucket of the backward pass waits while the backward pass runs a collective's
// adjoint, and the forward pass's gather channel does not move while the forward pass runs a
// collective. Worked by hand on x -> matmul(w1) -> h -> matmul(w2) -> mean (cluster3, a ring
// all-reduce's latency L per bucket, each gradient's cost counting half of it).
TEST(CostModel, StepTimeSharesTheLinkWithThePassesOwnCollectives) {
  const TwoProducts m = two_products(4, 1100, 1024);
  const Graph& g = m.graph;
  const Cluster c = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  const CostModel cm(g, c);
  const double L = cm.collective_latency_s(InstrKind::GradAllReduce, CollectiveMethod::Grouped);
  ASSERT_DOUBLE_EQ(L, 2 * (3 - 1) * 1e-6);
  const auto gather = param_gather;
  const int h = g.nodes[m.mm[0]].outputs[0];
  const int w1 = tensor_named(g, "w1"), w2 = tensor_named(g, "w2");
  {
    // h (which needs a gradient) gathered between the products: forward 1.5 + 1 + 1 = 3.5;
    // backward: the second product 3.5 -> 5.5, the gather's adjoint 5.5 -> 6.5 (the link busy),
    // the first product 6.5 -> 8. w2's bucket (2 + L/2), ready at 5.5, waits for the link until
    // 6.5 and ends at 8.5 + L/2; w1's, ready at 8, ends at 10.5 + L. Were the link free, w2's
    // would have ended at 7.5 + L/2 and w1's at 10 + L/2.
    const std::vector<Instruction> instrs = {
        compute(m.mm[0], 3),     grad(w1, 2), gather(h, 2), compute(m.mm[1], 3),
        compute(m.mean_node, 0), grad(w2, 2)};
    const StepTime st = step_time(cm, instrs);
    EXPECT_NEAR(st.step_s, 10.5 + L, 1e-12);
    EXPECT_NEAR(st.hidden_s, 1.5, 1e-12);  // w2's all-reduce behind the first product's backward
  }
  {
    // x gathered (2, no gradient: all forward), then w1 stored Sharded and gathered in a bucket
    // (its all-gather half 1) for the first product: the channel cannot move while x's gather
    // holds the link, so the pass waits 2 -> 3 for w1's bucket, then the products' forwards
    // (1.5 + 1) end at 5.5, their backwards (2 + 1.5) at 9. w2's all-reduce (2 + L/2), ready at
    // 7.5, ends at 9.5 + L/2; w1's reduce-scatter (1), ready at 9, at 10.5 + L/2. Were the link
    // free, w1's bucket would have been gathered under x's gather: 1 s sooner.
    const std::vector<Instruction> instrs = {
        gather(tensor_named(g, "x"), 2), gather(w1, 2), compute(m.mm[0], 3), compute(m.mm[1], 3),
        compute(m.mean_node, 0),         grad(w2, 2)};
    ASSERT_TRUE(bucketed_parameter_gather(g, instrs[1]));
    ASSERT_FALSE(bucketed_parameter_gather(g, instrs[0]));
    EXPECT_NEAR(step_time(cm, instrs).step_s, 10.5 + L / 2, 1e-12);
  }
}

// Recomputation, worked by hand on x -> matmul(w1) -> h -> matmul(w2) -> y -> mean, the two
// products in segments 0 and 1: recomputing segment 1 runs its product's forward once more,
// in the backward pass (FLOPs 2 + 4 of a step of 6 -> backward 6 of 8), keeps for backward
// neither y (read only by mean, in segment 1) nor anything else of segment 1, but still h (made
// in segment 0, which is not recomputed), and holds y again while segment 1's backward runs.
TEST(CostModel, RecomputationPricesTheForwardAgainAndKeepsOnlyWhatLeavesTheSegment) {
  const TwoProducts m = two_products(4, 8, 16);
  const Graph& g = m.graph;
  const int(&mm)[2] = m.mm;
  const int mean_node = m.mean_node;
  const Cluster c = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  std::vector<int> segment(g.nodes.size(), 0);
  segment[mm[1]] = segment[mean_node] = 1;
  const int h = g.nodes[mm[0]].outputs[0], y = g.nodes[mm[1]].outputs[0];
  CostModel cm(g, c);
  const double plain = cm.device_compute_s(mm[1], 0), fraction = cm.backward_fraction(mm[1]);
  ASSERT_NEAR(fraction, 2.0 / 3, 1e-12);  // h and w2 both need gradients
  ASSERT_TRUE(cm.kept_for_backward(h) && cm.kept_for_backward(y));
  cm.set_recompute(segment, {false, true});
  EXPECT_TRUE(cm.recomputed(mm[1]));
  EXPECT_FALSE(cm.recomputed(mm[0]));
  EXPECT_NEAR(cm.device_compute_s(mm[1], 0), plain * 4.0 / 3, 1e-15);
  EXPECT_NEAR(cm.backward_fraction(mm[1]), 3.0 / 4, 1e-12);
  EXPECT_NEAR(cm.backward_fraction(mm[0]), 1.0 / 2, 1e-12);  // as before
  EXPECT_TRUE(cm.kept_for_backward(h));
  EXPECT_FALSE(cm.kept_for_backward(y));
  EXPECT_EQ(cm.recomputed_segment(y), 1);
  EXPECT_EQ(cm.recomputed_segment(h), -1);
  // Memory of the all-Replicated program: y is held once either way (kept, or held again).
  std::vector<Instruction> instrs;
  for (int node : {mm[0], mm[1], mean_node}) {
    Instruction in;
    in.kind = InstrKind::Compute;
    in.node = node;
    in.segment = segment[node];
    instrs.push_back(in);
  }
  const std::vector<Prop> storage(g.tensors.size(), Prop::replicated());
  const std::vector<std::vector<double>> ratios(2, std::vector<double>(3, 1.0 / 3));
  const CostModel plain_cm(g, c);
  EXPECT_NEAR(program_memory(cm, instrs, storage, ratios)[0],
              program_memory(plain_cm, instrs, storage, ratios)[0], 1e-9);
  // Recomputing both segments: h, made in segment 0 and read in segment 1, leaves its segment
  // and is still kept; an empty list recomputes nothing.
  cm.set_recompute(segment, {true, true});
  EXPECT_TRUE(cm.kept_for_backward(h));
  EXPECT_FALSE(cm.kept_for_backward(y));
  cm.set_recompute(segment, {});
  EXPECT_FALSE(cm.recomputed(mm[1]));
  EXPECT_TRUE(cm.kept_for_backward(y));
}

// The forward collectives of a recomputed segment run again in the backward pass (the executor
// replays the segment's instructions, parallel::Executor::run_recomputed), and are priced so: on
// the two products, an all-reduce of h (Partial -> Replicated; h needs a gradient, so its
// adjoint all-reduces that) costs its forward and its adjoint, and once more in a recomputed
// segment: x 1.5, the extra third in the backward pass. A gradient all-reduce, a bucketed
// parameter gather (the recomputation reads the gathered copy) and anything outside the
// recomputed segments are not run again.
TEST(CostModel, RecomputationPricesTheSegmentsForwardCollectivesAgain) {
  const TwoProducts m = two_products(4, 8, 16);
  const Graph& g = m.graph;
  const Cluster c = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  std::vector<int> segment(g.nodes.size(), 0);
  segment[m.mm[1]] = segment[m.mean_node] = 1;
  const int h = g.nodes[m.mm[0]].outputs[0];
  const int w2 = g.nodes[m.mm[1]].inputs[1];
  ASSERT_EQ(g.tensors[w2].role, TensorRole::Parameter);
  auto collective = [](InstrKind kind, int tensor, Prop from, Prop to, int seg) {
    Instruction in;
    in.kind = kind;
    in.tensor = tensor;
    in.from = from;
    in.to = to;
    in.segment = in.from_segment = seg;
    in.method = CollectiveMethod::Grouped;
    return in;
  };
  const Instruction reduce1 =
      collective(InstrKind::AllReduce, h, Prop::partial(), Prop::replicated(), 1);
  const Instruction reduce0 =
      collective(InstrKind::AllReduce, h, Prop::partial(), Prop::replicated(), 0);
  const Instruction gather_h =
      collective(InstrKind::AllGather, h, Prop::sharded(0), Prop::replicated(), 1);
  const Instruction gather_w2 =
      collective(InstrKind::AllGather, w2, Prop::sharded(0), Prop::replicated(), 1);
  const Instruction grad_w2 =
      collective(InstrKind::GradAllReduce, w2, Prop::partial(), Prop::replicated(), 1);
  ASSERT_TRUE(bucketed_parameter_gather(g, gather_w2));
  CostModel cm(g, c);
  for (const Instruction& in : {reduce1, reduce0, gather_h, gather_w2, grad_w2})
    EXPECT_EQ(cm.recompute_factor(in), 1.0) << "nothing recomputed";
  cm.set_recompute(segment, {false, true});
  EXPECT_TRUE(cm.segment_recomputed(1));
  EXPECT_FALSE(cm.segment_recomputed(0));
  EXPECT_EQ(cm.recompute_factor(reduce1), 1.5);
  EXPECT_EQ(cm.recompute_factor(gather_h), 1.5);
  EXPECT_EQ(cm.recompute_factor(reduce0), 1.0);
  EXPECT_EQ(cm.recompute_factor(gather_w2), 1.0);
  EXPECT_EQ(cm.recompute_factor(grad_w2), 1.0);
  // Priced by recost: the same all-reduce costs 1.5 x, and the step grows by the forward run
  // (a third of the new price, all of it in the backward pass).
  const std::vector<std::vector<double>> ratios(2, std::vector<double>(3, 1.0 / 3));
  const CostModel plain_cm(g, c);
  std::vector<Instruction> plain = {reduce1}, again = {reduce1};
  const double plain_step = recost(plain_cm, plain, ratios);
  const double again_step = recost(cm, again, ratios);
  ASSERT_GT(plain[0].cost_s, 0);
  EXPECT_NEAR(again[0].cost_s, 1.5 * plain[0].cost_s, 1e-15);
  EXPECT_NEAR(again_step - plain_step, 0.5 * plain[0].cost_s, 1e-15);
  EXPECT_NEAR(step_time(cm, again).step_s, again[0].cost_s, 1e-15);
  // Outside the recomputed segment, or with nothing recomputed, the price is the plain one.
  std::vector<Instruction> outside = {reduce0};
  recost(cm, outside, ratios);
  EXPECT_NEAR(outside[0].cost_s, plain[0].cost_s, 1e-15);
  cm.set_recompute(segment, {});
  EXPECT_EQ(cm.recompute_factor(reduce1), 1.0);
}

// A recomputed segment whose instructions are interleaved with another's is recomputed run by
// run (parallel::Executor::plan_recomputation), so program_memory holds again the largest run,
// not the whole segment's sum (which it did: on GPT-2 at 1,024 tokens across hap-paper's V100s
// and P100s the embedding's run and the output layer's run of segment 0 were summed, 6.4 GB
// that the search, which counts by run, never saw, and every program it found "ran out of
// memory once rounded"). By hand: x -> mm(w0) -> a -> mm(w1) -> b [segment 0], b -> mm(w2) -> c
// -> mm(w3) -> d [segment 1], d -> mm(w4) -> e -> mean [segment 0 again], both recomputed: a, c
// and e are read only inside their segment, so held again (by run: a; c; e and the loss), and
// b, d leave their segment, so are kept.
TEST(CostModel, RecomputationHoldsTheLargestRunOfASegmentAgainNotItsSum) {
  Tensor x = Tensor::meta({4, 8}, DType::F32);
  Tensor w0 = Tensor::meta({8, 64}, DType::F32), w1 = Tensor::meta({64, 8}, DType::F32);
  Tensor w2 = Tensor::meta({8, 8}, DType::F32), w3 = Tensor::meta({8, 8}, DType::F32);
  Tensor w4 = Tensor::meta({8, 48}, DType::F32);
  const Graph g =
      trace([&] { return mean(matmul(matmul(matmul(matmul(matmul(x, w0), w1), w2), w3), w4)); },
            {{"w0", w0}, {"w1", w1}, {"w2", w2}, {"w3", w3}, {"w4", w4}}, {{"x", x}});
  std::vector<int> mm;
  int mean_node = -1;
  for (const GraphNode& n : g.nodes) {
    if (n.kind == ops::OpKind::MatMul) mm.push_back(n.id);
    if (n.kind == ops::OpKind::Mean) mean_node = n.id;
  }
  ASSERT_EQ(mm.size(), 5u);
  ASSERT_GE(mean_node, 0);
  std::vector<int> segment(g.nodes.size(), 0);
  segment[mm[2]] = segment[mm[3]] = 1;
  const Cluster c = cluster3(Link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-6});
  std::vector<Instruction> instrs;
  for (int node : {mm[0], mm[1], mm[2], mm[3], mm[4], mean_node}) {
    Instruction in;
    in.kind = InstrKind::Compute;
    in.node = node;
    in.segment = segment[node];
    instrs.push_back(in);
  }
  auto out = [&](int node) { return g.nodes[node].outputs[0]; };
  const int a = out(mm[0]), b = out(mm[1]), cc = out(mm[2]), d = out(mm[3]), e = out(mm[4]);
  const int loss = out(mean_node);
  const std::vector<Prop> storage(g.tensors.size(), Prop::replicated());
  const std::vector<std::vector<double>> ratios(2, std::vector<double>(3, 1.0 / 3));
  const CostModel plain(g, c);
  CostModel cm(g, c);
  cm.set_recompute(segment, {true, true});
  for (int t : {a, cc, e}) EXPECT_FALSE(cm.kept_for_backward(t)) << t;
  for (int t : {b, d}) EXPECT_TRUE(cm.kept_for_backward(t)) << t;
  EXPECT_EQ(cm.recomputed_segment(a), 0);
  EXPECT_EQ(cm.recomputed_segment(cc), 1);
  EXPECT_EQ(cm.recomputed_segment(e), 0);
  const double bytes_a = 4 * 64 * 4, bytes_c = 4 * 8 * 4, bytes_e = 4 * 48 * 4;
  ASSERT_EQ(static_cast<double>(g.tensors[a].bytes()), bytes_a);
  ASSERT_EQ(static_cast<double>(g.tensors[e].bytes()), bytes_e);
  // The loss: held again in segment 0's second run where it is not kept.
  const double bytes_loss =
      cm.kept_for_backward(loss) ? 0.0 : static_cast<double>(g.tensors[loss].bytes());
  const double run_two = bytes_e + bytes_loss;
  ASSERT_GT(bytes_a, run_two);  // the first run is the largest
  const double before = program_memory(plain, instrs, storage, ratios)[0];
  // Without recomputation every one of them is kept; with it the largest run (a) comes back
  // (segment 0's sum, a + e + the loss, would be run_two more).
  EXPECT_NEAR(program_memory(cm, instrs, storage, ratios)[0],
              before - bytes_a - bytes_c - run_two + bytes_a, 1e-9);
}

}  // namespace
}  // namespace hap::synth

namespace hap::synth {
namespace {

// x: [8, 500] -> linear(w: [1000, 500]) -> mean: w is 2,000,000 bytes.
Graph wide_graph() {
  Tensor x = Tensor::meta({8, 500}, DType::F32), w = Tensor::meta({1000, 500}, DType::F32);
  return trace([&] { return mean(linear(x, w)); }, {{"w", w}}, {{"x", x}});
}

// Nodes of the given sizes, 1e10 bytes/s and 1 us inside each, 1e8 bytes/s and 100 us between.
Cluster nodes_of(const std::vector<int>& sizes) {
  Cluster c;
  c.name = "nodes";
  c.inter_node = {1e8, 1e-4};
  int next = 0;
  for (size_t n = 0; n < sizes.size(); ++n) {
    std::vector<Device> devs;
    for (int i = 0; i < sizes[n]; ++i) {
      Device d;
      d.name = "d" + std::to_string(next++);
      d.type = "cpu";
      d.flops_per_s = 1e9;
      d.memory_bytes = int64_t{1} << 30;
      devs.push_back(d);
    }
    c.add_node("n" + std::to_string(n), {1e10, 1e-6}, devs);
  }
  c.validate();
  return c;
}

// Worked by hand for 2,000,000 bytes. Flat over 4 devices at the bottleneck (1e8 B/s, 100 us):
// 2 * 3/4 * 2e6 / 1e8 + 6 * 1e-4 = 0.0306 s. Hierarchical on 2 + 2: a reduce-scatter and an
// all-gather of 2 blocks inside each node, (2 - 1) * 2e6 / 2 / 1e10 + 1e-6 each, and an
// all-reduce across the 2 nodes of what the 2 lanes move together, 2 * 1/2 * 2e6 / 1e8 + 2 * 1e-4:
// 0.020402 s. On 3 + 1 there is one lane: (3 - 1) * 2e6 / 1e10 + 2e-6 inside (twice) and the same
// 0.0202 across: 0.021004 s.
TEST(CostModel, HierarchicalAllReduceIsPricedPerNodeAndChosenWhereCheaper) {
  const Graph g = wide_graph();
  const int w = tensor_named(g, "w");
  ASSERT_EQ(g.tensors[w].bytes(), 2'000'000);
  const double B = 2e6;
  {
    const Cluster c = nodes_of({2, 2});
    CostModel cm(g, c);
    ASSERT_TRUE(cm.hierarchical_available());
    const auto flat = cm.all_reduce_time(B, CollectiveMethod::Grouped);
    EXPECT_NEAR(flat.bytes_s, 0.03, 1e-12);
    EXPECT_NEAR(flat.latency_s, 6e-4, 1e-15);
    const auto hier = cm.all_reduce_time(B, CollectiveMethod::Hierarchical);
    EXPECT_NEAR(hier.bytes_s, 2 * 1e-4 + 0.02, 1e-12);
    EXPECT_NEAR(hier.latency_s, 2 * 1e-6 + 2e-4, 1e-15);
    // An activation all-reduce: forward and, as w needs a gradient, backward (w stands in for one).
    EXPECT_NEAR(cm.communication(InstrKind::AllReduce, w, CollectiveMethod::Hierarchical)
                    .eval({0.25, 0.25, 0.25, 0.25}),
                2 * 0.020402, 1e-12);
    double cost = 0;
    EXPECT_EQ(cm.best_method(InstrKind::AllReduce, w, {0.25, 0.25, 0.25, 0.25}, &cost),
              CollectiveMethod::Hierarchical);
    EXPECT_NEAR(cost, 2 * 0.020402, 1e-12);
    EXPECT_EQ(cm.grad_all_reduce_method(), CollectiveMethod::Hierarchical);
    // The gradient all-reduce: its bytes, and the bucket's latency shared by the 1 parameter.
    EXPECT_NEAR(cm.communication(InstrKind::GradAllReduce, w, CollectiveMethod::Hierarchical)
                    .eval({0.25, 0.25, 0.25, 0.25}),
                0.020402, 1e-12);
    cm.set_hierarchical(false);
    EXPECT_FALSE(cm.hierarchical_available());
    EXPECT_TRUE(cm.hierarchical_possible());
    EXPECT_EQ(cm.best_method(InstrKind::AllReduce, w, {0.25, 0.25, 0.25, 0.25}, &cost),
              CollectiveMethod::Grouped);
    EXPECT_NEAR(cost, 2 * 0.0306, 1e-12);
    EXPECT_EQ(cm.grad_all_reduce_method(), CollectiveMethod::Grouped);
  }
  {
    const Cluster c = nodes_of({3, 1});
    const CostModel cm(g, c);
    EXPECT_NEAR(cm.all_reduce_time(B, CollectiveMethod::Hierarchical).total_s(), 0.021004, 1e-12);
  }
  // No hierarchy to use: one node, or one device per node.
  for (const std::vector<int>& sizes : {std::vector<int>{4}, std::vector<int>{1, 1, 1}}) {
    const Cluster c = nodes_of(sizes);
    const CostModel cm(g, c);
    EXPECT_FALSE(cm.hierarchical_possible()) << c.summary();
    EXPECT_EQ(cm.grad_all_reduce_method(), CollectiveMethod::Grouped);
    EXPECT_THROW(cm.all_reduce_time(B, CollectiveMethod::Hierarchical), Error);
  }
}

// x: [4000, 50] (input) -> linear(w: [64, 50]) -> softmax over features -> mean: much work on a
// small weight whose output rows the softmax needs whole, where splitting the batch and
// all-reducing w's gradient pays.
Graph tall_graph() {
  Tensor x = Tensor::meta({4000, 50}, DType::F32), w = Tensor::meta({64, 50}, DType::F32);
  return trace([&] { return mean(softmax(linear(x, w), -1)); }, {{"w", w}}, {{"x", x}});
}

void check_hierarchical_gradients(Strategy strategy, const Graph& g) {
  SCOPED_TRACE(strategy_name(strategy));
  const Cluster c = nodes_of({2, 2});
  SynthesisOptions o;
  o.strategy = strategy;
  o.select_devices = false;
  const DistributedProgram hier = synthesize(g, c, o);
  int all_reduces = 0;
  for (const Instruction& in : hier.instructions)
    if (in.kind == InstrKind::GradAllReduce || in.kind == InstrKind::AllReduce) {
      ++all_reduces;
      EXPECT_EQ(in.method, CollectiveMethod::Hierarchical);
    }
  EXPECT_GE(all_reduces, 1);
  EXPECT_EQ(hier.nodes, (std::vector<int>{0, 0, 1, 1}));
  o.hierarchical_collectives = false;
  const DistributedProgram flat = synthesize(g, c, o);
  for (const Instruction& in : flat.instructions)
    EXPECT_NE(in.method, CollectiveMethod::Hierarchical);
  EXPECT_TRUE(flat.nodes.empty());
  EXPECT_LT(hier.predicted_step_s, flat.predicted_step_s);
  EXPECT_NE(program_hash(hier), program_hash(flat));
}

// dp-cp and hap on two nodes of two: every all-reduce runs hierarchically, the program
// names each rank's node, and it is predicted faster than with the flat form only, which
// hierarchical_collectives = false keeps to (in every search hap runs).
TEST(Synthesizer, GradientAllReducesRunHierarchicallyAcrossSlowNodeLinks) {
  check_hierarchical_gradients(Strategy::DpCp, wide_graph());
  check_hierarchical_gradients(Strategy::DpCp, tall_graph());
  check_hierarchical_gradients(Strategy::Hap, tall_graph());
}

// Worked by hand for 2,000,000 bytes on 2 + 2 (lanes 2; 1e10 B/s and 1 us inside the nodes,
// 1e8 B/s and 100 us between). Hierarchical all-gather: the node's block (half the tensor)
// gathered between its 2 devices, 1e6 / 2 / 1e10 + 1e-6; across the 2 nodes, what the lanes move
// together, (2 - 1) * 2e6 / 2 / 1e8 + 1e-4; the lanes' pieces gathered inside, 2e6 / 2 / 1e10 +
// 1e-6: 0.010252 s, where the flat padded ring takes 3 * 2e6 / 4 / 1e8 + 3 * 1e-4 = 0.0153 s and
// the grouped one 2e6 / 1e8 + 4 * 2 * 1e-4 = 0.0208 s. The reduce-scatter is the same passes in
// reverse, 0.010252 s. On 3 + 1 (one lane): 2 * 1.5e6 / 3 / 1e10 + 2e-6, 0.0101, 2 * 2e6 / 1e10 +
// 2e-6: 0.010604 s.
TEST(CostModel, HierarchicalAllGatherAndReduceScatterArePricedPerNodeAndChosenWhereCheaper) {
  const Graph g = wide_graph();
  const int w = tensor_named(g, "w");
  const double B = 2e6;
  const std::vector<double> even = {0.25, 0.25, 0.25, 0.25};
  {
    const Cluster c = nodes_of({2, 2});
    CostModel cm(g, c);
    for (InstrKind kind : {InstrKind::AllGather, InstrKind::ReduceScatter}) {
      SCOPED_TRACE(instr_name(kind));
      const auto t = cm.hierarchical_time(kind, B);
      EXPECT_NEAR(t.bytes_s, 0.01 + 1e-4 + 5e-5, 1e-12);
      EXPECT_NEAR(t.latency_s, 1e-4 + 2e-6, 1e-15);
      EXPECT_NEAR(cm.collective_latency_s(kind, CollectiveMethod::Hierarchical), 1e-4 + 2e-6,
                  1e-15);
      // Forward and, as w needs a gradient, the adjoint (the other collective, priced the same).
      EXPECT_NEAR(cm.communication(kind, w, CollectiveMethod::Hierarchical).eval(even),
                  2 * 0.010252, 1e-12);
      EXPECT_NEAR(cm.communication(kind, w, CollectiveMethod::Padded).eval(even), 2 * 0.0153,
                  1e-12);
      double cost = 0;
      EXPECT_EQ(cm.best_method(kind, w, even, &cost), CollectiveMethod::Hierarchical);
      EXPECT_NEAR(cost, 2 * 0.010252, 1e-12);
    }
    EXPECT_EQ(cm.gather_methods().back(), CollectiveMethod::Hierarchical);
    cm.set_hierarchical(false);
    double cost = 0;
    EXPECT_EQ(cm.best_method(InstrKind::AllGather, w, even, &cost), CollectiveMethod::Padded);
    EXPECT_NEAR(cost, 2 * 0.0153, 1e-12);
    EXPECT_EQ(cm.gather_methods().size(), 2u);
  }
  {
    const Cluster c = nodes_of({3, 1});
    const CostModel cm(g, c);
    EXPECT_NEAR(cm.hierarchical_time(InstrKind::AllGather, B).total_s(), 0.010604, 1e-12);
  }
  for (const std::vector<int>& sizes : {std::vector<int>{4}, std::vector<int>{1, 1, 1}}) {
    const Cluster c = nodes_of(sizes);
    const CostModel cm(g, c);
    EXPECT_EQ(cm.gather_methods().size(), 2u) << c.summary();
    EXPECT_THROW(cm.hierarchical_time(InstrKind::AllGather, B), Error);
  }
}

// Figures of the lanes between nodes (Cluster::lanes, what hap-profile measures on them) price the
// hierarchical forms' middle phase in place of inter_node's; the flat forms keep inter_node's. The
// cases above on 2 + 2 with lanes of 4e8 bytes/s and 50 us: the all-reduce's lanes move
// 2 * 1/2 * 2e6 bytes (0.005 s) with 2 latencies, the all-gather's 1/2 * 2e6 (0.0025 s) with one.
TEST(CostModel, TheLanesFiguresPriceTheHierarchicalFormsBetweenNodes) {
  const Graph g = wide_graph();
  const double B = 2e6;
  Cluster c = nodes_of({2, 2});
  c.lanes = {4e8, 5e-5};
  c.validate();
  const CostModel cm(g, c);
  const auto flat = cm.all_reduce_time(B, CollectiveMethod::Grouped);
  EXPECT_NEAR(flat.bytes_s, 0.03, 1e-12);
  EXPECT_NEAR(flat.latency_s, 6e-4, 1e-15);
  const auto hier = cm.all_reduce_time(B, CollectiveMethod::Hierarchical);
  EXPECT_NEAR(hier.bytes_s, 2 * 1e-4 + 0.005, 1e-12);
  EXPECT_NEAR(hier.latency_s, 2 * 1e-6 + 2 * 5e-5, 1e-15);
  const auto gather = cm.hierarchical_time(InstrKind::AllGather, B);
  EXPECT_NEAR(gather.bytes_s, 0.0025 + 1e-4 + 5e-5, 1e-12);
  EXPECT_NEAR(gather.latency_s, 5e-5 + 2e-6, 1e-15);
  // A subset of the cluster keeps them; bad figures are refused naming them.
  EXPECT_DOUBLE_EQ(c.subset({0, 2}).lanes.bandwidth_bytes_per_s, 4e8);
  c.lanes.latency_s = -1;
  EXPECT_HAS(test_util::error_of([&] { c.validate(); }), "inter_node lanes: latency_s");
}

// hap with every parameter stored sharded on two nodes of two: the parameters' all-gathers (and
// so their gradients' reduce-scatters) run hierarchically, the program names each rank's node,
// and it is predicted faster than with the flat forms only.
TEST(Synthesizer, ZeroStorageGathersRunHierarchicallyAcrossSlowNodeLinks) {
  const Graph g = tall_graph();
  const Cluster c = nodes_of({2, 2});
  SynthesisOptions o;
  o.strategy = Strategy::Hap;
  o.select_devices = false;
  o.zero_storage = ZeroStorage::All;
  const DistributedProgram hier = synthesize(g, c, o);
  int gathers = 0;
  for (const Instruction& in : hier.instructions)
    if (in.kind == InstrKind::AllGather && g.tensors[in.tensor].role == TensorRole::Parameter) {
      ++gathers;
      EXPECT_EQ(in.method, CollectiveMethod::Hierarchical);
    }
  EXPECT_GE(gathers, 1);
  EXPECT_EQ(hier.nodes, (std::vector<int>{0, 0, 1, 1}));
  o.hierarchical_collectives = false;
  const DistributedProgram flat = synthesize(g, c, o);
  for (const Instruction& in : flat.instructions)
    EXPECT_NE(in.method, CollectiveMethod::Hierarchical);
  EXPECT_LT(hier.predicted_step_s, flat.predicted_step_s);
}

}  // namespace
}  // namespace hap::synth
