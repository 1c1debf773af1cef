#include "synth/synthesizer.h"

#include <ClpSimplex.hpp>
#include <CoinPackedMatrix.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <tuple>

#include "core/split.h"
#include "synth/shard_layout.h"

namespace hap::synth {

namespace {
// Share of each device's memory the ratio LP leaves free.
constexpr double kMemoryHeadroom = 1e-3;
// A device's memory when hap searches as if memory were unlimited.
constexpr int64_t kNoMemoryLimit = int64_t{1} << 60;
}  // namespace

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::Hap:
      return "hap";
    case Strategy::DpEv:
      return "dp-ev";
    case Strategy::DpCp:
      return "dp-cp";
    case Strategy::Tp:
      return "tp";
    case Strategy::DpEp:
      return "dp-ep";
  }
  return "?";
}

Strategy parse_strategy(const std::string& name) {
  if (name == "hap") return Strategy::Hap;
  if (name == "dp-ev") return Strategy::DpEv;
  if (name == "dp-cp") return Strategy::DpCp;
  if (name == "tp") return Strategy::Tp;
  if (name == "dp-ep") return Strategy::DpEp;
  HAP_CHECK(false, "unknown strategy '", name, "' (expected one of hap, dp-ev, dp-cp, tp, dp-ep)");
}

bool has_expert_weights(const Graph& graph) {
  for (const GraphNode& n : graph.nodes)
    if (n.kind == ops::OpKind::MatMul && n.inputs.size() > 1 && n.inputs[1] >= 0) {
      const GraphTensor& w = graph.tensors[n.inputs[1]];
      if (w.role == TensorRole::Parameter && w.shape.size() >= 3) return true;
    }
  return false;
}

std::vector<int> assign_segments(const Graph& graph, SegmentMode mode, int* num_segments) {
  std::vector<int> seg(graph.nodes.size(), 0);
  std::map<std::string, int> ids;
  int next = 1;
  if (mode == SegmentMode::PerBlock) {
    for (const GraphNode& n : graph.nodes) {
      // The first "<name>.<number>" prefix of the module path names the block.
      size_t start = 0;
      std::string key;
      while (start < n.module.size()) {
        size_t dot = n.module.find('.', start);
        if (dot == std::string::npos) break;
        size_t end = n.module.find('.', dot + 1);
        std::string num =
            n.module.substr(dot + 1, end == std::string::npos ? std::string::npos : end - dot - 1);
        if (!num.empty() && std::all_of(num.begin(), num.end(), ::isdigit)) {
          key = n.module.substr(0, end);
          break;
        }
        start = dot + 1;
      }
      if (key.empty()) {
        // An op of no module (a custom model's own forward) belongs where its inputs come from:
        // the latest block among their producers (a residual add after block k is block k's).
        if (n.module.empty())
          for (int t : n.inputs)
            if (t >= 0 && graph.tensors[t].producer >= 0)
              seg[n.id] = std::max(seg[n.id], seg[graph.tensors[t].producer]);
        continue;
      }
      auto [it, inserted] = ids.try_emplace(key, next);
      if (inserted) ++next;
      seg[n.id] = it->second;
    }
  }
  *num_segments = next;
  return seg;
}

void record_nodes(DistributedProgram& p, const Cluster& cluster) {
  p.nodes.clear();
  for (const Instruction& in : p.instructions)
    if (in.method == CollectiveMethod::Hierarchical) {
      for (const Device& d : cluster.devices) p.nodes.push_back(d.node);
      return;
    }
}

std::vector<double> device_compute_times(const CostModel& cm,
                                         const std::vector<Instruction>& instrs,
                                         const std::vector<std::vector<double>>& ratios) {
  const int D = cm.num_devices();
  std::vector<double> total(static_cast<size_t>(D), 0.0);
  const ShardLayout layout(cm.graph(), instrs, ratios);
  for (const Instruction& in : instrs) {
    if (in.kind == InstrKind::Compute) {
      const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
      const std::vector<double> t = cm.compute_device_s(
          in.node, in.signature, ratios[in.segment], tensor < 0 ? 1 : layout.granule(tensor, dim));
      for (int d = 0; d < D; ++d) total[d] += t[d];
    } else if (in.kind == InstrKind::Update) {
      const LinearCost lc = cm.update(in.tensor, in.to);
      if (lc.coef.empty()) {
        for (int d = 0; d < D; ++d) total[d] += lc.constant_s;
        continue;
      }
      const std::vector<double> share = layout.shares(in.tensor, in.to.dim, in.segment);
      for (int d = 0; d < D; ++d) total[d] += lc.coef[d] * share[d];
    }
  }
  return total;
}

double recost(const CostModel& cm, std::vector<Instruction>& instrs,
              const std::vector<std::vector<double>>& ratios, const ShardLayout* granules) {
  // Shards as the executor cuts them: whole granules (synth/shard_layout.h), which depend on the
  // program alone (a caller pricing one program under many ratios builds them once).
  std::optional<ShardLayout> own;
  if (granules == nullptr) granules = &own.emplace(cm.graph(), instrs, ratios);
  const ShardLayout& layout = *granules;
  // What each device gets of a dimension under a segment's ratios (ShardLayout::shares), once per
  // (segment, length, granule): a program cuts the same few lengths again and again.
  std::map<std::tuple<int, int64_t, int64_t>, std::vector<double>> cut;
  auto shares = [&](int tensor, int64_t dim, int segment) -> const std::vector<double>& {
    auto [it, fresh] = cut.try_emplace(
        {segment, cm.graph().tensors[tensor].shape[dim], layout.granule(tensor, dim)});
    if (fresh) it->second = layout.shares(tensor, dim, ratios[segment]);
    return it->second;
  };
  // Compute between two synchronizing instructions is priced at that stretch's slowest device:
  // each instruction's cost_s is its time there, so that they sum to the stretch's time.
  std::vector<double> stretch(static_cast<size_t>(cm.num_devices()), 0.0);
  std::vector<std::pair<size_t, std::vector<double>>> members;
  auto close_stretch = [&]() {
    if (members.empty()) return;
    const size_t slowest =
        static_cast<size_t>(std::max_element(stretch.begin(), stretch.end()) - stretch.begin());
    for (const auto& [i, t] : members) instrs[i].cost_s = t[slowest];
    members.clear();
    std::fill(stretch.begin(), stretch.end(), 0.0);
  };
  for (size_t i = 0; i < instrs.size(); ++i) {
    Instruction& in = instrs[i];
    const std::vector<double>& r = ratios[in.segment];
    if (synchronizes(cm, in)) close_stretch();
    switch (in.kind) {
      case InstrKind::Compute: {
        const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
        std::vector<double> t =
            tensor < 0 || cm.graph().tensors[tensor].shape[dim] <= 0
                ? cm.compute_device_s(in.node, in.signature, r)
                : cm.compute_device_s_at(in.node, shares(tensor, dim, in.segment));
        const double own = cm.own_collectives_s(in.node, in.signature);
        for (size_t d = 0; d < t.size(); ++d) stretch[d] += t[d] += own;
        members.emplace_back(i, std::move(t));
        break;
      }
      case InstrKind::Reshard:
        in.cost_s = cm.reshard_s(in.tensor, in.from.dim, ratios[in.from_segment], r, &in.method,
                                 layout.granule(in.tensor, in.from.dim));
        break;
      // Costs that scale with a device's share: the share it really gets (whole granules).
      case InstrKind::Update:
        in.cost_s =
            cm.update(in.tensor, in.to)
                .eval(in.to.kind == PropKind::Sharded ? shares(in.tensor, in.to.dim, in.segment)
                                                      : r);
        break;
      case InstrKind::AllGather:
        in.cost_s = cm.communication(in.kind, in.tensor, in.method, in.regather)
                        .eval(shares(in.tensor, in.from.dim, in.from_segment));
        break;
      case InstrKind::ReduceScatter:
      case InstrKind::AllToAll:
        in.cost_s = cm.communication(in.kind, in.tensor, in.method)
                        .eval(shares(in.tensor, in.to.dim, in.segment));
        break;
      case InstrKind::FactorBroadcast: {
        const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
        in.cost_s = cm.factor_broadcast(in.node, in.signature, in.method)
                        .eval(tensor < 0 ? r : shares(tensor, dim, in.segment));
        break;
      }
      default:
        in.cost_s = cm.communication(in.kind, in.tensor, in.method).eval(r);
        break;
    }
    if (in.kind != InstrKind::Compute) in.cost_s *= cm.recompute_factor(in);  // run again?
  }
  close_stretch();
  return step_time(cm, instrs).step_s;
}

