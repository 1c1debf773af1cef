// The program search against its exhaustive reference, the ratio LP, and the synthesizer's
// guarantees (baselines are never better; returned ratios are the ones costed; memory limits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>

#include "models/gpt.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "synth/synthesizer.h"
#include "tests/test_util.h"
#include "tests/zero_storage_util.h"

namespace hap::synth {
namespace {

// link_latency_s >= 0: that latency instead of a random one (a link where bandwidth, not
// latency, prices the collectives of these small graphs).
Cluster make_cluster(int devices, uint64_t seed, double memory_bytes = 1e12,
                     double link_latency_s = -1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> flops(1e10, 8e10), bw(1e5, 1e9), lat(1e-7, 1e-3);
  std::uniform_real_distribution<double> update(0, 1e-8), mem_bw(1e9, 1e11);
  Cluster c;
  c.name = "random" + std::to_string(seed);
  std::vector<Device> devs;
  for (int i = 0; i < devices; ++i) {
    devs.push_back(
        {"d" + std::to_string(i), "cpu", flops(rng), static_cast<int64_t>(memory_bytes), -1});
    // Half the clusters also price optimizer updates and memory traffic (profiled figures).
    if (seed % 2) {
      devs.back().update_s_per_param = update(rng);
      devs.back().memory_bandwidth_bytes_per_s = mem_bw(rng);
    }
  }
  const double bandwidth = bw(rng), latency = lat(rng);
  c.add_node("n0", {bandwidth, link_latency_s >= 0 ? link_latency_s : latency}, devs);
  c.validate();
  return c;
}

// A random small model: a chain of linear / activation / residual / norm / softmax layers on a
// [B, D] batch, ending in a mean loss. Shapes vary with the seed (B too, unless `batch` > 0).
Graph random_graph(uint64_t seed, int layers, int64_t batch = 0) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  int64_t B = 4 + pick(61), D = 3 + pick(46);
  if (batch > 0) B = batch;  // (drawn all the same: the rest of the graph stays the seed's)
  std::vector<std::pair<std::string, Tensor>> params;
  Tensor x = Tensor::meta({B, D}, DType::F32);
  auto param = [&](const std::string& name, Shape s) {
    Tensor p = Tensor::meta(s, DType::F32);
    params.push_back({name, p});
    return p;
  };
  std::vector<int> kinds;
  for (int l = 0; l < layers; ++l) kinds.push_back(pick(5));
  std::vector<Tensor> ws;
  int64_t width = D;
  for (int l = 0; l < layers; ++l) {
    if (kinds[l] == 0) {
      int64_t out = 2 + pick(60);
      ws.push_back(param("w" + std::to_string(l), {out, width}));
      ws.push_back(param("b" + std::to_string(l), {out}));
      width = out;
    } else if (kinds[l] == 3) {
      ws.push_back(param("g" + std::to_string(l), {width}));
      ws.push_back(param("h" + std::to_string(l), {width}));
    }
  }
  return trace(
      [&] {
        Tensor h = x;
        size_t w = 0;
        for (int l = 0; l < layers; ++l) {
          switch (kinds[l]) {
            case 0:
              h = linear(h, ws[w], ws[w + 1]);
              w += 2;
              break;
            case 1:
              h = gelu(h);
              break;
            case 2:
              h = h + relu(h);
              break;
            case 3:
              h = layer_norm(h, ws[w], ws[w + 1]);
              w += 2;
              break;
            case 4:
              h = softmax(h, -1);
              break;
          }
        }
        return mean(h);
      },
      params, {{"x", x}});
}

// The memory of the cluster device that holds position d of program p's devices (p may run on a
// subset: DistributedProgram::devices).
double memory_of(const Cluster& c, const DistributedProgram& p, size_t d) {
  const size_t device = p.devices.empty() ? d : static_cast<size_t>(p.devices.at(d));
  return static_cast<double>(c.devices.at(device).memory_bytes);
}

// A random small model with branches: each op reads one or two earlier tensors (recent ones
// more often), so tensors stay live across other branches; every tensor nobody read feeds the
// loss (a sum of means). Shapes vary with the seed.
Graph random_dag(uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const int64_t B = 4 + pick(29), D = 3 + pick(30);
  std::vector<std::pair<std::string, Tensor>> params;
  Tensor x = Tensor::meta({B, D}, DType::F32);
  std::vector<int> kinds, first, second;
  for (int i = 0; i < ops; ++i) {
    kinds.push_back(pick(6));
    const int pool = i + 1;  // x and the outputs of the ops before
    first.push_back(std::max(0, pool - 1 - pick(std::min(pool, 3))));
    second.push_back(pick(pool));
    if (kinds.back() == 0)
      params.push_back({"w" + std::to_string(i), Tensor::meta({D, D}, DType::F32)});
  }
  return trace(
      [&] {
        std::vector<Tensor> pool = {x};
        std::vector<bool> read = {false};
        size_t w = 0;
        for (int i = 0; i < ops; ++i) {
          const Tensor& a = pool[static_cast<size_t>(first[i])];
          const Tensor& b = pool[static_cast<size_t>(second[i])];
          read[static_cast<size_t>(first[i])] = true;
          Tensor y;
          switch (kinds[i]) {
            case 0:
              y = linear(a, params[w++].second);
              break;
            case 1:
              y = gelu(a);
              break;
            case 2:
              read[static_cast<size_t>(second[i])] = true;
              y = a + b;
              break;
            case 3:
              read[static_cast<size_t>(second[i])] = true;
              y = a * b;
              break;
            case 4:
              y = softmax(a, -1);
              break;
            default:
              y = relu(a);
              break;
          }
          pool.push_back(y);
          read.push_back(false);
        }
        Tensor loss;
        for (size_t i = 1; i < pool.size(); ++i)
          if (!read[i]) loss = loss.defined() ? loss + mean(pool[i]) : mean(pool[i]);
        return loss;
      },
      params, {{"x", x}});
}

// The order the search visits nodes in: a topological order (every input computed before it is
// read), and a node that frees more live tensors than it adds runs before one that does not.
TEST(Search, NarrowOrderIsTopologicalAndRunsNodesThatFreeTensorsFirst) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Graph g = random_dag(seed, 3 + static_cast<int>(seed % 9));
    const std::vector<int> order = narrow_order(g);
    ASSERT_EQ(order.size(), g.nodes.size());
    std::vector<int> pos(g.nodes.size(), -1);
    for (size_t i = 0; i < order.size(); ++i) {
      ASSERT_GE(order[i], 0);
      ASSERT_LT(order[i], static_cast<int>(g.nodes.size()));
      ASSERT_EQ(pos[order[i]], -1) << "node " << order[i] << " listed twice";
      pos[order[i]] = static_cast<int>(i);
    }
    for (const GraphNode& n : g.nodes)
      for (int t : n.inputs)
        if (t >= 0 && g.tensors[t].producer >= 0) {
          EXPECT_LT(pos[g.tensors[t].producer], pos[n.id]) << "seed " << seed << "\n" << g.str();
        }
  }
  // p and q are live until aux reads both; in program order the linear branch runs first and
  // holds them live across it, in the narrow order aux runs as soon as it can.
  Tensor x = Tensor::meta({8, 6}, DType::F32), w = Tensor::meta({6, 6}, DType::F32);
  const Graph g = trace(
      [&] {
        Tensor p = softmax(x, -1);
        Tensor q = relu(x);
        Tensor z = gelu(linear(x, w));
        Tensor aux = p * q;
        return mean(z) + mean(aux);
      },
      {{"w", w}}, {{"x", x}});
  ASSERT_EQ(g.nodes[4].kind, ops::OpKind::Mul) << g.str();
  const std::vector<int> order = narrow_order(g);
  EXPECT_EQ(std::vector<int>(order.begin(), order.begin() + 3), (std::vector<int>{0, 1, 4}))
      << g.str();
}

// Visiting order changes which states the search tells apart, never whether it is exact: in
// program order and in the narrow order best-first equals the exhaustive reference (which visits
// nodes in the same order) on graphs with branches.
TEST(Search, BestFirstFindsTheExhaustiveOptimumInEitherVisitingOrder) {
  int checked = 0, reordered = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Graph g = random_dag(seed + 900, 3 + static_cast<int>(seed % 5));
    if (g.nodes.size() > 9) continue;  // keep the exhaustive reference affordable
    std::vector<int> in_program_order(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) in_program_order[i] = static_cast<int>(i);
    if (narrow_order(g) != in_program_order) ++reordered;
    Cluster c = make_cluster(2 + static_cast<int>(seed % 3), seed * 7);
    CostModel cm(g, c);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    std::vector<std::vector<double>> r = {c.flops_ratios()};
    for (bool narrow : {true, false}) {
      SearchSpace space;
      space.narrow_order = narrow;
      SearchResult a = search_program(cm, r, seg, space);
      SearchResult b = exhaustive_search(cm, r, seg, space);
      EXPECT_NEAR(a.cost_s, b.cost_s, 1e-12 * std::max(1.0, b.cost_s))
          << "seed " << seed << " narrow " << narrow << "\n"
          << g.str();
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
  EXPECT_GE(reordered, 3) << "the narrow order never differed: the test does not exercise it";
}

// The heuristic is a lower bound of every program (so best-first stays exact), and it sees more
// than each node's cheapest computation: the leaves nodes store and the conversions between
// chained nodes. Checked against the exhaustive optimum, in every strategy's space.
TEST(Search, LowerBoundNeverExceedsTheOptimumAndCountsMoreThanComputation) {
  int checked = 0, stronger = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Graph g = seed % 2 ? random_dag(seed + 1300, 3 + static_cast<int>(seed % 6))
                       : random_graph(seed + 1300, 3 + static_cast<int>(seed % 5));
    if (g.nodes.size() > 9) continue;  // keep the exhaustive reference affordable
    Cluster c = make_cluster(2 + static_cast<int>(seed % 3), seed * 11);
    CostModel cm(g, c);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    std::vector<std::vector<double>> r = {c.flops_ratios()};
    double compute_only = 0;
    for (const GraphNode& n : g.nodes) {
      double best = cm.compute_s(n.id, -1, r[0]);
      for (int sig = 0; sig < static_cast<int>(cm.signatures(n.id).size()); ++sig)
        best = std::min(best, cm.compute_s(n.id, sig, r[0]));
      compute_only += best;
    }
    SearchSpace hap, dp, tp;
    dp.inputs_must_shard_dim0 = true;
    dp.shard_parameters = false;
    tp.shard_inputs = tp.allow_slice = tp.allow_reduce_scatter = tp.allow_all_to_all = false;
    tp.linear_weights_must_shard = true;
    for (const SearchSpace& space : {hap, dp, tp}) {
      SearchResult best;
      try {
        best = exhaustive_search(cm, r, seg, space);
      } catch (const Error&) {
        continue;  // no program in this space (tp on a graph without a linear layer to split)
      }
      const double bound = search_lower_bound(cm, r, seg, space);
      EXPECT_LE(bound, best.cost_s * (1 + 1e-12)) << "seed " << seed << "\n" << g.str();
      EXPECT_GE(bound, compute_only * (1 - 1e-12)) << "seed " << seed;
      if (bound > compute_only * (1 + 1e-6)) ++stronger;
      ++checked;
    }
  }
  EXPECT_GE(checked, 30);
  EXPECT_GE(stronger, 10) << "the bound never saw more than computation";
}