bool optimize_ratios(const CostModel& cm, const std::vector<Instruction>& instrs,
                     const std::vector<Prop>& storage, int num_segments, double min_share,
                     std::vector<std::vector<double>>* ratios) {
  const int D = cm.num_devices();
  const auto& devs = cm.cluster().devices;
  // Devices with the same FLOP/s and memory are interchangeable in the cost model: they share one
  // ratio per segment, which keeps the LP small and the solution symmetric.
  std::vector<int> cls(D);
  std::vector<int> rep, count;
  {
    // Devices alike in everything the cost model reads share one LP variable per segment.
    std::map<std::tuple<double, int64_t, double, double, double>, int> ids;
    for (int d = 0; d < D; ++d) {
      auto [it, inserted] = ids.try_emplace(
          {devs[d].flops_per_s, devs[d].memory_bytes, devs[d].memory_bandwidth_bytes_per_s,
           devs[d].update_s_per_param, devs[d].kernel_overhead_s},
          static_cast<int>(rep.size()));
      if (inserted) {
        rep.push_back(d);
        count.push_back(0);
      }
      cls[d] = it->second;
      ++count[it->second];
    }
  }
  const int C = static_cast<int>(rep.size());
  auto rvar = [C](int seg, int c) { return seg * C + c; };
  int ncols = num_segments * C;
  std::vector<double> obj(ncols, 0.0), collb(ncols, min_share), colub(ncols, 1.0);
  std::vector<int> rows_i, cols_i;
  std::vector<double> vals, rowlb, rowub;
  int nrows = 0;
  auto add_row = [&](const std::vector<std::pair<int, double>>& entries, double lb, double ub) {
    for (auto [c, v] : entries) {
      rows_i.push_back(nrows);
      cols_i.push_back(c);
      vals.push_back(v);
    }
    rowlb.push_back(lb);
    rowub.push_back(ub);
    ++nrows;
  };
  auto new_var = [&](double weight) {
    obj.push_back(weight);
    collb.push_back(0.0);
    colub.push_back(COIN_DBL_MAX);
    return ncols++;
  };
  for (int s = 0; s < num_segments; ++s) {
    std::vector<std::pair<int, double>> e;
    for (int c = 0; c < C; ++c) e.push_back({rvar(s, c), static_cast<double>(count[c])});
    add_row(e, 1.0, 1.0);
  }
  // Compute between two synchronizing instructions (a stretch, as recost prices it) takes its
  // slowest device's sum: one epigraph variable y per stretch, y >= sum_i coef_i,d r_d + F_d for
  // every device class, F_d its kernel overheads and the whole time of what it computes
  // unsplit. Rows are scaled to coefficients of at most 1.
  struct Stretch {
    std::map<int, std::vector<double>> coef;  // segment -> per class
    std::vector<double> fixed;                // per class
  };
  std::vector<Stretch> stretches(1);
  auto new_stretch = [&]() {
    if (!stretches.back().coef.empty() || !stretches.back().fixed.empty()) stretches.emplace_back();
  };
  // Other terms max_d(coef_d r_d) whose coefficient vectors are proportional (every padded
  // collective of a segment, every sharded update) share one epigraph variable
  // y >= pattern_d r_d, weighted by the sum of their scales: exact, and the LP stays small.
  std::map<std::pair<int, std::vector<double>>, int> groups;  // (segment, pattern) -> variable
  for (const Instruction& in : instrs) {
    if (synchronizes(cm, in)) new_stretch();
    if (in.kind == InstrKind::Compute) {
      Stretch& st = stretches.back();
      if (st.fixed.empty()) st.fixed.assign(C, 0.0);
      const LinearCost lc = cm.compute(in.node, in.signature);
      for (int c = 0; c < C; ++c) {
        st.fixed[c] += cm.fixed_compute_s(in.node, rep[c]);
        if (lc.coef.empty()) {
          st.fixed[c] += cm.device_compute_s(in.node, rep[c]);
          continue;
        }
        std::vector<double>& k = st.coef[in.segment];
        if (k.empty()) k.assign(C, 0.0);
        k[c] += lc.coef[rep[c]];
      }
      continue;
    }
    if (in.kind == InstrKind::Reshard) {
      double k = cm.reshard_coef(in.tensor) * cm.recompute_factor(in);
      if (k == 0) continue;
      int t = new_var(1.0);
      for (int c = 0; c < C; ++c) {
        add_row({{t, 1.0}, {rvar(in.from_segment, c), -k}, {rvar(in.segment, c), k}}, 0.0,
                COIN_DBL_MAX);
        add_row({{t, 1.0}, {rvar(in.from_segment, c), k}, {rvar(in.segment, c), -k}}, 0.0,
                COIN_DBL_MAX);
      }
      continue;
    }
    LinearCost lc = in.kind == InstrKind::Update ? cm.update(in.tensor, in.to)
                    : in.kind == InstrKind::FactorBroadcast
                        ? cm.factor_broadcast(in.node, in.signature, in.method)
                        : cm.communication(in.kind, in.tensor, in.method, in.regather);
    if (lc.coef.empty()) continue;
    double scale = *std::max_element(lc.coef.begin(), lc.coef.end());
    if (scale <= 0) continue;
    std::vector<double> pattern(C);
    for (int c = 0; c < C; ++c) pattern[c] = std::round(lc.coef[rep[c]] / scale * 1e12) / 1e12;
    auto [it, inserted] = groups.try_emplace({in.segment, pattern}, -1);
    if (inserted) {
      it->second = new_var(0.0);
      for (int c = 0; c < C; ++c)
        add_row({{it->second, 1.0}, {rvar(in.segment, c), -pattern[c]}}, 0.0, COIN_DBL_MAX);
    }
    obj[it->second] += scale * cm.recompute_factor(in);
  }
  for (const Stretch& st : stretches) {
    double scale = 0;
    for (int c = 0; c < C; ++c) {
      double sum = st.fixed.empty() ? 0.0 : st.fixed[c];
      for (const auto& [segment, k] : st.coef) sum = std::max(sum, k[c]);
      scale = std::max(scale, sum);
    }
    if (!(scale > 0)) continue;
    const int y = new_var(scale);
    for (int c = 0; c < C; ++c) {
      std::vector<std::pair<int, double>> e = {{y, 1.0}};
      for (const auto& [segment, k] : st.coef)
        if (k[c] > 0) e.push_back({rvar(segment, c), -k[c] / scale});
      add_row(e, st.fixed.empty() ? 0.0 : st.fixed[c] / scale, COIN_DBL_MAX);
    }
  }
  // Memory: bytes that scale with a segment's ratio, plus bytes every device holds.
  std::vector<std::vector<double>> unit(num_segments, std::vector<double>(D, 1.0));
  std::vector<std::vector<double>> zero(num_segments, std::vector<double>(D, 0.0));
  // Reshards count as moving (holding a new shard): under the LP's ratios they may.
  std::vector<double> fixed = program_memory(cm, instrs, storage, zero, true);
  std::vector<double> ones = program_memory(cm, instrs, storage, unit, true);
  std::vector<std::vector<double>> coef(D, std::vector<double>(num_segments, 0.0));
  for (int s = 0; s < num_segments; ++s) {
    std::vector<std::vector<double>> probe = unit;
    for (int d = 0; d < D; ++d) probe[s][d] = 0.0;
    std::vector<double> without = program_memory(cm, instrs, storage, probe, true);
    for (int d = 0; d < D; ++d) coef[d][s] = ones[d] - without[d];
  }
  for (int c = 0; c < C; ++c) {
    int d = rep[c];
    std::vector<std::pair<int, double>> e;
    for (int s = 0; s < num_segments; ++s)
      if (coef[d][s] > 0) e.push_back({rvar(s, c), coef[d][s]});
    // A little headroom (0.1%): the LP would fill a device to the byte, and the estimate of the
    // rounded program (whole rows, sums in another order) could then land just past the limit.
    double limit = static_cast<double>(devs[d].memory_bytes) * (1.0 - kMemoryHeadroom) - fixed[d];
    if (!e.empty())
      add_row(e, -COIN_DBL_MAX, limit);
    else if (limit < 0)
      return false;
  }

  CoinPackedMatrix m(false, rows_i.data(), cols_i.data(), vals.data(),
                     static_cast<int>(vals.size()));
  m.setDimensions(nrows, ncols);
  ClpSimplex lp;
  lp.setLogLevel(0);
  lp.loadProblem(m, collb.data(), colub.data(), obj.data(), rowlb.data(), rowub.data());
  lp.primal();
  if (lp.status() != 0) return false;
  const double* x = lp.primalColumnSolution();
  ratios->assign(num_segments, std::vector<double>(D));
  for (int s = 0; s < num_segments; ++s) {
    double sum = 0;
    for (int d = 0; d < D; ++d) sum += std::max(x[rvar(s, cls[d])], min_share);
    for (int d = 0; d < D; ++d) (*ratios)[s][d] = std::max(x[rvar(s, cls[d])], min_share) / sum;
  }
  return true;
}

namespace {

// Why a search found no program, in a few words for the plan report.
std::string no_program_reason(const Error& e) {
  if (dynamic_cast<const SearchBudgetError*>(&e)) return "over budget";
  if (std::string(e.what()).find("fits in memory") != std::string::npos) return "out of memory";
  return "no program";
}

// The granules of each segment's coarsest split (0 where a segment splits nothing): where they
// are few, whole-granule rounding decides a device's share more than its ratio does.
std::vector<int64_t> coarsest_splits(const CostModel& cm, const std::vector<Instruction>& instrs,
                                     const std::vector<std::vector<double>>& ratios) {
  const ShardLayout layout(cm.graph(), instrs, ratios);
  std::vector<int64_t> coarsest(ratios.size(), 0);
  for (const Instruction& in : instrs) {
    if (in.kind != InstrKind::Compute) continue;
    const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
    if (tensor < 0) continue;
    const int64_t extent = cm.graph().tensors[static_cast<size_t>(tensor)].shape[dim];
    int64_t g = layout.granule(tensor, dim);
    if (g <= 0 || extent % g != 0) g = 1;
    int64_t& n = coarsest[static_cast<size_t>(in.segment)];
    if (extent > 0 && (n == 0 || extent / g < n)) n = extent / g;
  }
  return coarsest;
}

// Ratios under which largest-remainder rounding of a split of sum(count) granules gives each
// device count[d]. A device with none keeps a sliver of its ratio (min(was, 1e-3) granules'
// worth) for finer splits, too little to earn a granule of this one.
std::vector<double> ratios_for_counts(const std::vector<int64_t>& count,
                                      const std::vector<double>& was) {
  std::vector<double> r(count.size());
  double total = 0;
  for (size_t d = 0; d < count.size(); ++d) {
    r[d] = count[d] > 0 ? static_cast<double>(count[d]) : std::min(was[d], 1e-3);
    total += r[d];
  }
  for (double& x : r) x /= total;
  return r;
}

// Ratios whose shards on each segment's coarsest split are the min-max apportionment of
// `ratios`: granules go one at a time to the device whose count over its ratio stays the
// smallest (D'Hondt), which makes the largest n_d / r_d as small as whole granules allow, where
// largest-remainder rounding can leave the slowest device a granule over its due (with 8 rows on
// 4 devices, a step up to a third slower).
std::vector<std::vector<double>> apportioned(const CostModel& cm,
                                             const std::vector<Instruction>& instrs,
                                             std::vector<std::vector<double>> ratios) {
  const std::vector<int64_t> coarsest = coarsest_splits(cm, instrs, ratios);
  for (size_t s = 0; s < ratios.size(); ++s) {
    std::vector<double>& r = ratios[s];
    const int64_t n = coarsest[s];
    if (n <= 0 || n > (int64_t{1} << 20)) continue;
    using Next = std::pair<double, size_t>;  // (n_d + 1) / r_d, device
    std::priority_queue<Next, std::vector<Next>, std::greater<Next>> queue;
    std::vector<int64_t> count(r.size(), 0);
    for (size_t d = 0; d < r.size(); ++d)
      if (r[d] > 0) queue.push({1.0 / r[d], d});
    for (int64_t k = 0; k < n && !queue.empty(); ++k) {
      const size_t d = queue.top().second;
      queue.pop();
      ++count[d];
      queue.push({static_cast<double>(count[d] + 1) / r[d], d});
    }
    r = ratios_for_counts(count, r);
  }
  return ratios;
}

// Granule descent: moves one granule of a segment's coarsest split from one device to another
// (a ratio of 1 / granules from one to the other, which moves exactly one granule under
// largest-remainder rounding and leaves the other devices' shards as they were) while that
// lowers `cost_of` (the predicted step time, infinite where a device runs out of memory), best
// move first, at most `max_evals` evaluations. Whole-granule rounding makes the step time a
// staircase of the ratios that the ratio LP, linear in them, cannot see: on few granules its
// optimum can round to a point a few moves from a far better one. Segments with many granules
// per device (rounding costs little there) and clusters of more than 16 devices (too many pairs)
// are left as they are.
template <class CostOf>
double descend_granules(const CostModel& cm, const std::vector<Instruction>& instrs,
                        std::vector<std::vector<double>>* ratios, double cost,
                        const CostOf& cost_of, int max_evals) {
  const int D = cm.num_devices();
  if (D < 2 || D > 16 || !std::isfinite(cost)) return cost;
  const std::vector<int64_t> coarsest = coarsest_splits(cm, instrs, *ratios);
  int evals = 0;
  for (size_t s = 0; s < ratios->size(); ++s) {
    const int64_t n = coarsest[s];
    if (n <= 0 || n > 64 * static_cast<int64_t>(D)) continue;
    for (const double step : {1.0 / static_cast<double>(n), 0.25 / static_cast<double>(n),
                              0.0625 / static_cast<double>(n)})
      for (bool moved = true; moved && evals < max_evals;) {
        moved = false;
        const std::vector<int64_t> count = shard_lengths(n, (*ratios)[s]);
        std::vector<std::vector<double>> best_trial;
        double best_cost = cost * (1 - 1e-9);
        for (int a = 0; a < D && evals < max_evals; ++a) {
          if (count[a] == 0 && (*ratios)[s][a] <= 0) continue;
          for (int b = 0; b < D && evals < max_evals; ++b) {
            if (b == a) continue;
            std::vector<std::vector<double>> trial = *ratios;
            const double moving = std::min(step, trial[s][a]);
            trial[s][a] -= moving;
            trial[s][b] += moving;
            ++evals;
            const double t = cost_of(trial);
            if (t < best_cost) {
              best_cost = t;
              best_trial = std::move(trial);
            }
          }
        }
        if (!best_trial.empty()) {
          cost = best_cost;
          *ratios = std::move(best_trial);
          moved = true;
        }
      }
  }
  return cost;
}

SearchSpace space_for(Strategy s, int64_t max_states, bool dominance_pruning) {
  SearchSpace sp;
  sp.max_states = max_states;
  sp.dominance_pruning = dominance_pruning;
  switch (s) {
    case Strategy::Hap:
      break;
    case Strategy::DpEv:
    case Strategy::DpCp:
      sp.inputs_must_shard_dim0 = true;
      sp.shard_parameters = false;
      break;
    case Strategy::DpEp:
      sp.inputs_must_shard_dim0 = true;
      sp.shard_parameters = false;
      sp.expert_weights_must_shard = true;
      break;
    case Strategy::Tp:
      sp.shard_inputs = false;
      sp.allow_slice = false;
      sp.allow_reduce_scatter = false;
      sp.allow_all_to_all = false;
      sp.linear_weights_must_shard = true;
      sp.allow_activation_all_gather = false;  // Megatron's; relaxed where nothing else exists
      break;
  }
  return sp;
}

}  // namespace