TEST(Search, BestFirstFindsTheExhaustiveOptimumOnRandomGraphsAndClusters) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    Graph g = random_graph(seed, 3 + static_cast<int>(seed % 4));
    if (g.nodes.size() > 9) continue;  // keep the exhaustive reference affordable
    Cluster c = make_cluster(2 + static_cast<int>(seed % 3), seed * 31);
    CostModel cm(g, c);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    std::vector<std::vector<double>> r = {c.flops_ratios()};
    for (const SearchSpace& space : {SearchSpace{}, SearchSpace{.shard_parameters = false}}) {
      SearchResult a = search_program(cm, r, seg, space);
      SearchResult b = exhaustive_search(cm, r, seg, space);
      EXPECT_NEAR(a.cost_s, b.cost_s, 1e-12 * std::max(1.0, b.cost_s)) << "seed " << seed << "\n"
                                                                       << g.str();
      EXPECT_LE(a.states_expanded, b.states_expanded);
      ++checked;
    }
  }
  EXPECT_GE(checked, 10);
}

// Where memory binds, the cheapest path to a state may be the one that later runs out: the
// search must still find the cheapest program that fits (the exhaustive reference checks every
// path against the limit).
TEST(Search, UnderTightMemoryBestFirstFindsTheExhaustiveOptimum) {
  int checked = 0, binding = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    Graph g = random_graph(seed + 700, 3 + static_cast<int>(seed % 4));
    if (g.nodes.size() > 9) continue;  // keep the exhaustive reference affordable
    const int devices = 2 + static_cast<int>(seed % 3);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    Cluster roomy = make_cluster(devices, seed * 13);
    CostModel cm_roomy(g, roomy);
    std::vector<std::vector<double>> r = {roomy.flops_ratios()};
    SearchResult free_best = exhaustive_search(cm_roomy, r, seg, SearchSpace{});
    const double peak = *std::max_element(free_best.device_memory_bytes.begin(),
                                          free_best.device_memory_bytes.end());
    for (double fraction : {0.97, 0.85, 0.7, 0.55}) {
      Cluster tight = make_cluster(devices, seed * 13, std::floor(peak * fraction));
      CostModel cm(g, tight);
      SearchResult b;
      try {
        b = exhaustive_search(cm, r, seg, SearchSpace{});
      } catch (const Error&) {
        EXPECT_THROW(search_program(cm, r, seg, SearchSpace{}), Error) << "seed " << seed;
        continue;
      }
      SearchResult a = search_program(cm, r, seg, SearchSpace{});
      EXPECT_NEAR(a.cost_s, b.cost_s, 1e-12 * std::max(1.0, b.cost_s))
          << "seed " << seed << " memory " << fraction << " of the unconstrained optimum's\n"
          << g.str();
      for (size_t d = 0; d < a.device_memory_bytes.size(); ++d)
        EXPECT_LE(a.device_memory_bytes[d], static_cast<double>(tight.devices[d].memory_bytes));
      ++checked;
      if (b.cost_s > free_best.cost_s * (1 + 1e-9)) ++binding;
    }
  }
  EXPECT_GE(checked, 20);
  EXPECT_GE(binding, 5) << "memory never changed the optimum: the test does not exercise the limit";
}

// Data parallelism with ZeRO storage as a search space: inputs split on the batch, no activation
// changes its split, so a parameter is either stored whole (its gradient all-reduced) or, with
// zero_storage, stored Sharded(0) and all-gathered for use.
SearchSpace zero_dp_space(bool zero) {
  SearchSpace s;
  s.inputs_must_shard_dim0 = true;
  s.allow_activation_all_gather = s.allow_all_to_all = s.allow_reduce_scatter = false;
  s.allow_slice = false;
  s.zero_storage = zero;
  return s;
}

// The best-first search against the exhaustive one under `space`: both find no program, or the
// same cost with the search's lower bound below it. Returns the best-first program (none where
// neither finds one).
std::optional<SearchResult> best_first_matching_exhaustive(
    const CostModel& cm, const std::vector<std::vector<double>>& r, const std::vector<int>& seg,
    const SearchSpace& space, const std::string& what) {
  SearchResult b;
  try {
    b = exhaustive_search(cm, r, seg, space);
  } catch (const Error&) {
    EXPECT_THROW(search_program(cm, r, seg, space), Error) << what;
    return std::nullopt;
  }
  SearchResult a = search_program(cm, r, seg, space);
  EXPECT_NEAR(a.cost_s, b.cost_s, 1e-12 * std::max(1.0, b.cost_s)) << what << "\n"
                                                                   << cm.graph().str();
  EXPECT_LE(search_lower_bound(cm, r, seg, space), b.cost_s * (1 + 1e-12)) << what;
  return a;
}