namespace {

// synthesize() on every device of `cluster`, recomputing none of the segments (options.recompute
// Off) or those options.recompute_segments marks (All; empty: every one).
DistributedProgram plan_on(const Graph& graph, const Cluster& cluster,
                           const SynthesisOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  cluster.validate();
  int nseg = 1;
  std::vector<int> seg = assign_segments(graph, options.segments, &nseg);
  std::vector<bool> recompute;
  if (options.recompute == Recompute::All) {
    recompute = options.recompute_segments;
    if (recompute.empty()) recompute.assign(static_cast<size_t>(nseg), true);
    HAP_CHECK(static_cast<int>(recompute.size()) == nseg, "recompute_segments: ", recompute.size(),
              " flags for ", nseg, " segments");
  }
  // The cost model of the program on a cluster (this one, or this one with other memory limits).
  auto cost_model_on = [&](const Cluster& c) {
    CostModel m(graph, c, options.optimizer_state_slots, options.overlap_grad_comm);
    m.set_hierarchical(options.hierarchical_collectives);
    m.set_recompute(seg, recompute);
    return m;
  };
  const CostModel cm = cost_model_on(cluster);
  int D = cm.num_devices();
  SearchSpace space = space_for(options.strategy, options.max_states, options.dominance_pruning);
  space.explain_out_of_memory = options.explain_out_of_memory;
  space.zero_storage = options.strategy == Strategy::Hap &&
                       options.zero_storage != ZeroStorage::Off && space.shard_parameters;
  space.zero_storage_everywhere = space.zero_storage && options.zero_storage == ZeroStorage::All;
  space.factor_broadcast =
      options.strategy == Strategy::Hap && options.factor_broadcast != FactorBroadcast::Off;
  // The rounds that steer the ratios skip the memory-aware pass (unless nothing is found
  // without it); the final program gets it once, below.
  space.memory_exact = false;
  if (space.inputs_must_shard_dim0 && D > 1)
    for (const GraphTensor& t : graph.tensors)
      HAP_CHECK(t.role != TensorRole::Input || (!t.shape.empty() && t.shape[0] >= 2), "strategy ",
                strategy_name(options.strategy),
                " splits every input along its first dimension (the batch), ", "but input '",
                t.name, "' has shape ", shape_str(t.shape),
                ": use a batch of at least 2, or the hap or tp strategy");

  std::vector<double> even(D, 1.0 / D);
  std::vector<double> by_flops = cluster.flops_ratios();
  std::vector<std::vector<std::vector<double>>> first_starts;
  std::vector<std::string> first_start_names;
  if (options.strategy == Strategy::Hap || options.strategy == Strategy::DpCp) {
    first_starts.push_back(std::vector<std::vector<double>>(nseg, by_flops));
    first_start_names.push_back("by FLOP/s");
  }
  if (options.strategy != Strategy::DpCp && (first_starts.empty() || by_flops != even)) {
    first_starts.push_back(std::vector<std::vector<double>>(nseg, even));
    first_start_names.push_back("even");
  }
  double min_share = 0.01 / D;

  int64_t states = 0;
  int rounds = 0;
  std::string last_error;
  bool over_budget = false;
  std::string budget_error;
  std::vector<SynthesisStep> steps;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // Whether a program fits every device's memory under the cluster's real limits.
  auto fits = [&](const std::vector<Instruction>& instrs, const std::vector<Prop>& storage,
                  const std::vector<std::vector<double>>& ratios) {
    const std::vector<double> mem = program_memory(cm, instrs, storage, ratios);
    for (int d = 0; d < D; ++d)
      if (mem[d] > static_cast<double>(cluster.devices[d].memory_bytes)) return false;
    return true;
  };
  // The predicted step time of a program, infinite where it does not fit `limits`' memory.
  auto priced = [&](const Cluster& limits, const std::vector<Instruction>& instrs,
                    const std::vector<Prop>& storage,
                    const std::vector<std::vector<double>>& ratios,
                    const ShardLayout* granules = nullptr) {
    std::vector<Instruction> costed = instrs;
    const double cost = recost(cm, costed, ratios, granules);
    const std::vector<double> mem = program_memory(cm, costed, storage, ratios);
    for (int d = 0; d < D; ++d)
      if (mem[d] > static_cast<double>(limits.devices[d].memory_bytes))
        return std::numeric_limits<double>::infinity();
    return cost;
  };
  // Granule descent of a program's ratios under `limits` (a step in the report when it gains).
  auto descend = [&](const Cluster& limits, DistributedProgram& p, const std::string& tag) {
    if (!std::isfinite(p.predicted_step_s)) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<double>> r = p.ratios;
    const ShardLayout granules(cm.graph(), p.instructions, p.ratios);
    const double cost = descend_granules(
        cm, p.instructions, &r, p.predicted_step_s,
        [&](const std::vector<std::vector<double>>& x) {
          return priced(limits, p.instructions, p.storage, x, &granules);
        },
        256);
    if (!(cost < p.predicted_step_s)) return;
    steps.push_back({tag + "granule descent", 0, cost, since(t0), ""});
    recost(cm, p.instructions, r);
    p.ratios = std::move(r);
    p.predicted_step_s = cost;
  };
  // The alternation of program search and ratio LP from every start, under the memory limits of
  // `cmx`'s cluster (cm's, or none), then the memory-aware pass and the granule descent. Steps
  // are named with `tag` in front.
  // With `only_from`, the one start is `from` (named `from_name`).
  auto search_rounds = [&](const CostModel& cmx, const std::string& tag,
                           const std::vector<std::vector<double>>* from,
                           const std::string& from_name, bool only_from) {
    const Cluster& limits = cmx.cluster();
    std::vector<std::vector<std::vector<double>>> starts = first_starts;
    std::vector<std::string> start_name = first_start_names;
    if (only_from) {
      starts.clear();
      start_name.clear();
    }
    if (from != nullptr) {
      starts.insert(starts.begin(), *from);
      start_name.insert(start_name.begin(), from_name);
    }
    DistributedProgram best;
    best.predicted_step_s = std::numeric_limits<double>::infinity();
    bool memory_may_matter =
        &cmx == &cm && options.strategy == Strategy::Hap;  // in some round's search
    bool tried_by_memory = false;
    std::vector<std::vector<std::vector<double>>> searched;  // each start's last ratios
    int64_t largest_round = 0;
    for (size_t start_index = 0;; ++start_index) {
      if (start_index == starts.size()) {
        // Where memory binds (or no start fits), memory rather than speed may decide the split:
        // start hap from shares proportional to each device's memory too (the LP then trades
        // towards speed). Tried only when nothing fitted, a little more memory on one device
        // could make the plan 300x slower
        // (Synthesizer.ALittleMoreMemoryOnOneDeviceDoesNotFallOffACliff).
        if (options.strategy != Strategy::Hap || tried_by_memory || only_from ||
            (std::isfinite(best.predicted_step_s) && !memory_may_matter))
          break;
        tried_by_memory = true;
        std::vector<double> by_memory(D);
        double total = 0;
        for (const Device& d : limits.devices) total += static_cast<double>(d.memory_bytes);
        for (int d = 0; d < D; ++d)
          by_memory[d] = static_cast<double>(limits.devices[d].memory_bytes) / total;
        if (std::find(starts.begin(), starts.end(),
                      std::vector<std::vector<double>>(nseg, by_memory)) != starts.end())
          break;
        starts.push_back(std::vector<std::vector<double>>(nseg, by_memory));
        start_name.push_back("by memory");
      }
      std::vector<std::vector<double>> r = starts[start_index];
      double prev = std::numeric_limits<double>::infinity();
      for (int it = 0; it < options.max_iterations; ++it) {
        SearchResult res;
        const auto round_t0 = std::chrono::steady_clock::now();
        SynthesisStep step;
        step.what = tag + "ratios " + start_name[start_index] + ", round " + std::to_string(it + 1);
        try {
          try {
            res = search_program(cmx, r, seg, space);
          } catch (const SearchBudgetError&) {
            throw;
          } catch (const Error&) {
            // tp: no program gathers no activation (or none fits): one that does.
            if (space.allow_activation_all_gather) throw;
            space.allow_activation_all_gather = true;
            step.what += " (with activation all-gathers: no Megatron program)";
            res = search_program(cmx, r, seg, space);
          }
        } catch (const SearchBudgetError& e) {
          last_error = budget_error = e.what();
          over_budget = true;
          step.seconds = since(round_t0);
          step.outcome = "over budget";
          steps.push_back(step);
          break;
        } catch (const Error& e) {
          last_error = e.what();
          step.seconds = since(round_t0);
          step.outcome = no_program_reason(e);
          steps.push_back(step);
          break;
        }
        step.seconds = since(round_t0);
        step.states = res.states_expanded;
        ++rounds;
        states += res.states_expanded;
        largest_round = std::max(largest_round, res.states_expanded);
        memory_may_matter = memory_may_matter || res.memory_may_matter;
        auto consider = [&](std::vector<Instruction> instrs,
                            const std::vector<std::vector<double>>& ratios) {
          double cost = recost(cm, instrs, ratios);
          // (The LP keeps memory within the limits by its linear model; checked here on the
          // program as it will be estimated.)
          const std::vector<double> mem = program_memory(cm, instrs, res.storage, ratios);
          for (int d = 0; d < D; ++d)
            if (mem[d] > static_cast<double>(limits.devices[d].memory_bytes))
              return std::numeric_limits<double>::infinity();
          if (cost < best.predicted_step_s) {
            best.instructions = std::move(instrs);
            best.ratios = ratios;
            best.storage = res.storage;
            best.predicted_step_s = cost;
          }
          return cost;
        };
        // Ratios as given and (hap) apportioned to whole granules: the better one is kept.
        auto consider_both = [&](std::vector<std::vector<double>>& ratios) {
          double c = consider(res.instructions, ratios);
          if (options.strategy != Strategy::Hap) return c;
          std::vector<std::vector<double>> a = apportioned(cm, res.instructions, ratios);
          if (a != ratios) {
            const double ca = consider(res.instructions, a);
            if (ca < c) {
              c = ca;
              ratios = std::move(a);
            }
          }
          return c;
        };
        double cost = consider_both(r);
        step.cost_s = std::isfinite(cost) ? cost : -1;
        if (!std::isfinite(cost)) step.outcome = "out of memory once rounded";
        steps.push_back(step);
        if (options.strategy != Strategy::Hap || !(cost < prev * (1 - 1e-9))) break;
        // A later start only refines its program if it beat the earlier starts' best.
        if (start_index > 0 && cost > best.predicted_step_s) break;
        prev = cost;
        std::vector<std::vector<double>> next;
        if (D == 1 || !optimize_ratios(cmx, res.instructions, res.storage, nseg, min_share, &next))
          break;
        double lp_cost = consider_both(next);
        // The LP's model is linear in the ratios; the step time rounds shards to whole granules,
        // hides gradient all-reduces behind the backward pass and may not fit once rounded.
        // Where the LP's point prices no better, back off halfway towards the ratios searched,
        // up to 6 times: a point between may still gain, and near them it fits.
        for (int k = 0; k < 6 && !(lp_cost < cost * (1 - 1e-4)); ++k) {
          for (int s = 0; s < nseg; ++s)
            for (int d = 0; d < D; ++d) next[s][d] = 0.5 * (next[s][d] + r[s][d]);
          lp_cost = consider_both(next);
        }
        // New ratios that barely change the cost would lead the search to the same program.
        if (!(lp_cost < cost * (1 - 1e-4))) break;
        r = next;
      }
      if (std::find(searched.begin(), searched.end(), r) == searched.end()) searched.push_back(r);
    }
    // Memory bound a round's search: the memory-aware pass looks for a cheaper program that a memo
    // lost to a cheaper path that later ran out of memory, at the final ratios of every start
    // (under real limits; the final program's only where the search ran without them). Bounded
    // by half the largest round's states (and the budget): best effort where it cannot finish.
    if (!(&cmx == &cm && options.strategy == Strategy::Hap)) searched.clear();
    if (std::isfinite(best.predicted_step_s) &&
        std::find(searched.begin(), searched.end(), best.ratios) == searched.end())
      searched.push_back(best.ratios);
    for (const std::vector<std::vector<double>>& ratios : searched) {
      if (!std::isfinite(best.predicted_step_s) || !memory_may_matter) break;
      SearchSpace lean = space;
      lean.max_states = std::min(space.max_states, std::max<int64_t>(largest_round / 2, 20'000));
      SearchResult res;
      const auto pass_t0 = std::chrono::steady_clock::now();
      SynthesisStep step;
      step.what = tag + "memory-aware pass";
      const bool leaner =
          search_leaner_program(cmx, ratios, seg, lean, best.predicted_step_s, &res);
      step.seconds = since(pass_t0);
      step.states = res.states_expanded;
      step.outcome = leaner ? "" : "none cheaper";
      states += res.states_expanded;
      if (leaner) {
        std::vector<Instruction> instrs = res.instructions;
        const double cost = priced(limits, instrs, res.storage, ratios);
        step.cost_s = std::isfinite(cost) ? cost : -1;
        if (!std::isfinite(cost)) step.outcome = "out of memory once rounded";
        recost(cm, instrs, ratios);
        if (cost < best.predicted_step_s * (1 - 1e-12)) {
          best.instructions = std::move(instrs);
          best.ratios = ratios;
          best.storage = res.storage;
          best.predicted_step_s = cost;
        }
      }
      steps.push_back(step);
    }
    if (options.strategy == Strategy::Hap) descend(limits, best, tag);
    return best;
  };
  DistributedProgram best;
  best.predicted_step_s = std::numeric_limits<double>::infinity();
  bool memory_bound = false;
  double unlimited_step_s = std::numeric_limits<double>::infinity();
  if (options.strategy == Strategy::Hap) {
    // hap searches without memory limits first and keeps what it finds where that fits: where
    // memory does not bind, the search then takes one path whatever the limits are, so more
    // memory never makes the plan slower (Synthesizer.MoreMemoryNeverYieldsASlowerPlan). Only
    // where that program does not fit does it search under the limits.
    Cluster roomy = cluster;
    for (Device& d : roomy.devices) d.memory_bytes = kNoMemoryLimit;
    const CostModel free_cm = cost_model_on(roomy);
    DistributedProgram free = search_rounds(free_cm, "", nullptr, "", false);
    if (std::isfinite(free.predicted_step_s) &&
        fits(free.instructions, free.storage, free.ratios)) {
      best = std::move(free);
    } else {
      memory_bound = true;
      unlimited_step_s = free.predicted_step_s;
      if (std::isfinite(free.predicted_step_s))
        steps.push_back({"the program found without memory limits does not fit: search under them",
                         0, -1, 0, "out of memory"});
      best = search_rounds(cm, "under memory limits: ",
                           std::isfinite(free.predicted_step_s) ? &free.ratios : nullptr,
                           "of the program found without memory limits", false);
      // A program found elsewhere, with ratios from the LP under the real limits (where it has
      // any that fit): more memory only widens what that LP may choose.
      auto refit = [&](const DistributedProgram& found, const std::string& what) {
        std::vector<std::vector<double>> r;
        if (!std::isfinite(found.predicted_step_s) || D == 1 ||
            !optimize_ratios(cm, found.instructions, found.storage, nseg, min_share, &r))
          return;
        DistributedProgram fitted = found;
        fitted.predicted_step_s = priced(cluster, fitted.instructions, fitted.storage, r);
        std::vector<std::vector<double>> a = apportioned(cm, fitted.instructions, r);
        const double apportioned_cost = priced(cluster, fitted.instructions, fitted.storage, a);
        if (apportioned_cost < fitted.predicted_step_s) {
          fitted.predicted_step_s = apportioned_cost;
          r = std::move(a);
        }
        fitted.ratios = std::move(r);
        recost(cm, fitted.instructions, fitted.ratios);
        steps.push_back({what + ", ratios under the limits", 0,
                         std::isfinite(fitted.predicted_step_s) ? fitted.predicted_step_s : -1, 0,
                         std::isfinite(fitted.predicted_step_s) ? "" : "out of memory"});
        descend(cluster, fitted, what + ": ");
        if (fitted.predicted_step_s < best.predicted_step_s) best = std::move(fitted);
      };
      refit(free, "the program found without memory limits");
      // The search under the limits is a local search, steered by what fits: with a little
      // less memory it may find a faster program, which fits here too. So hap also searches under
      // a ladder of tighter limits (each device's memory x 0.9 down to x 0.6, until nothing fits)
      // and refits what each finds under the real limits: more memory then keeps what it found
      // with less wherever that was within the ladder
      // (Synthesizer.MoreMemoryNeverYieldsASlowerPlan). What fails there is no error of this plan.
      if (std::isfinite(best.predicted_step_s)) {
        const std::string error_before = last_error, budget_before = budget_error;
        const bool over_before = over_budget;
        const std::vector<std::vector<double>> start = best.ratios;
        space.quick_out_of_memory = true;  // a rung gives up where the fast pass finds nothing
        for (const double f : {0.9, 0.8, 0.7, 0.6}) {
          Cluster tight = cluster;
          for (Device& d : tight.devices)
            d.memory_bytes = static_cast<int64_t>(f * static_cast<double>(d.memory_bytes));
          const CostModel tight_cm = cost_model_on(tight);
          char tag[64];
          std::snprintf(tag, sizeof(tag), "under the limits x %.1f", f);
          const DistributedProgram found = search_rounds(tight_cm, std::string(tag) + ": ", &start,
                                                         "of the plan under the limits", true);
          if (!std::isfinite(found.predicted_step_s)) break;
          refit(found, std::string("the program found ") + tag);
        }
        space.quick_out_of_memory = false;
        last_error = error_before;
        budget_error = budget_before;
        over_budget = over_before;
      }
    }
  } else {
    best = search_rounds(cm, "", nullptr, "", false);
  }
  const bool fallback = !std::isfinite(best.predicted_step_s) && over_budget;
  // (With every parameter stored sharded asked for, the baselines, which store them whole, are
  // only the fallback.)
  if (options.strategy == Strategy::Hap && (options.zero_storage != ZeroStorage::All || fallback)) {
    // The baselines' programs (each a program of hap's space, found in a far smaller one) are
    // candidates too: hap's alternation of search and ratio LP is a local search, and where
    // memory binds its search is exact only within the bounded pass above; and they are the
    // fallback where it went over its budget.
    std::string why = budget_error;
    DistributedProgram base;
    base.predicted_step_s = std::numeric_limits<double>::infinity();
    for (Strategy s : {Strategy::DpCp, Strategy::DpEv, Strategy::Tp, Strategy::DpEp}) {
      // dp-ep differs from dp-ev only where there are expert weights to split.
      if (s == Strategy::DpEp && !has_expert_weights(graph)) continue;
      SynthesisOptions o = options;
      o.strategy = s;
      o.max_states = std::max(options.max_states, SynthesisOptions{}.max_states);
      const auto cand_t0 = std::chrono::steady_clock::now();
      SynthesisStep step;
      step.what = std::string("candidate ") + strategy_name(s);
      try {
        DistributedProgram p = synthesize(graph, cluster, o);
        states += p.states_expanded;
        step.states = p.states_expanded;
        step.cost_s = p.predicted_step_s;
        if (p.predicted_step_s < base.predicted_step_s) base = std::move(p);
      } catch (const Error& e) {
        why += std::string("; ") + strategy_name(s) + ": " + e.what();
        step.outcome = no_program_reason(e);
      }
      step.seconds = since(cand_t0);
      steps.push_back(step);
    }
    if (fallback) {
      HAP_CHECK(std::isfinite(base.predicted_step_s), why);
      base.note = "hap's search went over its budget of " + std::to_string(options.max_states) +
                  " states; this is the best baseline program (" + base.strategy +
                  "). Raise parallel.search_budget to search further.";
      base.strategy = strategy_name(Strategy::Hap);
      base.steps = std::move(steps);
      base.synthesis_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return base;
    }
    if (base.predicted_step_s < best.predicted_step_s * (1 - 1e-12)) {
      best.instructions = std::move(base.instructions);
      best.ratios = std::move(base.ratios);
      best.storage = std::move(base.storage);
      best.predicted_step_s = base.predicted_step_s;
    }
  }
  if (!std::isfinite(best.predicted_step_s) && over_budget) throw SearchBudgetError(budget_error);
  HAP_CHECK(std::isfinite(best.predicted_step_s),
            last_error.empty() ? "no program fits in memory: every program found runs out once its "
                                 "shards are whole rows"
                               : last_error);

  best.strategy = strategy_name(options.strategy);
  best.memory_bound = memory_bound;
  best.unlimited_step_s = memory_bound ? unlimited_step_s : best.predicted_step_s;
  best.recompute = recompute;
  best.node_segment = seg;
  best.search_iterations = rounds;
  best.states_expanded = states;
  best.device_compute_s = device_compute_times(cm, best.instructions, best.ratios);
  for (const Instruction& in : best.instructions)
    (in.kind == InstrKind::Compute || in.kind == InstrKind::Update ? best.compute_s
                                                                   : best.communication_s) +=
        in.cost_s;
  const StepTime st = step_time(cm, best.instructions);
  best.hidden_communication_s = st.hidden_s;
  best.shared_latency_s = st.shared_latency_s;
  best.device_memory_bytes = program_memory(cm, best.instructions, best.storage, best.ratios);
  record_nodes(best, cluster);
  best.steps = std::move(steps);
  best.synthesis_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return best;
}

// Subsets of the fastest devices worth planning on: the k fastest (by FLOP/s, then memory, then
// rank) for k a power of two and for k ending a class of alike devices, fewer than all.
std::vector<std::vector<int>> fastest_subsets(const Cluster& cluster) {
  const int D = cluster.size();
  std::vector<int> order(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) order[static_cast<size_t>(d)] = d;
  const auto& dev = cluster.devices;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (dev[a].flops_per_s != dev[b].flops_per_s) return dev[a].flops_per_s > dev[b].flops_per_s;
    return dev[a].memory_bytes > dev[b].memory_bytes;
  });
  std::set<int> sizes;
  for (int k = 1; k < D; k *= 2) sizes.insert(k);
  for (int k = 1; k < D; ++k) {
    const Device& a = dev[order[static_cast<size_t>(k - 1)]];
    const Device& b = dev[order[static_cast<size_t>(k)]];
    if (a.flops_per_s != b.flops_per_s || a.memory_bytes != b.memory_bytes) sizes.insert(k);
  }
  std::vector<std::vector<int>> out;
  for (int k : sizes) {
    std::vector<int> s(order.begin(), order.begin() + k);
    std::sort(s.begin(), s.end());
    out.push_back(std::move(s));
  }
  return out;
}

// The names of the devices not in `kept` (ascending ranks), the first 8 of them.
std::string left_out_list(const Cluster& cluster, const std::vector<int>& kept) {
  std::vector<int> ranks;
  for (int d = 0; d < cluster.size(); ++d)
    if (!std::binary_search(kept.begin(), kept.end(), d)) ranks.push_back(d);
  std::string out;
  const size_t shown = std::min<size_t>(ranks.size(), 8);
  for (size_t i = 0; i < shown; ++i)
    out += (i ? ", " : "") + cluster.devices[static_cast<size_t>(ranks[i])].name;
  if (ranks.size() > shown) out += " and " + std::to_string(ranks.size() - shown) + " more";
  return out;
}

}  // namespace

namespace {

// The segments in the order recomputing them pays most: the activation bytes they stop keeping
// (whole tensors) per FLOP their forward runs again.
std::vector<int> recompute_order(const Graph& graph, const Cluster& cluster,
                                 const SynthesisOptions& options) {
  int nseg = 1;
  const std::vector<int> seg = assign_segments(graph, options.segments, &nseg);
  CostModel cm(graph, cluster, options.optimizer_state_slots, options.overlap_grad_comm);
  cm.set_hierarchical(options.hierarchical_collectives);
  cm.set_recompute(seg, std::vector<bool>(static_cast<size_t>(nseg), true));
  std::vector<double> bytes(static_cast<size_t>(nseg), 0.0), flops(static_cast<size_t>(nseg), 0.0);
  for (const GraphTensor& t : graph.tensors)
    if (const int s = cm.recomputed_segment(t.id); s >= 0 && cm.requires_grad(t.id))
      bytes[static_cast<size_t>(s)] += static_cast<double>(t.bytes());
  for (const GraphNode& n : graph.nodes) flops[static_cast<size_t>(seg[n.id])] += n.flops;
  std::vector<int> order(static_cast<size_t>(nseg));
  for (int s = 0; s < nseg; ++s) order[static_cast<size_t>(s)] = s;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return bytes[a] / std::max(flops[a], 1.0) > bytes[b] / std::max(flops[b], 1.0);
  });
  return order;
}

// plan_on, deciding recomputation (Recompute): Auto recomputes the first k segments (in
// recompute_order) where no program fits in memory without it, or where that is faster than a
// program that memory made slow (synthesize_on), the fastest plan of the k tried (the report's
// first step says how many); Off where a program would fit only with it is an OptionsError.
// The number of parameters a program stores sharded and gathers for use (ZeRO storage), and how
// many of those it gathers again in backward.
std::pair<int, int> zero_parameters(const DistributedProgram& p, const Graph& graph) {
  int stored = 0, again = 0;
  for (const Instruction& in : p.instructions)
    if (in.kind == InstrKind::AllGather &&
        graph.tensors[static_cast<size_t>(in.tensor)].role == TensorRole::Parameter) {
      ++stored;
      again += in.regather ? 1 : 0;
    }
  return {stored, again};
}