// With ZeRO storage in the space (its two variants at every first read of a parameter), the
// best-first search still finds the exhaustive optimum (its lower bound stays below it), with
// and without a binding memory limit, in hap's space and in data parallelism's.
TEST(Search, WithZeroStorageBestFirstFindsTheExhaustiveOptimum) {
  int checked = 0, zero_chosen = 0;
  for (uint64_t seed = 1; seed <= 40 && checked < 24; ++seed) {
    Graph g = random_graph(seed + 2600, 2 + static_cast<int>(seed % 3));
    if (g.nodes.size() > 7) continue;  // keep the exhaustive reference affordable
    const int devices = 2 + static_cast<int>(seed % 2);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    Cluster roomy = make_cluster(devices, seed * 19);
    std::vector<std::vector<double>> r = {roomy.flops_ratios()};
    for (bool dp : {false, true}) {
      SearchSpace space = dp ? zero_dp_space(true) : SearchSpace{.zero_storage = true};
      const SearchResult free_best = exhaustive_search(CostModel(g, roomy), r, seg, space);
      const double peak = *std::max_element(free_best.device_memory_bytes.begin(),
                                            free_best.device_memory_bytes.end());
      for (double fraction : {1.0, 0.8, 0.6}) {
        const Cluster c = make_cluster(devices, seed * 19, std::floor(peak * fraction));
        const CostModel cm(g, c);
        const std::optional<SearchResult> found =
            best_first_matching_exhaustive(cm, r, seg, space,
                                           "seed " + std::to_string(seed) + (dp ? " dp" : " hap") +
                                               " memory " + std::to_string(fraction));
        if (!found) continue;
        const SearchResult& a = *found;
        for (size_t d = 0; d < a.device_memory_bytes.size(); ++d)
          EXPECT_LE(a.device_memory_bytes[d], static_cast<double>(c.devices[d].memory_bytes));
        for (const Instruction& in : a.instructions)
          if (in.kind == InstrKind::AllGather &&
              g.tensors[static_cast<size_t>(in.tensor)].role == TensorRole::Parameter) {
            ++zero_chosen;
            break;
          }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 20);
  EXPECT_GE(zero_chosen, 3) << "no program stored a parameter sharded: the test exercises nothing";
}

// With sufficient factor broadcasting in the space (one more variant at every product reading
// parameters of its own), in hap's space alone and beside ZeRO storage, and in data
// parallelism's, the best-first search still finds the exhaustive optimum (its lower bound stays
// below it), with and without a binding memory limit; a program that broadcasts factors never
// also all-reduces those parameters' gradients.
TEST(Search, WithFactorBroadcastBestFirstFindsTheExhaustiveOptimum) {
  int checked = 0, chosen = 0;
  for (uint64_t seed = 1; seed <= 60 && checked < 30; ++seed) {
    // Small batches: a weight gradient larger than its factors.
    Graph g = random_graph(seed + 4100, 2 + static_cast<int>(seed % 3), 4 + seed % 5);
    if (g.nodes.size() > 7) continue;  // keep the exhaustive reference affordable
    const int devices = 2 + static_cast<int>(seed % 2);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    const double latency = seed % 3 ? 1e-8 : -1;  // mostly links priced by their bandwidth
    Cluster roomy = make_cluster(devices, seed * 29, 1e12, latency);
    std::vector<std::vector<double>> r = {roomy.flops_ratios()};
    for (int variant = 0; variant < 3; ++variant) {
      // hap's space, with ZeRO storage too, and data parallelism's (Poseidon: factors or
      // all-reduced gradients).
      const bool zero = variant == 1;
      SearchSpace space = variant == 2 ? zero_dp_space(false) : SearchSpace{.zero_storage = zero};
      space.factor_broadcast = true;
      const SearchResult free_best = exhaustive_search(CostModel(g, roomy), r, seg, space);
      const double peak = *std::max_element(free_best.device_memory_bytes.begin(),
                                            free_best.device_memory_bytes.end());
      for (double fraction : {1.0, 0.7}) {
        const Cluster c = make_cluster(devices, seed * 29, std::ceil(peak * fraction), latency);
        const CostModel cm(g, c);
        const std::optional<SearchResult> found = best_first_matching_exhaustive(
            cm, r, seg, space,
            "seed " + std::to_string(seed) + " space " + std::to_string(variant) + " memory " +
                std::to_string(fraction));
        if (!found) continue;
        const SearchResult& a = *found;
        bool broadcast = false;
        for (const Instruction& in : a.instructions) {
          if (in.kind != InstrKind::FactorBroadcast) continue;
          broadcast = true;
          EXPECT_TRUE(cm.factor_broadcast_allowed(in.node, in.signature));
          for (int t : g.nodes[static_cast<size_t>(in.node)].inputs) {
            if (t < 0 || g.tensors[static_cast<size_t>(t)].role != TensorRole::Parameter) continue;
            EXPECT_EQ(a.storage[static_cast<size_t>(t)], Prop::replicated());
            for (const Instruction& x : a.instructions)
              EXPECT_FALSE(x.kind == InstrKind::GradAllReduce && x.tensor == t)
                  << "seed " << seed << ": %" << t << "'s gradient is also all-reduced";
          }
        }
        chosen += broadcast ? 1 : 0;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 20);
  EXPECT_GE(chosen, 3) << "no program broadcast factors: the test exercises nothing";
}

// Where a device holds the activations of data parallelism but not every parameter whole with
// its gradient and AdamW state, only ZeRO storage fits: without it the search finds nothing,
// with it a program that fits, its parameters stored Sharded(0) with their updates on the
// shards, all-gathered for use and (to fit) some gathered again in backward; the memory model
// counts the gathered-again copies as not kept, only the largest of them while it is read.
TEST(Search, WhereOnlyShardedParameterStorageFitsZeroStorageFindsIt) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 40 && checked < 6; ++seed) {
    Graph g = random_graph(seed + 3100, 4 + static_cast<int>(seed % 3));
    const int devices = 2 + static_cast<int>(seed % 3);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    const Cluster roomy = make_cluster(devices, seed * 23);
    const CostModel cm_roomy(g, roomy);
    std::vector<std::vector<double>> r = {roomy.flops_ratios()};
    const SearchResult dp = search_program(cm_roomy, r, seg, zero_dp_space(false));
    DistributedProgram zero;
    zero.instructions = dp.instructions;
    zero.storage = dp.storage;
    zero.ratios = r;
    if (test_util::apply_zero_storage(g, zero, true) < 2) continue;
    const std::vector<double> dp_mem = program_memory(cm_roomy, dp.instructions, dp.storage, r);
    const std::vector<double> zero_mem =
        program_memory(cm_roomy, zero.instructions, zero.storage, r);
    const double dp_peak = *std::max_element(dp_mem.begin(), dp_mem.end());
    const double zero_peak = *std::max_element(zero_mem.begin(), zero_mem.end());
    if (zero_peak > 0.8 * dp_peak) continue;  // activations dominate: ZeRO saves too little
    const Cluster tight = make_cluster(devices, seed * 23, std::floor(0.5 * (dp_peak + zero_peak)));
    const CostModel cm(g, tight);
    EXPECT_THROW(search_program(cm, r, seg, zero_dp_space(false)), Error) << "seed " << seed;
    const SearchResult found = search_program(cm, r, seg, zero_dp_space(true));
    int gathered = 0;
    for (const Instruction& in : found.instructions) {
      if (in.kind == InstrKind::AllGather) {
        ASSERT_EQ(g.tensors[static_cast<size_t>(in.tensor)].role, TensorRole::Parameter);
        EXPECT_EQ(found.storage[static_cast<size_t>(in.tensor)], Prop::sharded(0));
        ++gathered;
      }
      if (in.kind == InstrKind::Update &&
          found.storage[static_cast<size_t>(in.tensor)] == Prop::sharded(0)) {
        EXPECT_EQ(in.to, Prop::sharded(0));
      }
    }
    EXPECT_GE(gathered, 1) << "seed " << seed;
    for (size_t d = 0; d < found.device_memory_bytes.size(); ++d)
      EXPECT_LE(found.device_memory_bytes[d], static_cast<double>(tight.devices[d].memory_bytes))
          << "seed " << seed;
    EXPECT_GT(found.cost_s, 0);
    ++checked;
  }
  EXPECT_GE(checked, 3) << "too few graphs where parameters dominate memory";
}

// A parameter copy gathered for use and gathered again in backward is not kept, but it is held
// while read: program_memory holds the largest such copy on top of what is kept, where copies
// that are kept all count (a device of 1 KiB holding shards of nothing fits no program that
// gathers a parameter: Synthesizer.DeviceSelectionLeavesOutADeviceThatHoldsNothing).
TEST(Search, AParameterGatheredAgainInBackwardIsHeldWhileRead) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const Graph g = random_graph(seed + 3100, 4 + static_cast<int>(seed % 3));
    const int devices = 2 + static_cast<int>(seed % 3);
    int nseg = 1;
    const std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    const Cluster c = make_cluster(devices, seed * 23);
    const CostModel cm(g, c);
    const std::vector<std::vector<double>> r = {c.flops_ratios()};
    const SearchResult dp = search_program(cm, r, seg, zero_dp_space(false));
    DistributedProgram kept, again;
    kept.instructions = again.instructions = dp.instructions;
    kept.storage = again.storage = dp.storage;
    kept.ratios = again.ratios = r;
    const int zeroed = test_util::apply_zero_storage(g, kept, false);
    if (zeroed < 2) continue;
    ASSERT_EQ(test_util::apply_zero_storage(g, again, true), zeroed);
    double sum = 0, largest = 0;
    for (const Instruction& in : again.instructions) {
      if (!in.regather) continue;
      const double bytes = static_cast<double>(g.tensors[static_cast<size_t>(in.tensor)].bytes());
      sum += bytes;
      largest = std::max(largest, bytes);
    }
    ASSERT_GT(largest, 0);
    ASSERT_LT(largest, sum);
    const std::vector<double> kept_mem = program_memory(cm, kept.instructions, kept.storage, r);
    const std::vector<double> again_mem = program_memory(cm, again.instructions, again.storage, r);
    for (int d = 0; d < devices; ++d)
      EXPECT_NEAR(kept_mem[d] - again_mem[d], sum - largest, 1e-6 * sum) << "seed " << seed;
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(Search, DominancePruningKeepsTheOptimumAndDropsDominatedStates) {
  int64_t dropped = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    Graph g = random_graph(seed + 300, 4 + static_cast<int>(seed % 5));
    Cluster c = make_cluster(2 + static_cast<int>(seed % 4), seed * 17);
    CostModel cm(g, c);
    int nseg = 1;
    std::vector<int> seg = assign_segments(g, SegmentMode::Single, &nseg);
    std::vector<std::vector<double>> r = {c.flops_ratios()};
    SearchSpace with, without;
    without.dominance_pruning = false;
    SearchResult a = search_program(cm, r, seg, with);
    SearchResult b = search_program(cm, r, seg, without);
    EXPECT_NEAR(a.cost_s, b.cost_s, 1e-12 * std::max(1.0, b.cost_s)) << "seed " << seed;
    EXPECT_EQ(b.states_dominated, 0);
    dropped += a.states_dominated;
  }
  EXPECT_GT(dropped, 0) << "no state was ever dominated: the check never fires";
}

TEST(Search, ReturnedCostIsTheSumOfItsInstructions) {
  Graph g = random_graph(5, 4);
  Cluster c = make_cluster(3, 9);
  CostModel cm(g, c);
  int nseg = 1;
  auto seg = assign_segments(g, SegmentMode::Single, &nseg);
  std::vector<std::vector<double>> r = {c.flops_ratios()};
  SearchResult a = search_program(cm, r, seg, SearchSpace{});
  double sum = 0;
  for (const Instruction& in : a.instructions) sum += in.cost_s;
  EXPECT_NEAR(sum, a.cost_s, 1e-12 * a.cost_s);
  std::vector<Instruction> copy = a.instructions;
  EXPECT_NEAR(recost(cm, copy, r), a.cost_s, 1e-12 * a.cost_s);
  // Every node is computed exactly once, in program order.
  int next = 0;
  for (const Instruction& in : a.instructions) {
    if (in.kind == InstrKind::Compute) {
      EXPECT_EQ(in.node, next++);
    }
  }
  EXPECT_EQ(next, static_cast<int>(g.nodes.size()));
}

TEST(Search, DataParallelSpaceShardsInputsAndReplicatesParameters) {
  Graph g = random_graph(3, 3);
  Cluster c = make_cluster(4, 2);
  CostModel cm(g, c);
  int nseg = 1;
  auto seg = assign_segments(g, SegmentMode::Single, &nseg);
  SearchSpace dp{.inputs_must_shard_dim0 = true, .shard_parameters = false};
  SearchResult a = search_program(cm, {c.flops_ratios()}, seg, dp);
  for (const GraphTensor& t : g.tensors) {
    if (t.role == TensorRole::Parameter) {
      EXPECT_EQ(a.storage[t.id], Prop::replicated()) << t.name;
    }
    if (t.role == TensorRole::Input) {
      EXPECT_EQ(a.storage[t.id], Prop::sharded(0)) << t.name;
    }
  }
}

TEST(Ratios, LinearProgramNeverIncreasesTheCostOfAFixedProgram) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Graph g = random_graph(seed + 100, 4);
    Cluster c = make_cluster(3, seed + 7);
    CostModel cm(g, c);
    int nseg = 1;
    auto seg = assign_segments(g, SegmentMode::Single, &nseg);
    std::vector<std::vector<double>> even = {std::vector<double>(3, 1.0 / 3)};
    SearchResult a = search_program(cm, even, seg, SearchSpace{});
    std::vector<std::vector<double>> r;
    ASSERT_TRUE(optimize_ratios(cm, a.instructions, a.storage, nseg, 1e-3, &r));
    double s = 0;
    for (double x : r[0]) {
      EXPECT_GE(x, 1e-3 - 1e-12);
      s += x;
    }
    EXPECT_NEAR(s, 1.0, 1e-9);
    std::vector<Instruction> copy = a.instructions;
    // The LP's objective is the search's pricing, the sum of the instructions' costs (step_time
    // differs: overlap, and the latency of each gradient bucket). CLP solves to a feasibility
    // tolerance of 1e-7 and the shares are renormalised afterwards, so an optimum equal to the
    // start can come back a few ulps of the LP worse.
    recost(cm, copy, r);
    double sum = 0;
    for (const Instruction& in : copy) sum += in.cost_s;
    EXPECT_LE(sum, a.cost_s * (1 + 1e-5)) << "seed " << seed;
  }
}