// Whether a program uses at least `fraction` of some device's memory.
bool memory_tight(const DistributedProgram& p, const Cluster& cluster, double fraction) {
  for (size_t d = 0; d < p.device_memory_bytes.size(); ++d)
    if (p.device_memory_bytes[d] >= fraction * static_cast<double>(cluster.devices[d].memory_bytes))
      return true;
  return false;
}

// Puts first in p's report why it stores what it stores sharded (ZeRO storage).
void note_storage(DistributedProgram& p, const Graph& graph, const std::string& why,
                  std::chrono::steady_clock::time_point t0) {
  const auto [stored, again] = zero_parameters(p, graph);
  SynthesisStep step;
  step.what = why + ": " + std::to_string(stored) +
              " parameters stored sharded and gathered for use, " + std::to_string(again) +
              " of them gathered again in backward";
  step.cost_s = p.predicted_step_s;
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.steps.insert(p.steps.begin(), step);
}

// synthesize_on, deciding ZeRO storage: plans without it first, and with it too (a search that
// may use it wherever it prices it cheaper) where nothing fits without, or with On always, or
// with Auto where what fits fills some device's memory to 90% or more (memory may be what keeps
// it from a faster program) or where memory shaped the program (DistributedProgram::
// memory_bound: the one found without limits did not fit), keeping the faster by predicted step
// time (which the search's own pricing does not see whole: the overlap of gradient
// all-reduces); Off where only it would fit is an OptionsError (unless recomputation is tried
// next: recompute_next).
DistributedProgram plan_storage_choice(
    const Graph& graph, const Cluster& cluster, const SynthesisOptions& options,
    const std::function<DistributedProgram(const SynthesisOptions&)>& plan, bool recompute_next) {
  if (options.strategy != Strategy::Hap) return plan(options);
  SynthesisOptions without = options;
  without.zero_storage = ZeroStorage::Off;
  SynthesisOptions with = options;
  with.zero_storage = ZeroStorage::On;
  auto note = [&](DistributedProgram& p, const std::string& why,
                  std::chrono::steady_clock::time_point t0) { note_storage(p, graph, why, t0); };
  DistributedProgram p;
  try {
    p = plan(without);
  } catch (const SearchBudgetError&) {
    throw;
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
    // Off with recomputation tried next: no plan with ZeRO storage is needed to say anything.
    if (options.zero_storage == ZeroStorage::Off && recompute_next) throw;
    const auto t0 = std::chrono::steady_clock::now();
    DistributedProgram z;
    try {
      z = plan(with);
    } catch (const Error&) {
      throw e;
    }
    if (options.zero_storage == ZeroStorage::Off)
      throw OptionsError(std::string(e.what()) + "; it fits with ZeRO storage (predicted " +
                         std::to_string(z.predicted_step_s) +
                         " s per step), which parallel.zero_storage: off forbids (set it to auto)");
    note(z, "no program fits without ZeRO storage", t0);
    return z;
  }
  if (options.zero_storage == ZeroStorage::Off ||
      (options.zero_storage == ZeroStorage::Auto && !p.memory_bound &&
       !memory_tight(p, cluster, 0.9)))
    return p;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    DistributedProgram z = plan(with);
    if (z.predicted_step_s < p.predicted_step_s * (1 - 1e-9) &&
        zero_parameters(z, graph).first > 0) {
      char why[320];
      std::snprintf(why, sizeof why,
                    "%sZeRO storage is faster, %.4g s per step against %.4g s without",
                    options.zero_storage == ZeroStorage::Auto
                        ? "memory binds (a device 90% full or more, or the program found "
                          "without limits does not fit): "
                        : "",
                    z.predicted_step_s, p.predicted_step_s);
      note(z, why, t0);
      z.states_expanded += p.states_expanded;
      return z;
    }
    p.states_expanded += z.states_expanded;
  } catch (const SearchBudgetError&) {
    throw;
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
  }
  return p;
}

// Whether some devices are slower than others (FLOP/s, or the optimizer step per parameter):
// there every device updating a whole Replicated parameter waits for the slowest, where shards
// in proportion to speed (ZeRO storage) would balance the updates.
bool devices_differ(const Cluster& cluster) {
  for (const Device& d : cluster.devices)
    if (d.flops_per_s != cluster.devices[0].flops_per_s ||
        d.update_s_per_param != cluster.devices[0].update_s_per_param)
      return true;
  return false;
}

// A quick estimate of storing every parameter read whole sharded: p itself with each gradient
// all-reduce of a parameter with a row per device replaced by the bucketed all-gather of its
// shard (by bytes, the cheaper form) and its update made the shard's, priced by step_time
// (memory not checked: an estimate, not a program).
double zero_all_estimate_s(const DistributedProgram& p, const Graph& graph, const Cluster& cluster,
                           const SynthesisOptions& options) {
  CostModel cm(graph, cluster, options.optimizer_state_slots, options.overlap_grad_comm);
  cm.set_hierarchical(options.hierarchical_collectives);
  cm.set_recompute(p.node_segment, p.recompute);
  std::vector<Instruction> instrs = p.instructions;
  std::vector<bool> sharded(graph.tensors.size(), false);
  for (Instruction& in : instrs) {
    if (in.kind != InstrKind::GradAllReduce) continue;
    const GraphTensor& t = graph.tensors[in.tensor];
    if (t.role != TensorRole::Parameter || t.shape.empty() || t.shape[0] < cluster.size()) continue;
    const std::vector<double>& r = p.ratios[static_cast<size_t>(in.segment)];
    double best = std::numeric_limits<double>::infinity();
    for (CollectiveMethod m : cm.gather_methods()) {
      const double c = cm.communication(InstrKind::AllGather, in.tensor, m).eval(r);
      if (c < best) {
        best = c;
        in.method = m;
      }
    }
    in.kind = InstrKind::AllGather;
    in.from = Prop::sharded(0);
    in.to = Prop::replicated();
    in.from_segment = in.segment;
    in.regather = false;
    in.cost_s = best;
    sharded[in.tensor] = true;
  }
  for (Instruction& in : instrs)
    if (in.kind == InstrKind::Update && sharded[in.tensor]) {
      in.from = in.to = Prop::sharded(0);
      in.cost_s = cm.update(in.tensor, in.to).eval(p.ratios[static_cast<size_t>(in.segment)]);
    }
  return step_time(cm, instrs).step_s;
}

// plan_storage_choice, and (Auto: on a cluster whose devices differ in speed, or where memory
// shaped the program or fills a device to 90%; On: always) the program with every parameter
// read whole stored sharded (ZeroStorage::All: the updates, gradient norms and optimizer state
// in shards by each segment's ratios, paid with bucketed all-gathers in forward and
// reduce-scatters in backward, both overlapped) too, the faster by predicted step time kept
// (the search's own pricing, which sees neither buckets nor overlap, may miss it); with All
// only that one. Not where hap fell back to a baseline over its budget, nor (Auto, memory not
// binding) where p with its parameters so stored (zero_all_estimate_s) is not predicted faster
// than p: the second search costs as much as the first (on GPT-2 across V100s and P100s, 2-3x
// the synthesis time) and mostly finds nothing faster where the estimate does not either.
DistributedProgram plan_storage(
    const Graph& graph, const Cluster& cluster, const SynthesisOptions& options,
    const std::function<DistributedProgram(const SynthesisOptions&)>& plan, bool recompute_next) {
  if (options.strategy != Strategy::Hap || options.zero_storage == ZeroStorage::All)
    return plan(options);
  DistributedProgram p = plan_storage_choice(graph, cluster, options, plan, recompute_next);
  if (options.zero_storage == ZeroStorage::Off || cluster.size() < 2 || !p.note.empty() ||
      !(options.zero_storage == ZeroStorage::On || devices_differ(cluster) || p.memory_bound ||
        memory_tight(p, cluster, 0.9)))
    return p;
  if (options.zero_storage == ZeroStorage::Auto && !p.memory_bound &&
      !memory_tight(p, cluster, 0.9) &&
      zero_all_estimate_s(p, graph, cluster, options) >= p.predicted_step_s)
    return p;
  const auto t0 = std::chrono::steady_clock::now();
  SynthesisOptions all = options;
  all.zero_storage = ZeroStorage::All;
  all.explain_out_of_memory = false;  // (a candidate that does not fit is only left out)
  // The log keeps the first program's rounds and ends with this candidate (its states, its step
  // time, whether it was kept).
  SynthesisStep step;
  try {
    DistributedProgram z = plan(all);
    const auto [stored, again] = zero_parameters(z, graph);
    const bool faster =
        z.note.empty() && stored > 0 && z.predicted_step_s < p.predicted_step_s * (1 - 1e-9);
    char what[400];
    std::snprintf(what, sizeof what,
                  "every parameter read whole stored sharded (%d, %d of "
                  "them gathered again in backward; each device updates its share) %s, %.4g s "
                  "per step against %.4g s",
                  stored, again, faster ? "is faster, kept" : "is not faster", z.predicted_step_s,
                  p.predicted_step_s);
    step.what = what;
    step.states = z.states_expanded;
    step.cost_s = z.predicted_step_s;
    if (faster) {
      z.steps = std::move(p.steps);
      z.states_expanded += p.states_expanded;
      p = std::move(z);
    } else {
      p.states_expanded += z.states_expanded;
    }
  } catch (const SearchBudgetError& e) {
    // (A candidate over the budget is left out; the program found stands.)
    step.what = std::string(
                    "every parameter read whole stored sharded: "
                    "over the search budget (") +
                e.what() + ")";
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
    step.what = "every parameter read whole stored sharded: does not fit";
  }
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.steps.push_back(step);
  return p;
}

// The nodes whose parameters' gradients a program computes from broadcast factors.
int factor_nodes(const DistributedProgram& p) {
  return static_cast<int>(
      std::count_if(p.instructions.begin(), p.instructions.end(),
                    [](const Instruction& in) { return in.kind == InstrKind::FactorBroadcast; }));
}

// plan_on, deciding sufficient factor broadcasting (FactorBroadcast): where the program found
// with it uses it, the program without it too, the faster by predicted step time kept (the
// report's first step says which and why).
DistributedProgram plan_factors(const Graph& graph, const Cluster& cluster,
                                const SynthesisOptions& options) {
  DistributedProgram p = plan_on(graph, cluster, options);
  const int nodes = factor_nodes(p);
  if (nodes == 0 || options.factor_broadcast == FactorBroadcast::Off) return p;
  const auto t0 = std::chrono::steady_clock::now();
  SynthesisOptions off = options;
  off.factor_broadcast = FactorBroadcast::Off;
  DistributedProgram q;
  try {
    q = plan_on(graph, cluster, off);
  } catch (const SearchBudgetError&) {
    throw;
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
    q.predicted_step_s = std::numeric_limits<double>::infinity();
  }
  const bool keep = p.predicted_step_s <= q.predicted_step_s;
  char why[240];
  if (std::isfinite(q.predicted_step_s))
    std::snprintf(why, sizeof why,
                  "factor broadcasting at %d product(s): %.4g s per step, %.4g s without "
                  "(gradient all-reduces instead): %s",
                  nodes, p.predicted_step_s, q.predicted_step_s,
                  keep ? "kept" : "planned without it");
  else
    std::snprintf(why, sizeof why,
                  "factor broadcasting at %d product(s): %.4g s per step; nothing fits without it",
                  nodes, p.predicted_step_s);
  DistributedProgram& best = keep ? p : q;
  best.states_expanded = p.states_expanded + q.states_expanded;
  SynthesisStep step;
  step.what = why;
  step.cost_s = best.predicted_step_s;
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  best.steps.insert(best.steps.begin(), step);
  return keep ? p : q;
}

// The least that recomputing one segment adds to a step: its forward FLOPs over the whole
// cluster's FLOP/s (a lower bound: every device's share of it runs again).
double least_recompute_s(const Graph& graph, const Cluster& cluster,
                         const SynthesisOptions& options) {
  int nseg = 1;
  const std::vector<int> seg = assign_segments(graph, options.segments, &nseg);
  std::vector<double> flops(static_cast<size_t>(nseg), 0.0);
  for (const GraphNode& n : graph.nodes) flops[static_cast<size_t>(seg[n.id])] += n.flops;
  double total = 0;
  for (const Device& d : cluster.devices) total += d.flops_per_s;
  return *std::min_element(flops.begin(), flops.end()) / total;
}

DistributedProgram synthesize_on(const Graph& graph, const Cluster& cluster,
                                 const SynthesisOptions& options) {
  auto plain = [&](const SynthesisOptions& o) { return plan_factors(graph, cluster, o); };
  if (options.recompute == Recompute::All)
    return plan_storage(graph, cluster, options, plain, false);
  SynthesisOptions without = options;
  without.recompute = Recompute::Off;
  // The plan recomputing activations: the search for how many segments (below). `unfit`: why no
  // program fits without (nullptr: one does, and this is an alternative to it).
  auto recomputing = [&](const Error* unfit) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> order = recompute_order(graph, cluster, options);
    const int nseg = static_cast<int>(order.size());
    auto first = [&](int k, bool zero_all = false) {
      SynthesisOptions o = options;
      o.explain_out_of_memory = false;  // (a count that does not fit is only a count ruled out)
      o.recompute = Recompute::All;
      o.recompute_segments.assign(static_cast<size_t>(nseg), false);
      for (int i = 0; i < k; ++i) o.recompute_segments[static_cast<size_t>(order[i])] = true;
      if (o.zero_storage == ZeroStorage::Auto) o.zero_storage = ZeroStorage::On;  // no fit without
      if (zero_all) o.zero_storage = ZeroStorage::All;
      return plan_factors(graph, cluster, o);
    };
    DistributedProgram p;
    try {
      p = first(nseg);
    } catch (const Error&) {
      if (unfit == nullptr) throw;
      throw *unfit;
    }
    if (options.recompute == Recompute::Off)
      throw OptionsError(std::string(unfit->what()) +
                         "; it fits with activation recomputation (predicted " +
                         std::to_string(p.predicted_step_s) +
                         " s per step), which parallel.recompute: off forbids (set it to auto)");
    // Fewer segments recomputed run less again but leave less memory to balance the work with:
    // bisect for the fewest that fit (lo does not, hi does), then look between those and all for
    // the fastest count (the step time falls as the memory freed lets the ratios follow speed,
    // then rises with the forward run again: taken as unimodal, ternary steps), keeping the
    // fastest plan that fit. (The bisection alone kept whichever counts it happened to try: on
    // GPT-2 at 1,024 tokens across hap-paper's V100s and P100s hap recomputed 13 of 13 segments
    // where dp-cp, bisecting another way, recomputed 12 and was predicted faster.)
    std::map<int, double> tried = {{nseg, p.predicted_step_s}};
    int fitted = 1;
    auto attempt = [&](int k) {
      if (auto it = tried.find(k); it != tried.end()) return it->second;
      double cost = std::numeric_limits<double>::infinity();
      try {
        DistributedProgram q = first(k);
        cost = q.predicted_step_s;
        ++fitted;
        if (q.predicted_step_s < p.predicted_step_s) p = std::move(q);
      } catch (const SearchBudgetError&) {
        throw;
      } catch (const Error& inner) {
        if (no_program_reason(inner) != "out of memory") throw;
      }
      tried[k] = cost;
      return cost;
    };
    int lo = 0, hi = nseg;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (std::isfinite(attempt(mid)))
        hi = mid;
      else
        lo = mid;
    }
    for (int a = hi, b = nseg; b - a > 1;) {
      if (b - a == 2) {
        attempt(a + 1);
        break;
      }
      const int m1 = a + (b - a) / 3, m2 = b - (b - a) / 3;
      if (attempt(m1) <= attempt(m2))
        b = m2;
      else
        a = m1;
    }
    int tries = static_cast<int>(tried.size());
    // Every parameter read whole stored sharded (as plan_storage plans it where no recomputation
    // is needed), which frees memory: at the count found, then at fewer while that fits (down to
    // one fewer than the fewest that fit without it), the fastest kept.
    int zero_all_fitted = 0;
    if (options.strategy == Strategy::Hap && cluster.size() > 1 &&
        (options.zero_storage == ZeroStorage::On ||
         (options.zero_storage == ZeroStorage::Auto && devices_differ(cluster)))) {
      const int at = static_cast<int>(std::count(p.recompute.begin(), p.recompute.end(), true));
      for (int k = at; k >= std::max(1, std::min(at, hi - 1)); --k) {
        ++tries;
        try {
          DistributedProgram q = first(k, true);
          ++zero_all_fitted;
          if (zero_parameters(q, graph).first > 0 &&
              q.predicted_step_s < p.predicted_step_s * (1 - 1e-9))
            p = std::move(q);
        } catch (const SearchBudgetError&) {
          break;  // (a candidate over the budget is left out; the program found stands)
        } catch (const Error& inner) {
          if (no_program_reason(inner) != "out of memory") throw;
          break;
        }
      }
    }
    fitted += zero_all_fitted;
    SynthesisStep step;
    step.what = std::string(unfit != nullptr ? "no program fits without recomputing activations"
                                             : "recomputing activations is faster") +
                ": " + std::to_string(std::count(p.recompute.begin(), p.recompute.end(), true)) +
                " of " + std::to_string(nseg) + " segments recompute (the fastest of " +
                std::to_string(fitted) + " plans that fit, " + std::to_string(tries) + " tried; " +
                std::to_string(hi) + " the fewest that fit)";
    step.cost_s = p.predicted_step_s;
    step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.steps.insert(p.steps.begin(), step);
    return p;
  };
  DistributedProgram p;
  try {
    p = plan_storage(graph, cluster, without, plain, options.recompute == Recompute::Auto);
  } catch (const SearchBudgetError&) {
    throw;
  } catch (const OptionsError&) {
    throw;  // zero_storage off where only it fits, recomputation off
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
    return recomputing(&e);
  }
  // Where memory shaped the program (hap: the one found without limits did not fit) and it is
  // slower than that one by more than recomputing the least segment would cost, recomputing may
  // free the memory to split by speed: planned too, the faster kept. (When recomputation was
  // tried only where nothing fit, dp-cp plans recomputing some segments were predicted up to
  // 1.44x faster than hap's plans without it,
  // Synthesizer.HapIsNeverSlowerThanAnyBaselineWhereOnlyRecomputationFits.)
  if (options.recompute != Recompute::Auto || !p.memory_bound || !p.note.empty() ||
      !(p.predicted_step_s > p.unlimited_step_s + least_recompute_s(graph, cluster, options)))
    return p;
  const auto t0 = std::chrono::steady_clock::now();
  SynthesisStep step;
  try {
    DistributedProgram r = recomputing(nullptr);
    if (r.predicted_step_s < p.predicted_step_s * (1 - 1e-9)) {
      r.states_expanded += p.states_expanded;
      r.steps.front().what += "; without recomputation " + std::to_string(p.predicted_step_s) +
                              " s per step, memory shaping the program";
      return r;
    }
    p.states_expanded += r.states_expanded;
    step.what = "recomputing activations, " +
                std::to_string(std::count(r.recompute.begin(), r.recompute.end(), true)) +
                " segments, is not faster: " + std::to_string(r.predicted_step_s) + " s per step";
    step.cost_s = r.predicted_step_s;
  } catch (const SearchBudgetError&) {
    step.what = "recomputing activations: over the search budget";
  } catch (const Error& e) {
    if (no_program_reason(e) != "out of memory") throw;
    step.what = "recomputing activations: does not fit";
  }
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.steps.push_back(step);
  return p;
}

}  // namespace