TEST(Synthesizer, HapIsNeverWorseThanTheBaselinesAndCarriesItsRatios) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Graph g = random_graph(seed + 40, 5);
    Cluster c = make_cluster(4, seed + 77);
    SynthesisOptions o;
    DistributedProgram hap = synthesize(g, c, o);
    // The program's cost model is that of the devices it runs on.
    const Cluster on = hap.devices.empty() ? c : c.subset(hap.devices);
    CostModel cm(g, on);
    std::vector<Instruction> copy = hap.instructions;
    EXPECT_NEAR(recost(cm, copy, hap.ratios), hap.predicted_step_s, 1e-9 * hap.predicted_step_s);
    for (Strategy s : {Strategy::DpEv, Strategy::DpCp, Strategy::Tp}) {
      o.strategy = s;
      DistributedProgram b = synthesize(g, c, o);
      EXPECT_LE(hap.predicted_step_s, b.predicted_step_s * (1 + 1e-9))
          << strategy_name(s) << " seed " << seed;
    }
  }
}

// With memory just enough for a baseline's program, hap (which can express it) still finds a
// program, no slower, within every device's memory.
TEST(Synthesizer, HapIsNeverWorseThanTheBaselinesUnderTightMemory) {
  int compared = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Graph g = random_graph(seed + 90, 4 + static_cast<int>(seed % 3));
    for (Strategy base : {Strategy::DpEv, Strategy::DpCp, Strategy::Tp}) {
      SynthesisOptions o;
      o.strategy = base;
      DistributedProgram roomy = synthesize(g, make_cluster(3, seed + 5), o);
      const double peak =
          *std::max_element(roomy.device_memory_bytes.begin(), roomy.device_memory_bytes.end());
      Cluster tight = make_cluster(3, seed + 5, std::ceil(peak));
      DistributedProgram b = synthesize(g, tight, o);
      DistributedProgram hap = synthesize(g, tight, SynthesisOptions{});
      EXPECT_LE(hap.predicted_step_s, b.predicted_step_s * (1 + 1e-9))
          << strategy_name(base) << " seed " << seed;
      for (size_t d = 0; d < hap.device_memory_bytes.size(); ++d)
        EXPECT_LE(hap.device_memory_bytes[d], memory_of(tight, hap, d));
      ++compared;
    }
  }
  EXPECT_EQ(compared, 18);
}

// hap's predicted step (`hap`, infinite where it found no program) against each baseline's on
// cluster c: expects it no slower than every baseline that has a program; returns how many did.
int expect_hap_no_slower_than_baselines(const Graph& g, const Cluster& c, double hap,
                                        const std::string& what) {
  int compared = 0;
  for (Strategy s : {Strategy::DpEv, Strategy::DpCp, Strategy::Tp}) {
    SynthesisOptions o;
    o.strategy = s;
    try {
      const double base = synthesize(g, c, o).predicted_step_s;
      EXPECT_LE(hap, base * (1 + 1e-9)) << strategy_name(s) << " " << what;
      ++compared;
    } catch (const Error&) {
    }
  }
  return compared;
}

// hap's plan is never predicted slower than any baseline's, on random small graphs and
// clusters with memory from below the least that fits to plenty (every device, or one alone).
TEST(Synthesizer, HapIsNeverSlowerThanAnyBaselineAsMemoryVaries) {
  int compared = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const Graph g = seed % 2 ? random_graph(seed + 300, 4 + static_cast<int>(seed % 3))
                             : random_dag(seed + 300, 4 + static_cast<int>(seed % 4));
    const int D = 2 + static_cast<int>(seed % 3);
    const DistributedProgram roomy = synthesize(g, make_cluster(D, seed + 11), {});
    const double peak =
        *std::max_element(roomy.device_memory_bytes.begin(), roomy.device_memory_bytes.end());
    for (double f : {0.4, 0.6, 0.8, 1.0, 1.3}) {
      for (int one = -1; one < 1; ++one) {
        Cluster c = make_cluster(D, seed + 11, one < 0 ? f * peak : 2 * peak);
        if (one >= 0) c.devices[0].memory_bytes = static_cast<int64_t>(f * peak);
        double hap = std::numeric_limits<double>::infinity();
        try {
          hap = synthesize(g, c, {}).predicted_step_s;
        } catch (const Error&) {
        }
        compared += expect_hap_no_slower_than_baselines(g, c, hap,
                                                        "seed " + std::to_string(seed) +
                                                            " memory x" + std::to_string(f) +
                                                            (one < 0 ? "" : " (device 0)"));
      }
    }
  }
  EXPECT_GT(compared, 200);  // the rest ran out of memory
}

// Found by sweeping memory on random graphs: a little more memory on one device made the plan
// 300x slower, because the start from memory-proportional shares (which found the fast plan)
// was tried only when no other start fitted. It is now tried wherever memory binds.
TEST(Synthesizer, ALittleMoreMemoryOnOneDeviceDoesNotFallOffACliff) {
  for (const auto& [seed, less, more] :
       {std::tuple<uint64_t, double, double>{6, 0.80, 0.85}, {24, 0.50, 0.55}}) {
    const Graph g = random_dag(seed + 300, 4 + static_cast<int>(seed % 4));
    const int D = 2 + static_cast<int>(seed % 3);
    const DistributedProgram roomy = synthesize(g, make_cluster(D, seed + 11), {});
    const double peak =
        *std::max_element(roomy.device_memory_bytes.begin(), roomy.device_memory_bytes.end());
    auto plan = [&](double f) {
      Cluster c = make_cluster(D, seed + 11, 2 * peak);
      c.devices[0].memory_bytes = static_cast<int64_t>(f * peak);
      return synthesize(g, c, {}).predicted_step_s;
    };
    EXPECT_LE(plan(more), plan(less) * 1.01) << "seed " << seed;
  }
}

// Equal speeds, but one device has a fraction of the other's memory: neither the even nor the
// FLOP-proportional split fits, a memory-weighted one does, and hap finds it.
TEST(Synthesizer, HapSplitsByMemoryWhenNoSpeedBasedSplitFits) {
  Graph g = random_graph(8, 5);
  Cluster roomy = make_cluster(2, 11);
  roomy.devices[1].flops_per_s = roomy.devices[0].flops_per_s;
  SynthesisOptions dp;
  dp.strategy = Strategy::DpEv;
  const double even_peak = synthesize(g, roomy, dp).device_memory_bytes[1];
  Cluster skewed = roomy;
  skewed.devices[0].memory_bytes = int64_t{1} << 40;
  skewed.devices[1].memory_bytes = static_cast<int64_t>(even_peak * 0.4);
  EXPECT_THROW(synthesize(g, skewed, dp), Error);
  SynthesisOptions both;  // (not the one device with ample memory alone)
  both.select_devices = false;
  DistributedProgram hap = synthesize(g, skewed, both);
  ASSERT_EQ(hap.device_memory_bytes.size(), 2u);
  for (size_t d = 0; d < 2; ++d)
    EXPECT_LE(hap.device_memory_bytes[d], static_cast<double>(skewed.devices[d].memory_bytes));
  EXPECT_GT(hap.ratios[0][0], hap.ratios[0][1]);
}

TEST(Synthesizer, MemoryShortfallNamesTheDeviceAndTheBytes) {
  Graph g = random_graph(8, 3);
  Cluster c = make_cluster(2, 3, /*memory_bytes=*/64);
  try {
    synthesize(g, c, SynthesisOptions{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no program fits in memory: the fastest program needs"), std::string::npos)
        << m;
    EXPECT_NE(m.find("bytes of its 64"), std::string::npos) << m;
  }
}

// The plans the synthesizer only tries (explain_out_of_memory off) fail without the search that
// measures the shortfall: the error names the device that ran out first and still says that no
// program fits in memory (what the synthesizer reads of it).
TEST(Synthesizer, PlansOnlyTriedFailWithoutMeasuringTheShortfall) {
  Graph g = random_graph(8, 3);
  Cluster c = make_cluster(2, 3, /*memory_bytes=*/64);
  SynthesisOptions quiet;
  quiet.explain_out_of_memory = false;
  try {
    synthesize(g, c, quiet);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no program fits in memory: every program runs out, device "),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("the fastest program needs"), std::string::npos) << m;
  }
}

// Parameters a strategy must keep whole on every device (data parallelism's) that alone exceed a
// device's memory: the error says so before any search, and hap, which may shard them, plans.
TEST(Synthesizer, ReplicatedParametersThatCannotFitAreRefusedBeforeSearching) {
  Tensor x = Tensor::meta({8, 64}, DType::F32), w = Tensor::meta({64, 64}, DType::F32);
  Graph g = trace([&] { return mean(relu(linear(x, w))); }, {{"w", w}}, {{"x", x}});
  // w with its gradient and AdamW's two moments: 4 x 16 KiB, more than 40 KiB.
  Cluster c = make_cluster(4, 5, /*memory_bytes=*/40 * 1024);
  SynthesisOptions dp;
  dp.strategy = Strategy::DpEv;
  const std::string m = test_util::error_of([&] { synthesize(g, c, dp); });
  EXPECT_HAS(m, "no program fits in memory: the parameters and inputs this strategy keeps whole");
  EXPECT_HAS(m, "need 65536 bytes");
  EXPECT_HAS(m, "more than the 40960 bytes of device 0 (d0, cpu)");
  const DistributedProgram hap = synthesize(g, c, SynthesisOptions{});
  for (const GraphTensor& t : g.tensors)
    if (t.name == "w") {
      EXPECT_EQ(hap.storage[t.id].kind, PropKind::Sharded) << "hap shards w to fit";
    }
}

// The synthesis log: every round, pass and candidate with the states it expanded (they add up to
// the total) and what it found.
TEST(Synthesizer, StepsAccountForEveryStateAndSayWhatEachFound) {
  Graph g = random_graph(44, 6);
  Cluster c = make_cluster(3, 9);
  const DistributedProgram p = synthesize(g, c, SynthesisOptions{});
  ASSERT_FALSE(p.steps.empty());
  EXPECT_EQ(p.steps[0].what, "ratios by FLOP/s, round 1");
  int64_t states = 0;
  double best = std::numeric_limits<double>::infinity();
  for (const SynthesisStep& st : p.steps) {
    states += st.states;
    EXPECT_GE(st.seconds, 0);
    if (st.cost_s >= 0) best = std::min(best, st.cost_s);
  }
  EXPECT_EQ(states, p.states_expanded);
  EXPECT_LE(best, p.predicted_step_s * (1 + 1e-9));
  SynthesisOptions tight;
  tight.max_states = 3;
  const DistributedProgram fallback = synthesize(g, c, tight);
  ASSERT_FALSE(fallback.steps.empty());
  EXPECT_EQ(fallback.steps[0].outcome, "over budget");
  EXPECT_EQ(fallback.steps.back().what, "candidate tp");
}

// The shortfall is the fastest program's need minus the device's memory (not the first overflow
// of some partial program).
TEST(Search, NoProgramFitsNamesTheTrueShortfallOfTheFastestProgram) {
  Graph g = random_graph(8, 3);
  const Cluster roomy = make_cluster(2, 3), tight = make_cluster(2, 3, /*memory_bytes=*/64);
  int nseg = 1;
  const auto seg = assign_segments(g, SegmentMode::Single, &nseg);
  const std::vector<std::vector<double>> r = {roomy.flops_ratios()};
  const CostModel roomy_cm(g, roomy), tight_cm(g, tight);
  const SearchResult fastest = search_program(roomy_cm, r, seg, SearchSpace{});
  const std::vector<double> need =
      program_memory(roomy_cm, fastest.instructions, fastest.storage, r);
  const int d = need[1] > need[0] ? 1 : 0;
  const std::string m =
      test_util::error_of([&] { search_program(tight_cm, r, seg, SearchSpace{}); });
  EXPECT_HAS(m, "the fastest program needs " + std::to_string(static_cast<int64_t>(need[d])) +
                    " bytes on device " + std::to_string(d));
  EXPECT_HAS(m, "short by " + std::to_string(static_cast<int64_t>(std::ceil(need[d] - 64))) +
                    " bytes of its 64");
}

// Out of states while paths run out of memory: the budget error says what memory does too.
TEST(Search, TheBudgetErrorDoesNotHideThatMemoryBinds) {
  // Storing the weight whole (4 x 1 KiB with its gradient and Adam's state) overflows 900 bytes;
  // stored in thirds it fits: the first expansion leaves both kinds of child, and the budget of
  // one state ends the search there.
  Tensor x = Tensor::meta({6, 8}, DType::F32), w = Tensor::meta({8, 8}, DType::F32);
  Graph g = trace([&] { return mean(relu(linear(x, w))); }, {{"w", w}}, {{"x", x}});
  const Cluster c = make_cluster(3, 5, /*memory_bytes=*/900);
  int nseg = 1;
  const auto seg = assign_segments(g, SegmentMode::Single, &nseg);
  SearchSpace space;
  space.max_states = 1;
  try {
    search_program(CostModel(g, c), {c.flops_ratios()}, seg, space);
    FAIL() << "expected a budget error";
  } catch (const SearchBudgetError& e) {
    EXPECT_HAS(e.what(), "raise the search budget");
    EXPECT_HAS(e.what(), "memory binds too");
  }
}

TEST(Synthesizer, DataParallelWithABatchOfOneSaysSo) {
  Tensor x = Tensor::meta({1, 6}, DType::F32), w = Tensor::meta({4, 6}, DType::F32);
  Graph g = trace([&] { return mean(linear(x, w)); }, {{"w", w}}, {{"x", x}});
  Cluster c = make_cluster(2, 5);
  SynthesisOptions o;
  o.strategy = Strategy::DpEv;
  try {
    synthesize(g, c, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("input 'x' has shape [1, 6]"), std::string::npos) << m;
    EXPECT_NE(m.find("batch of at least 2"), std::string::npos) << m;
  }
  // hap splits the features instead: on devices slow enough for splitting to pay, the product
  // runs row-parallel over the contraction (x and w stored Sharded(1), a Partial output).
  Cluster slow;
  slow.name = "slow";
  slow.add_node(
      "n0", {1e9, 1e-5},
      {{"d0", "cpu", 1e6, int64_t{1} << 30, -1}, {"d1", "cpu", 2e6, int64_t{1} << 30, -1}});
  const DistributedProgram p = synthesize(g, slow, SynthesisOptions{});
  int x_id = -1, w_id = -1;
  for (const GraphTensor& t : g.tensors) {
    if (t.name == "x") x_id = t.id;
    if (t.name == "w") w_id = t.id;
  }
  ASSERT_GE(x_id, 0);
  ASSERT_GE(w_id, 0);
  EXPECT_EQ(p.storage[x_id], Prop::sharded(1));
  EXPECT_EQ(p.storage[w_id], Prop::sharded(1));
  const CostModel cm(g, slow);
  bool splits = false;
  for (const Instruction& in : p.instructions)
    splits = splits || (in.kind == InstrKind::Compute && cm.splits_work(in.node, in.signature));
  EXPECT_TRUE(splits);
}

// Over its search budget, hap returns the best baseline program and says so; the baselines
// themselves stop with the budget error.
TEST(Synthesizer, HapOverItsSearchBudgetFallsBackToTheBestBaseline) {
  Graph g = random_graph(44, 6);
  Cluster c = make_cluster(3, 9);
  SynthesisOptions tight;
  tight.max_states = 3;
  DistributedProgram hap = synthesize(g, c, tight);
  EXPECT_EQ(hap.strategy, "hap");
  EXPECT_NE(hap.note.find("over its budget of 3 states"), std::string::npos) << hap.note;
  double best = std::numeric_limits<double>::infinity();
  for (Strategy s : {Strategy::DpCp, Strategy::DpEv, Strategy::Tp}) {
    SynthesisOptions o;
    o.strategy = s;
    best = std::min(best, synthesize(g, c, o).predicted_step_s);
  }
  EXPECT_DOUBLE_EQ(hap.predicted_step_s, best);
  EXPECT_TRUE(synthesize(g, c, SynthesisOptions{}).note.empty());
  tight.strategy = Strategy::DpEv;
  EXPECT_THROW(synthesize(g, c, tight), SearchBudgetError);
}

TEST(Synthesizer, UnknownStrategyNamesTheValidOnes) {
  EXPECT_EQ(parse_strategy("dp-cp"), Strategy::DpCp);
  try {
    parse_strategy("zero");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hap, dp-ev, dp-cp, tp"), std::string::npos);
  }
}

TEST(Segments, PerBlockGivesEachNumberedModuleItsOwnSegment) {
  Tensor x = Tensor::meta({4, 3}, DType::F32);
  Graph g = trace(
      [&] {
        Tensor h = x;
        {
          ops::ScopeGuard s("blocks.0");
          h = gelu(h);
        }
        {
          ops::ScopeGuard s("blocks.1");
          ops::ScopeGuard t("mlp");
          h = relu(h);
        }
        {
          ops::ScopeGuard s("head");
          h = tanh(h);
        }
        return mean(h);
      },
      {}, {{"x", x}});
  int n = 0;
  auto seg = assign_segments(g, SegmentMode::PerBlock, &n);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(seg[0], 1);
  EXPECT_EQ(seg[1], 2);
  EXPECT_EQ(seg[2], 0) << "a module that is not a numbered block belongs to segment 0";
  EXPECT_EQ(seg[3], 0) << "an op of no module belongs where its input comes from (head: 0)";
  EXPECT_EQ(g.nodes[1].module, "blocks.1.mlp");
}

TEST(Segments, AnOpOfNoModuleJoinsTheLatestBlockOfItsInputs) {
  // A custom model's own forward, between and after its blocks: the residual add after block k
  // reads block k's output and belongs to block k.
  Tensor x = Tensor::meta({4, 3}, DType::F32);
  Graph g = trace(
      [&] {
        Tensor a, b;
        {
          ops::ScopeGuard s("layers.0", ops::ScopeGuard::kAbsolute);
          a = gelu(x);
        }
        Tensor r0 = x + a;  // no module: block 0's
        {
          ops::ScopeGuard s("layers.1.fc", ops::ScopeGuard::kAbsolute);
          b = relu(r0);
        }
        Tensor r1 = r0 + b;  // reads blocks 0 and 1: block 1's
        return mean(r1);     // block 1's
      },
      {}, {{"x", x}});
  int n = 0;
  auto seg = assign_segments(g, SegmentMode::PerBlock, &n);
  ASSERT_EQ(g.nodes.size(), 5u);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(seg, (std::vector<int>{1, 1, 2, 2, 2}));
  EXPECT_EQ(g.nodes[1].module, "");
  EXPECT_EQ(g.nodes[2].module, "layers.1.fc");
}

}  // namespace
}  // namespace hap::synth