DistributedProgram synthesize(const Graph& graph, const Cluster& cluster,
                              const SynthesisOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  cluster.validate();
  const int D = cluster.size();
  if (!options.devices.empty()) {
    std::vector<int> pinned = options.devices;
    std::sort(pinned.begin(), pinned.end());
    SynthesisOptions o = options;
    o.devices.clear();
    const Cluster sub = cluster.subset(pinned);  // checks the ranks
    if (static_cast<int>(pinned.size()) == D) return synthesize_on(graph, cluster, o);
    DistributedProgram p = synthesize_on(graph, sub, o);
    p.devices = pinned;
    p.devices_note = "runs on the " + std::to_string(pinned.size()) +
                     " devices pinned; left out: " + left_out_list(cluster, pinned);
    return p;
  }
  // hap on all devices. Where nothing fits on all of them, device selection may still find
  // devices that hold the model (one whose memory is too small for any program is left out, not
  // a plan that fails); where no subset fits either, the error is the one on all devices.
  DistributedProgram best;
  std::exception_ptr on_all_error;
  const bool selects = options.strategy == Strategy::Hap && options.select_devices && D > 1;
  try {
    best = synthesize_on(graph, cluster, options);
  } catch (const Error& e) {
    if (!selects || no_program_reason(e) != "out of memory") throw;
    on_all_error = std::current_exception();
    best.predicted_step_s = std::numeric_limits<double>::infinity();
    best.steps.push_back({"devices: all " + std::to_string(D), 0, -1, 0, "out of memory"});
  }
  // Not where hap fell back to a baseline over its budget: that is the plan to raise it for.
  if (!selects || !best.note.empty()) return best;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // Each subset of the fastest is planned by hap itself, so that the plan is the fastest of hap's
  // plans on all devices and on each subset (and more memory, which keeps each subset's plan or
  // finds a faster one, keeps their minimum). Judging subsets by their dp-cp programs (fast to
  // find) and planning hap on the most promising one only missed subsets where hap does far
  // better than dp-cp: 48 layers on 64 devices chose 2.591 s per step where hap on the 32
  // fastest, whose dp-cp was 5% slower than hap on all, takes 2.359 s (bench_synthesis); on seed
  // 104 of Synthesizer.MoreMemoryNeverYieldsASlowerPlan a subset 2.3x faster was missed.
  // Where the program on all devices recomputes, subsets decide recomputation for themselves as
  // the user's option says: one that leaves out the device short of memory may need none (they
  // recomputed as all devices did, which made a little more memory on one device choose a slower
  // plan once the recomputed segments' collectives were priced again: Synthesizer.MoreMemory-
  // NeverYieldsASlowerPlan, seed 42). Where it does not, subsets are planned without recomputing
  // (planning every subset with recomputation cost 25% more synthesis time on 64 devices,
  // bench_synthesis), except one that fits nothing without it and could still be the fastest
  // (below).
  const bool recomputes =
      std::find(best.recompute.begin(), best.recompute.end(), true) != best.recompute.end();
  SynthesisOptions judge = options;
  judge.select_devices = false;
  if (!recomputes) judge.recompute = Recompute::Off;
  judge.explain_out_of_memory = false;  // (a subset that fits nothing is only left out)
  DistributedProgram found;             // the fastest program on a subset
  found.predicted_step_s = std::numeric_limits<double>::infinity();
  std::vector<int> chosen;
  // The subsets are nested (the k fastest are among the 2k fastest): planned from the largest
  // down, and where one runs out of memory, a smaller one whose smallest memory is no larger is
  // not planned (a subset that fits nothing is the slowest to plan: the search under the limits
  // finds nothing). Such a smaller subset holds a device with as little memory as the larger
  // one's least, and any program of hap's space on it extends to the larger subset: the devices
  // added (slower, with no less memory than that device) get the least share of what is split
  // and hold what is replicated, no more than that device holds; shares of the others only
  // shrink. So where the larger subset's search found nothing, the smaller one's would not
  // either (up to the search being local). The log lists them smallest first.
  const std::vector<std::vector<int>> subsets = fastest_subsets(cluster);
  std::vector<SynthesisStep> judged(subsets.size());
  // Of the subsets that ran out of memory (all of them holding the ones still to judge): the
  // largest smallest memory among them, and that subset's size (0: none ran out).
  size_t ran_out = 0;
  int64_t ran_out_memory = 0;
  auto smallest_memory = [&](const std::vector<int>& subset) {
    int64_t m = std::numeric_limits<int64_t>::max();
    for (int d : subset) m = std::min(m, cluster.devices[static_cast<size_t>(d)].memory_bytes);
    return m;
  };
  // A subset that fits nothing without recomputation may fit with it (where the user lets the
  // planner choose) and still be the fastest: fewer, faster devices with ample memory between
  // them recompute a few segments where all devices need not. Such a subset is planned
  // recomputing as it chooses, but only where its program without memory limits, plus the least
  // that recomputing one segment adds, could beat what is planned (limits and recomputation only
  // add, up to the search being local), so that small subsets of large clusters cost one quick
  // plan each. Without this, more memory could make the plan slower: where the program on all
  // devices begins to fit without recomputing, the subsets stopped recomputing too (seed 3 of
  // Synthesizer.HapIsNeverSlowerThanAnyBaselineWhereOnlyRecomputationFits: 8.3 ms per step on
  // both devices against 3.2 ms on the faster one alone with a little less memory).
  const bool may_recompute = options.recompute == Recompute::Auto && !recomputes;
  SynthesisOptions recomputing = judge;
  recomputing.recompute = Recompute::Auto;
  // The fastest plan in hand: on all devices, or on a subset planned so far.
  auto in_hand_s = [&] { return std::min(found.predicted_step_s, best.predicted_step_s); };
  // The step's FLOPs, for each subset's compute bound (its FLOP/s alone).
  const double step_flops =
      CostModel(graph, cluster, options.optimizer_state_slots, options.overlap_grad_comm)
          .compute_lower_bound_s() *
      cluster.total_flops_per_s();
  auto consider = [&](DistributedProgram p, const std::vector<int>& subset) {
    if (p.predicted_step_s <= found.predicted_step_s) {  // (ties: the fewest devices)
      found = std::move(p);
      chosen = subset;
    }
  };
  for (size_t i = subsets.size(); i-- > 0;) {
    const std::vector<int>& subset = subsets[i];
    const auto sub_t0 = std::chrono::steady_clock::now();
    SynthesisStep& step = judged[i];
    step.what = "devices: the " + std::to_string(subset.size()) + " fastest";
    const Cluster sub = cluster.subset(subset);
    // No program on the subset is faster than its compute bound (every FLOP of the step on the
    // subset's FLOP/s, nothing else; recomputation only adds): where that is slower than a plan
    // in hand, the subset cannot be chosen and is not planned.
    const double floor_s = step_flops / sub.total_flops_per_s();
    const bool must_run_out = ran_out > 0 && smallest_memory(subset) <= ran_out_memory;
    if (!must_run_out && floor_s > in_hand_s()) {
      char why[96];
      std::snprintf(why, sizeof why, "not planned: %.4g s per step at best (compute alone)",
                    floor_s);
      step.outcome = why;
      step.seconds = since(sub_t0);
      continue;
    }
    // Recomputing on a subset that fits nothing without (when it could be the fastest).
    auto with_recomputation = [&]() {
      if (!may_recompute) return;
      const double least_s = least_recompute_s(graph, sub, options);
      if (floor_s + least_s > in_hand_s()) return;
      Cluster roomy = sub;
      for (Device& d : roomy.devices) d.memory_bytes = kNoMemoryLimit;
      double bound = std::numeric_limits<double>::infinity();
      try {
        bound = synthesize_on(graph, roomy, judge).predicted_step_s + least_s;
      } catch (const Error&) {
        return;
      }
      if (!(bound < in_hand_s())) return;
      step.what += ", recomputing";
      try {
        DistributedProgram p = synthesize_on(graph, sub, recomputing);
        step.states = p.states_expanded;
        step.cost_s = p.predicted_step_s;
        step.outcome.clear();
        consider(std::move(p), subset);
      } catch (const Error& e) {
        step.outcome = no_program_reason(e);
      }
    };
    if (must_run_out) {
      step.outcome =
          "out of memory (as the " + std::to_string(ran_out) + " fastest are; not planned)";
      with_recomputation();
      step.seconds = since(sub_t0);
      best.states_expanded += step.states;
      continue;
    }
    try {
      DistributedProgram p = synthesize_on(graph, sub, judge);
      step.states = p.states_expanded;
      step.cost_s = p.predicted_step_s;
      consider(std::move(p), subset);
    } catch (const Error& e) {
      step.outcome = no_program_reason(e);
      if (step.outcome == "out of memory" && smallest_memory(subset) >= ran_out_memory) {
        ran_out = subset.size();
        ran_out_memory = smallest_memory(subset);
      }
      if (step.outcome == "out of memory") with_recomputation();
    }
    step.seconds = since(sub_t0);
    best.states_expanded += step.states;
  }
  for (SynthesisStep& step : judged) best.steps.push_back(std::move(step));
  if (!chosen.empty() && found.predicted_step_s < best.predicted_step_s * (1 - 1e-9)) {
    char why[160];
    if (on_all_error)
      std::snprintf(why, sizeof why, "predicted %.4g s per step on them; nothing fits on all %d",
                    found.predicted_step_s, D);
    else
      std::snprintf(why, sizeof why, "predicted %.4g s per step on them, %.4g s on all %d",
                    found.predicted_step_s, best.predicted_step_s, D);
    found.devices = chosen;
    found.devices_note = "runs on the " + std::to_string(chosen.size()) + " fastest devices (" +
                         why + "); left out: " + left_out_list(cluster, chosen);
    // How the whole synthesis went: the steps on all devices, then the subsets' (each one's
    // own rounds summed in one line).
    found.steps = std::move(best.steps);
    found.states_expanded = best.states_expanded;
    best = std::move(found);
  } else if (on_all_error) {
    std::rethrow_exception(on_all_error);
  }
  best.synthesis_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return best;
}

}  // namespace hap::synth