namespace hap::synth {
namespace {

// Two nodes: 4 fast devices on a fast link, 4 devices 1/50 as fast on another node, and a slow
// link between the nodes. Every program on all 8 devices all-reduces its gradients over the slow
// link; the 4 fast devices alone are faster, and hap finds that.
Cluster two_speed_cluster() {
  Cluster c;
  c.name = "two-speed";
  std::vector<Device> fast, slow;
  for (int i = 0; i < 4; ++i) {
    fast.push_back({"fast" + std::to_string(i), "a", 5e6, int64_t{1} << 34, -1});
    slow.push_back({"slow" + std::to_string(i), "b", 1e5, int64_t{1} << 34, -1});
  }
  // The slow node first: the devices left out are not simply the last ranks.
  c.add_node("slow-node", {1e9, 1e-5}, slow);
  c.add_node("fast-node", {1e10, 1e-6}, fast);
  c.inter_node = {1e6, 1e-3};
  c.validate();
  return c;
}

TEST(Synthesizer, HapLeavesOutDevicesWhereThatIsPredictedFaster) {
  const Graph g = random_graph(5, 4);
  const Cluster c = two_speed_cluster();
  const DistributedProgram p = synthesize(g, c, SynthesisOptions{});
  EXPECT_EQ(p.devices, (std::vector<int>{4, 5, 6, 7})) << p.devices_note;
  ASSERT_EQ(p.ratios[0].size(), 4u);
  EXPECT_NE(p.devices_note.find("left out: slow0, slow1, slow2, slow3"), std::string::npos)
      << p.devices_note;
  // Faster than every baseline on all devices, and than hap made to use them all.
  SynthesisOptions all;
  all.select_devices = false;
  const DistributedProgram on_all = synthesize(g, c, all);
  EXPECT_TRUE(on_all.devices.empty());
  EXPECT_LT(p.predicted_step_s, on_all.predicted_step_s);
  for (Strategy s : {Strategy::DpEv, Strategy::DpCp, Strategy::Tp}) {
    SynthesisOptions o;
    o.strategy = s;
    EXPECT_LT(p.predicted_step_s, synthesize(g, c, o).predicted_step_s) << strategy_name(s);
  }
  // No slower than hap on any subset of the fastest it considers.
  for (int k : {1, 2}) {
    std::vector<int> fastest;
    for (int d = 4; d < 4 + k; ++d) fastest.push_back(d);
    SynthesisOptions o;
    o.devices = fastest;
    EXPECT_LE(p.predicted_step_s, synthesize(g, c, o).predicted_step_s * (1 + 1e-9)) << k;
  }
  // The steps say what was tried, and their states add up.
  int64_t states = 0;
  bool judged = false;
  for (const SynthesisStep& st : p.steps) {
    states += st.states;
    judged = judged || st.what == "devices: the 4 fastest";
  }
  EXPECT_TRUE(judged);
  EXPECT_EQ(states, p.states_expanded);
  // The same program on every call (ranks plan independently).
  EXPECT_EQ(program_hash(p), program_hash(synthesize(g, c, SynthesisOptions{})));
}

// Three tiers on one node: 2 fast devices (4 GFLOP/s), 2 half as fast and 4 of `slow` FLOP/s, the
// middle tier's memory `middle` bytes, the others' plenty.
Cluster three_tier_cluster(double middle, double slow = 1e9) {
  Cluster c;
  c.name = "three-tier";
  std::vector<Device> devs;
  for (int i = 0; i < 8; ++i) {
    const double flops = i < 2 ? 4e9 : i < 4 ? 2e9 : slow;
    const double memory = i >= 2 && i < 4 ? middle : 1e12;
    devs.push_back({"d" + std::to_string(i), "cpu", flops, static_cast<int64_t>(memory), -1});
  }
  c.add_node("n0", {1e10, 1e-6}, devs);
  c.validate();
  return c;
}

// Whether hap, pinned to `devices` of `c` (all: empty) with every device's memory `memory`
// bytes, finds a program that fits without recomputing.
bool hap_fits(const Graph& g, const Cluster& c, const std::vector<int>& devices, double memory) {
  Cluster m = c;
  for (Device& d : m.devices) d.memory_bytes = static_cast<int64_t>(memory);
  SynthesisOptions o;
  o.devices = devices;
  o.select_devices = false;
  o.recompute = Recompute::Off;
  try {
    synthesize(g, m, o);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The least memory per device (to 1%) with which hap pinned to `devices` fits.
double least_memory_to_fit(const Graph& g, const Cluster& c, const std::vector<int>& devices) {
  double lo = 1, hi = 1e12;
  EXPECT_TRUE(hap_fits(g, c, devices, hi));
  while (hi > lo * 1.01) {
    const double mid = std::sqrt(lo * hi);
    (hap_fits(g, c, devices, mid) ? hi : lo) = mid;
  }
  return hi;
}

// Device selection plans the subsets of the fastest from the largest down with hap, and leaves
// unplanned a smaller one that must run out of memory as a larger one did (no larger smallest
// memory); DeviceSelectionLeavesOutADeviceThatHoldsNothing: it plans one whose devices all have
// more memory than the larger one's smallest.
TEST(Synthesizer, DeviceSelectionSkipsOnlySubsetsThatMustRunOutOfMemory) {
  const Graph g = random_graph(11, 4, 4096);  // activations outweigh the parameters
  // Every device with the same memory, between what hap needs on all 8 and on the 4 fastest:
  // all 8 fit, the 4 fastest do not, and the 2 and 1 fastest (no more memory) must not either.
  // The slow tier is slow enough that the 4 fastest could be faster than all 8 (their compute
  // bound is not slower than the plan on all 8: they are planned).
  const Cluster roomy = three_tier_cluster(1e12, 1e7);
  const double on_8 = least_memory_to_fit(g, roomy, {});
  const double on_4 = least_memory_to_fit(g, roomy, {0, 1, 2, 3});
  ASSERT_GT(on_4, on_8 * 1.2) << "the memory does not separate the subsets";
  const double memory = std::sqrt(on_4 * on_8);
  ASSERT_TRUE(hap_fits(g, roomy, {}, memory));
  ASSERT_FALSE(hap_fits(g, roomy, {0, 1, 2, 3}, memory));
  Cluster small = roomy;
  for (Device& d : small.devices) d.memory_bytes = static_cast<int64_t>(memory);
  SynthesisOptions no_recomputation;  // (that a subset may fit by recomputing: other tests)
  no_recomputation.recompute = Recompute::Off;
  const DistributedProgram q = synthesize(g, small, no_recomputation);
  std::map<std::string, SynthesisStep> step;
  for (const SynthesisStep& st : q.steps) step[st.what] = st;
  ASSERT_TRUE(step.count("devices: the 4 fastest"));
  EXPECT_EQ(step["devices: the 4 fastest"].outcome, "out of memory");
  for (const char* k : {"devices: the 2 fastest", "devices: the 1 fastest"}) {
    ASSERT_TRUE(step.count(k)) << k;
    EXPECT_EQ(step[k].outcome, "out of memory (as the 4 fastest are; not planned)") << k;
    EXPECT_EQ(step[k].states, 0) << k;
    EXPECT_FALSE(hap_fits(g, small,
                          std::string(k).find(" 2 ") != std::string::npos ? std::vector<int>{0, 1}
                                                                          : std::vector<int>{0},
                          memory))
        << k;
  }
  EXPECT_TRUE(q.devices.empty()) << q.devices_note;
}

// A subset whose compute alone (every FLOP of the step on its FLOP/s) is slower than a plan in
// hand is not planned; hap pinned to it is indeed slower than the plan chosen.
TEST(Synthesizer, DeviceSelectionDoesNotPlanSubsetsSlowerAtBestThanAPlanInHand) {
  const Graph g = random_graph(11, 4, 4096);  // compute outweighs communication
  const Cluster c = three_tier_cluster(1e12);
  const DistributedProgram p = synthesize(g, c, SynthesisOptions{});
  int skipped = 0;
  for (const SynthesisStep& st : p.steps) {
    if (st.outcome.rfind("not planned: ", 0) != 0) continue;
    ++skipped;
    EXPECT_EQ(st.states, 0) << st.what;
    const int k = std::stoi(st.what.substr(std::string("devices: the ").size()));
    SynthesisOptions pinned;
    for (int d = 0; d < k; ++d) pinned.devices.push_back(d);
    EXPECT_GT(synthesize(g, c, pinned).predicted_step_s, p.predicted_step_s) << st.what;
    EXPECT_GT(CostModel(g, c.subset(pinned.devices)).compute_lower_bound_s(), p.predicted_step_s)
        << st.what;
  }
  EXPECT_GE(skipped, 1) << "no subset was left unplanned: the test exercises nothing";
}

// A device too small for any program is left out instead of failing the plan: nothing fits on
// all devices, but hap on the fastest does, and the plan says so.
TEST(Synthesizer, DeviceSelectionLeavesOutADeviceThatHoldsNothing) {
  const Graph g = random_graph(11, 4, 4096);
  const Cluster c = three_tier_cluster(1024);  // the middle tier: 1 KiB
  SynthesisOptions all;
  all.select_devices = false;
  EXPECT_THROW(synthesize(g, c, all), Error);
  const DistributedProgram p = synthesize(g, c, SynthesisOptions{});
  EXPECT_EQ(p.devices, (std::vector<int>{0, 1})) << p.devices_note;
  EXPECT_HAS(p.devices_note, "nothing fits on all 8");
  EXPECT_HAS(p.devices_note, "left out: d2, d3, d4, d5, d6, d7");
  SynthesisOptions pinned;
  pinned.devices = {0, 1};
  EXPECT_EQ(program_hash(p), program_hash(synthesize(g, c, pinned)));
  std::map<std::string, SynthesisStep> step;
  for (const SynthesisStep& st : p.steps) step[st.what] = st;
  ASSERT_TRUE(step.count("devices: all 8"));
  EXPECT_EQ(step["devices: all 8"].outcome, "out of memory");
  // The 4 fastest run out too (recomputing does not help them); the 2 fastest, whose every
  // device has more memory than the 4's smallest, are planned (and the one fastest, unless its
  // compute alone is slower than their plan).
  ASSERT_TRUE(step.count("devices: the 4 fastest, recomputing"));
  EXPECT_EQ(step["devices: the 4 fastest, recomputing"].outcome, "out of memory");
  ASSERT_TRUE(step.count("devices: the 2 fastest"));
  EXPECT_GT(step["devices: the 2 fastest"].cost_s, 0) << step["devices: the 2 fastest"].outcome;
  ASSERT_TRUE(step.count("devices: the 1 fastest"));
  EXPECT_TRUE(step["devices: the 1 fastest"].cost_s > 0 ||
              step["devices: the 1 fastest"].outcome.rfind("not planned: ", 0) == 0)
      << step["devices: the 1 fastest"].outcome;
  // Where no subset fits either, the error is the one on all devices.
  Cluster tiny = c;
  for (Device& d : tiny.devices) d.memory_bytes = 1024;
  std::string on_all, selected;
  try {
    synthesize(g, tiny, all);
  } catch (const Error& e) {
    on_all = e.what();
  }
  try {
    synthesize(g, tiny, SynthesisOptions{});
  } catch (const Error& e) {
    selected = e.what();
  }
  EXPECT_HAS(on_all, "fits in memory");
  EXPECT_EQ(selected, on_all);
}

TEST(Synthesizer, APinnedSubsetOfDevicesIsPlannedOnThoseAlone) {
  const Graph g = random_graph(5, 4);
  const Cluster c = two_speed_cluster();
  SynthesisOptions o;
  o.devices = {6, 1};  // in any order
  const DistributedProgram p = synthesize(g, c, o);
  EXPECT_EQ(p.devices, (std::vector<int>{1, 6}));
  ASSERT_EQ(p.ratios[0].size(), 2u);
  EXPECT_NE(p.devices_note.find("pinned"), std::string::npos) << p.devices_note;
  SynthesisOptions all;
  all.select_devices = false;
  const DistributedProgram direct = synthesize(g, c.subset({1, 6}), all);
  EXPECT_DOUBLE_EQ(p.predicted_step_s, direct.predicted_step_s);
  // Pinning every device is planning on all of them.
  o.devices = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_TRUE(synthesize(g, c, o).devices.empty());
  for (const std::vector<int>& bad : {std::vector<int>{8}, std::vector<int>{2, 2}}) {
    o.devices = bad;
    EXPECT_THROW(synthesize(g, c, o), Error);
  }
}

TEST(Cluster, ASubsetKeepsItsDevicesNodesAndLinks) {
  const Cluster c = two_speed_cluster();
  const Cluster s = c.subset({7, 0, 5});
  ASSERT_EQ(s.size(), 3);
  EXPECT_EQ(s.devices[0].name, "slow0");
  EXPECT_EQ(s.devices[1].name, "fast1");
  EXPECT_EQ(s.devices[2].name, "fast3");
  ASSERT_EQ(s.num_nodes(), 2);
  EXPECT_EQ(s.nodes[0].name, "slow-node");
  EXPECT_EQ(s.nodes[1].devices, (std::vector<int>{1, 2}));
  EXPECT_EQ(s.link_between(1, 2).bandwidth_bytes_per_s, 1e10);
  EXPECT_EQ(s.link_between(0, 1).bandwidth_bytes_per_s, 1e6);
  EXPECT_NO_THROW(s.validate());
  EXPECT_THROW(c.subset({}), Error);
  EXPECT_THROW(c.subset({3, 3}), Error);
  EXPECT_THROW(c.subset({-1}), Error);
}

// Activation recomputation: on one device whose memory holds the parameters but not every
// activation, only a recomputing program fits: recompute auto finds one (the fewest segments
// that fit: no slower than recomputing all of them, slower than recomputing none by the forward
// run again, within the device's memory), off is an OptionsError naming parallel.recompute, and
// with plenty of memory auto recomputes nothing.
// A narrow GPT of four blocks (a segment each) on long sequences, `batch` of `seq` tokens:
// activations dominate its memory.
Graph narrow_gpt_graph(int64_t seq, int64_t batch) {
  nn::GPTConfig cfg;
  cfg.vocab_size = 50;
  cfg.block_size = seq;
  cfg.n_layer = 4;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  std::shared_ptr<nn::GPT> gpt;
  {
    MetaGuard meta;
    gpt = std::make_shared<nn::GPT>(cfg);
  }
  Tensor idx = Tensor::meta({batch, seq}, DType::I64);
  Tensor targets = Tensor::meta({batch, seq}, DType::I64);
  return trace([&] { return gpt->loss(idx, targets); }, gpt->named_parameters(),
               {{"idx", idx}, {"targets", targets}});
}

TEST(Synthesizer, OnlyARecomputingProgramFitsAndAutoFindsIt) {
  const Graph g = narrow_gpt_graph(128, 8);
  Cluster c = make_cluster(1, 3);
  SynthesisOptions off;
  off.recompute = Recompute::Off;
  const DistributedProgram plain = synthesize(g, c, off);
  EXPECT_TRUE(plain.recompute.empty() ||
              std::count(plain.recompute.begin(), plain.recompute.end(), true) == 0);
  const DistributedProgram roomy_auto = synthesize(g, c, {});
  EXPECT_EQ(std::count(roomy_auto.recompute.begin(), roomy_auto.recompute.end(), true), 0);
  SynthesisOptions all;
  all.recompute = Recompute::All;
  const DistributedProgram again = synthesize(g, c, all);
  ASSERT_FALSE(again.recompute.empty());
  EXPECT_GT(again.predicted_step_s, plain.predicted_step_s);
  ASSERT_LT(again.device_memory_bytes[0], plain.device_memory_bytes[0]);
  // Between the two: only the recomputing program fits.
  c.devices[0].memory_bytes =
      static_cast<int64_t>(0.5 * (again.device_memory_bytes[0] + plain.device_memory_bytes[0]));
  const DistributedProgram fitted = synthesize(g, c, {});
  const auto recomputed = std::count(fitted.recompute.begin(), fitted.recompute.end(), true);
  EXPECT_GE(recomputed, 1);
  EXPECT_LE(recomputed, static_cast<long>(again.recompute.size()));
  EXPECT_LE(fitted.predicted_step_s, again.predicted_step_s * (1 + 1e-9));
  EXPECT_GT(fitted.predicted_step_s, plain.predicted_step_s);
  EXPECT_LE(fitted.device_memory_bytes[0], static_cast<double>(c.devices[0].memory_bytes));
  ASSERT_FALSE(fitted.steps.empty());
  EXPECT_NE(fitted.steps[0].what.find("recomput"), std::string::npos) << fitted.steps[0].what;
  try {
    synthesize(g, c, off);
    FAIL() << "recompute off with a model that fits only with it";
  } catch (const OptionsError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.recompute"), std::string::npos) << e.what();
  }
}

// Where only recomputing programs fit, hap's plan is still never predicted slower than any
// baseline's (each planned with recomputation auto, choosing its own number of segments to
// recompute): a GPT whose activations dominate, on random clusters of 2-4 devices with memory
// between what recomputing every segment needs and what recomputing none does. More memory
// never gives a slower plan there either: where the program on all devices starts to fit
// without recomputing, a subset of devices that fits only by recomputing is still judged (seed
// 3: 8.3 ms per step on both devices at 0.9, 3.2 ms on the faster one alone at 0.65).
TEST(Synthesizer, HapIsNeverSlowerThanAnyBaselineWhereOnlyRecomputationFits) {
  const Graph g = narrow_gpt_graph(64, 12);
  int compared = 0, recomputing = 0;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const int D = 2 + static_cast<int>(seed % 3);
    SynthesisOptions all;
    all.recompute = Recompute::All;
    const DistributedProgram plain = synthesize(g, make_cluster(D, seed + 40), {});
    const DistributedProgram again = synthesize(g, make_cluster(D, seed + 40), all);
    const double most =
        *std::max_element(plain.device_memory_bytes.begin(), plain.device_memory_bytes.end());
    const double least =
        *std::max_element(again.device_memory_bytes.begin(), again.device_memory_bytes.end());
    ASSERT_LT(least, most) << "seed " << seed;
    double with_less = std::numeric_limits<double>::infinity();
    for (double f : {0.4, 0.65, 0.9}) {
      const Cluster c = make_cluster(D, seed + 40, least + f * (most - least));
      double hap = std::numeric_limits<double>::infinity();
      try {
        const DistributedProgram p = synthesize(g, c, {});
        hap = p.predicted_step_s;
        recomputing += std::count(p.recompute.begin(), p.recompute.end(), true) > 0;
      } catch (const Error&) {
      }
      if (std::isfinite(with_less)) {
        EXPECT_LE(hap, with_less * 1.01) << "seed " << seed << " memory fraction " << f;
      }
      with_less = hap;
      compared += expect_hap_no_slower_than_baselines(
          g, c, hap, "seed " + std::to_string(seed) + " memory fraction " + std::to_string(f));
    }
  }
  EXPECT_GT(compared, 15);
  EXPECT_GT(recomputing, 4);
}

// The parameters a program stores Sharded and all-gathers for use (ZeRO storage).
int zero_stored(const DistributedProgram& p, const Graph& g) {
  int n = 0;
  for (const Instruction& in : p.instructions)
    n += in.kind == InstrKind::AllGather && g.tensors[in.tensor].role == TensorRole::Parameter;
  return n;
}

// ZeRO storage auto: where memory binds, hap's plan with it is never predicted slower than
// without it (off), and on some of these random models and clusters it is what fits, or what is
// faster (the report's first step says so); with ample memory auto plans as off does unless
// storing every parameter read whole sharded is predicted faster (the log's last step says so),
// and on is never predicted slower than off. Where only it fits, off is an OptionsError naming the
// key.
TEST(Synthesizer, ZeroStorageAutoIsNeverSlowerThanOffAndHelpsWhereMemoryIsTight) {
  int compared = 0, helped = 0, only = 0, all_kept = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const Graph g = random_graph(seed + 4200, 4 + static_cast<int>(seed % 3));
    const int devices = 2 + static_cast<int>(seed % 2);
    SynthesisOptions off;
    off.segments = SegmentMode::Single;
    off.select_devices = false;
    off.recompute = Recompute::Off;
    off.zero_storage = ZeroStorage::Off;
    SynthesisOptions automatic = off;
    automatic.zero_storage = ZeroStorage::Auto;
    const DistributedProgram roomy_off = synthesize(g, make_cluster(devices, seed * 29), off);
    const DistributedProgram roomy_auto =
        synthesize(g, make_cluster(devices, seed * 29), automatic);
    // With ample memory auto plans as off does, unless (devices that differ in speed) the plan
    // with every parameter read whole stored sharded is faster, which the log's last step says.
    if (program_hash(roomy_auto) != program_hash(roomy_off)) {
      ++all_kept;
      EXPECT_LT(roomy_auto.predicted_step_s, roomy_off.predicted_step_s) << "seed " << seed;
      ASSERT_FALSE(roomy_auto.steps.empty());
      EXPECT_NE(roomy_auto.steps.back().what.find("stored sharded"), std::string::npos)
          << roomy_auto.steps.back().what;
      EXPECT_NE(roomy_auto.steps.back().what.find("is faster, kept"), std::string::npos)
          << roomy_auto.steps.back().what;
      EXPECT_GT(zero_stored(roomy_auto, g), 0) << "seed " << seed;
    }
    SynthesisOptions on = off;
    on.zero_storage = ZeroStorage::On;  // tried in every plan, kept where faster
    EXPECT_LE(synthesize(g, make_cluster(devices, seed * 29), on).predicted_step_s,
              roomy_off.predicted_step_s * (1 + 1e-9))
        << "seed " << seed;
    const double peak = *std::max_element(roomy_off.device_memory_bytes.begin(),
                                          roomy_off.device_memory_bytes.end());
    for (double fraction : {0.95, 0.8, 0.65}) {
      const Cluster c = make_cluster(devices, seed * 29, std::floor(peak * fraction));
      std::optional<DistributedProgram> without, with;
      std::string refused;
      try {
        without = synthesize(g, c, off);
      } catch (const OptionsError& e) {
        refused = e.what();
      } catch (const Error&) {
      }
      try {
        with = synthesize(g, c, automatic);
      } catch (const Error&) {
      }
      if (without) {
        ASSERT_TRUE(with.has_value()) << "seed " << seed << ": auto found nothing where off did";
        EXPECT_LE(with->predicted_step_s, without->predicted_step_s * (1 + 1e-9))
            << "seed " << seed << " memory " << fraction;
        ++compared;
      }
      if (!with) continue;
      for (size_t d = 0; d < with->device_memory_bytes.size(); ++d)
        EXPECT_LE(with->device_memory_bytes[d], memory_of(c, *with, d));
      const bool zero =
          !with->steps.empty() && with->steps[0].what.find("ZeRO storage") != std::string::npos;
      if (zero) {
        ++helped;
        EXPECT_TRUE(!without || with->predicted_step_s < without->predicted_step_s)
            << with->steps[0].what;
        // Where only it fits, off (recomputation off too) is refused naming the key.
        if (!without) {
          ++only;
          EXPECT_NE(refused.find("parallel.zero_storage: off"), std::string::npos)
              << "seed " << seed << ": " << refused;
        }
      }
    }
  }
  EXPECT_GE(compared, 20);
  EXPECT_GE(helped, 5) << "ZeRO storage rarely fitted or helped: the test exercises little";
  EXPECT_GE(only, 1) << "no case where only ZeRO storage fits";
  std::printf("ZeRO storage for every parameter kept with ample memory on %d of 24\n", all_kept);
}

// ZeroStorage::All (parallel.zero_storage: all) stores every parameter it may sharded: on random
// models and clusters no parameter with a row per device keeps a whole copy whose gradient is
// all-reduced; each is gathered for use instead.
TEST(Synthesizer, ZeroStorageAllStoresEveryParameterItMaySharded) {
  int sharded = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const Graph g = random_graph(seed + 4300, 4 + static_cast<int>(seed % 3));
    const int devices = 2 + static_cast<int>(seed % 2);
    SynthesisOptions o;
    o.segments = SegmentMode::Single;
    o.select_devices = false;
    o.recompute = Recompute::Off;
    o.zero_storage = ZeroStorage::All;
    const DistributedProgram p = synthesize(g, make_cluster(devices, seed * 37), o);
    for (const Instruction& in : p.instructions) {
      if (in.kind != InstrKind::GradAllReduce) continue;
      const GraphTensor& t = g.tensors[in.tensor];
      if (t.role != TensorRole::Parameter) continue;
      EXPECT_TRUE(t.shape.empty() || t.shape[0] < devices)
          << "seed " << seed << ": " << t.name << " stored whole";
    }
    sharded += zero_stored(p, g);
  }
  EXPECT_GE(sharded, 8);
}

// Sufficient factor broadcasting auto: on random models and clusters hap's plan is never
// predicted slower than with it off (which never broadcasts factors); where the plan broadcasts
// them, its report's first step says so and the plan without them was predicted no faster.
TEST(Synthesizer, FactorBroadcastAutoIsNeverSlowerThanOffAndIsChosenWhereItPays) {
  int chosen = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const Graph g = random_graph(seed + 5100, 3 + static_cast<int>(seed % 3),
                                 seed % 2 ? 0 : 4 + static_cast<int64_t>(seed % 5));
    const int devices = 2 + static_cast<int>(seed % 2);
    const Cluster c = make_cluster(devices, seed * 31, 1e12, seed % 3 ? 1e-8 : -1);
    SynthesisOptions off;
    off.segments = SegmentMode::Single;
    off.select_devices = false;
    off.factor_broadcast = FactorBroadcast::Off;
    SynthesisOptions automatic = off;
    automatic.factor_broadcast = FactorBroadcast::Auto;
    const DistributedProgram without = synthesize(g, c, off);
    const DistributedProgram with = synthesize(g, c, automatic);
    EXPECT_LE(with.predicted_step_s, without.predicted_step_s * (1 + 1e-9)) << "seed " << seed;
    for (const Instruction& in : without.instructions)
      EXPECT_NE(in.kind, InstrKind::FactorBroadcast) << "seed " << seed;
    const bool broadcast =
        std::any_of(with.instructions.begin(), with.instructions.end(),
                    [](const Instruction& in) { return in.kind == InstrKind::FactorBroadcast; });
    if (!broadcast) continue;
    ++chosen;
    ASSERT_FALSE(with.steps.empty());
    EXPECT_NE(with.steps[0].what.find("factor broadcasting at"), std::string::npos)
        << with.steps[0].what;
    EXPECT_NE(with.steps[0].what.find("kept"), std::string::npos) << with.steps[0].what;
  }
  EXPECT_GE(chosen, 2) << "no plan broadcast factors: the test exercises little";
}

// Where a batch has few rows, whole-row rounding decides the step time more than the ratios do:
// hap's plan is never slower than data parallelism under the best split of the rows that exists
// (every split of B rows over the devices, enumerated), as the apportionment and the granule
// descent find it (within 0.001%: a few costs follow the ratios themselves, not whole rows);
// before them, hap's plan was up to 2.7% slower here, the LP's ratios rounded by largest
// remainder.
TEST(Synthesizer, HapIsNoSlowerThanTheBestWholeRowSplitOfASmallBatch) {
  int checked = 0;
  for (uint64_t seed = 1; seed <= 60 && checked < 12; ++seed) {
    const Graph g = random_graph(seed + 2000, 3);
    int64_t rows = 0;
    for (const GraphTensor& t : g.tensors)
      if (t.role == TensorRole::Input) rows = t.shape[0];
    if (rows > 14) continue;
    const int D = 3 + static_cast<int>(seed % 2);
    const Cluster c = make_cluster(D, seed + 77);
    SynthesisOptions o;
    o.segments = SegmentMode::Single;
    o.select_devices = false;
    o.strategy = Strategy::DpCp;
    const DistributedProgram dp = synthesize(g, c, o);
    const CostModel cm(g, c);
    double best_split = std::numeric_limits<double>::infinity();
    std::vector<int64_t> count(static_cast<size_t>(D), 0);
    // Every way to give `rows` rows to D devices.
    std::function<void(int, int64_t)> split = [&](int d, int64_t left) {
      if (d == D - 1) {
        count[static_cast<size_t>(d)] = left;
        std::vector<double> r;
        for (int64_t n : count) r.push_back(static_cast<double>(n) / static_cast<double>(rows));
        std::vector<Instruction> instrs = dp.instructions;
        best_split = std::min(best_split, recost(cm, instrs, {r}));
        return;
      }
      for (int64_t n = 0; n <= left; ++n) {
        count[static_cast<size_t>(d)] = n;
        split(d + 1, left - n);
      }
    };
    split(0, rows);
    o.strategy = Strategy::Hap;
    const double hap = synthesize(g, c, o).predicted_step_s;
    EXPECT_LE(hap, best_split * (1 + 1e-5)) << "seed " << seed << ": " << rows << " rows on " << D
                                            << " devices; dp-cp " << dp.predicted_step_s;
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// Monotone under memory (issue 13 item 7), on random small graphs and clusters, memory swept
// from 0.3x to 1.6x the peak of the plan found with plenty, on every device and on device 0 alone:
// - once the plan is the one found with plenty (memory no longer binds), more memory keeps it,
//   exactly: hap keeps the program it finds without memory limits wherever that fits;
// - where memory binds, hap searches under the limits, a local search, and again from its plan's
//   ratios under a ladder of tighter limits (x 0.9 to x 0.6), whose programs fit too: more memory
//   may still find a slightly slower plan. Over these 48 seeds (2026-12-06), 6 of 509 such steps
//   do, by 0.19% at most (before the ladder 12, one by 4.7%). What remains is where the search's
//   own objective and the step's final price (rounding to whole granules, overlap, latency shared
//   by buckets) rank two programs apart: with a little less memory the program it prefers does
//   not fit and the one it finds instead prices better; with more, the plan found without limits
//   fits and is kept. Over 200 seeds (HAP_MEMORY_SWEEP_SEEDS=200), 38 of 2151 binding steps are
//   slower (37 before bucketed gathers chose their form with their share of the buckets'
//   latency), 4 by more than 1%, the worst by 10.7% on a graph whose step takes 0.24 us (shards of
//   whole granules: the ratio LP's point and the granule descent land elsewhere with more
//   memory). Before the step time shared the link between the backward pass's collectives and
//   the gradient buckets, 46 were, 7 by more than 1%, one by 9.6% where the price let a bucket
//   overlap an all-to-all.
TEST(Synthesizer, MoreMemoryNeverYieldsASlowerPlan) {
  int compared = 0, binding = 0, slower = 0;
  double worst = 0;
  // HAP_MEMORY_SWEEP_SEEDS widens the sweep (the figures above over 200 seeds).
  const char* wider = std::getenv("HAP_MEMORY_SWEEP_SEEDS");
  const uint64_t seeds = wider != nullptr ? std::strtoull(wider, nullptr, 10) : 48;
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    const Graph g = seed % 2 ? random_graph(seed + 500, 4 + static_cast<int>(seed % 3))
                             : random_dag(seed + 500, 4 + static_cast<int>(seed % 4));
    const int D = 2 + static_cast<int>(seed % 3);
    SynthesisOptions all;
    all.select_devices = false;
    const DistributedProgram roomy = synthesize(g, make_cluster(D, seed + 31), all);
    const double peak =
        *std::max_element(roomy.device_memory_bytes.begin(), roomy.device_memory_bytes.end());
    const double plenty = synthesize(g, make_cluster(D, seed + 31), {}).predicted_step_s;
    for (const bool one : {false, true}) {
      double previous = std::numeric_limits<double>::infinity();
      for (int tenths = 3; tenths <= 16; ++tenths) {
        const double f = tenths / 10.0;
        Cluster c = make_cluster(D, seed + 31, one ? 2 * peak : std::ceil(f * peak));
        if (one) c.devices[0].memory_bytes = static_cast<int64_t>(std::ceil(f * peak));
        double cost = std::numeric_limits<double>::infinity();
        try {
          cost = synthesize(g, c, {}).predicted_step_s;
        } catch (const Error&) {
        }
        if (std::isfinite(previous)) {
          ++compared;
          char what[200];
          std::snprintf(what, sizeof(what),
                        "seed %llu: %s memory x%.1f -> x%.1f: %.6g s -> %.6g s (with plenty: "
                        "%.6g s)",
                        static_cast<unsigned long long>(seed),
                        one ? "device 0's" : "every device's", f - 0.1, f, previous, cost, plenty);
          if (std::abs(previous - plenty) <= 1e-12 * plenty) {
            EXPECT_NEAR(cost, plenty, 1e-12 * plenty) << what;
          } else {
            ++binding;
            EXPECT_LE(cost, previous * 1.01) << what;
            if (cost > previous * (1 + 1e-9)) ++slower;
            worst = std::max(worst, cost / previous - 1);
          }
        }
        previous = cost;
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(binding, 200);
  std::printf(
      "memory sweep: %d steps up in memory, %d where memory binds; %d of those found a "
      "slower plan, by %.2f%% at most\n",
      compared, binding, slower, 100 * worst);
}

}  // namespace
}  // namespace hap::synth
