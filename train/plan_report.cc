#include "train/plan_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>

#include "synth/shard_layout.h"
#include "synth/synthesizer.h"

namespace hap::train {

using synth::InstrKind;
using synth::Instruction;
using synth::Prop;

namespace {

// "%.1f"-style fixed text of any size.
std::string fixed(double value, int decimals) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(decimals) << value;
  return os.str();
}

std::string fmt_bytes(double b) {
  constexpr std::array<const char*, 7> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::size_t u = 0;
  while (b >= 1024 && u + 1 < kUnits.size()) {
    b /= 1024;
    ++u;
  }
  return fixed(b, 1) + " " + kUnits[u];
}

std::string scientific(double value, int decimals) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(decimals) << value;
  return os.str();
}

// "1.250 s", "3.100 ms", "12.0 us", "0.4 ns"; outside [1e-10 s, 1e5 s), "2.00e+30 s": never
// without its unit, never a bare 0 for a time that is not.
std::string fmt_s(double s) {
  if (s == 0) return "0 s";
  if (!std::isfinite(s) || s >= 1e5 || s < 1e-10) return scientific(s, 2) + " s";
  if (s >= 1) return fixed(s, 3) + " s";
  if (s >= 1e-3) return fixed(s * 1e3, 3) + " ms";
  if (s >= 1e-6) return fixed(s * 1e6, 1) + " us";
  return fixed(s * 1e9, 1) + " ns";
}

// A ratio such as a speed-up, with enough decimals that one other than 1 never reads "1.00"
// (0.996x, 1.0004x).
std::string fmt_ratio(double x) {
  int decimals = 2;
  while (decimals < 6 && x != 1 && std::isfinite(x) && fixed(x, decimals) == fixed(1.0, decimals))
    ++decimals;
  return fixed(x, decimals);
}

// Shares below this print in scientific notation (1.0e-09): fixed decimals would show 0.
constexpr double kTinyShare = 1e-6;

// Decimals for a row of shares: at least three, three significant digits for the smallest share
// that is not tiny, and enough that the rounding of all of them adds up to less than 0.0005, so
// the printed shares visibly sum to 1.
int share_decimals(const std::vector<double>& shares) {
  int decimals = 3;
  double smallest = 1;
  for (double share : shares)
    if (share >= kTinyShare) smallest = std::min(smallest, share);
  decimals = std::max(decimals, 2 - static_cast<int>(std::floor(std::log10(smallest))));
  const double n = static_cast<double>(std::max<std::size_t>(shares.size(), 1));
  return std::max(decimals, static_cast<int>(std::ceil(std::log10(n * 1000))));
}

std::string fmt_share(double share, int decimals) {
  return share > 0 && share < kTinyShare ? scientific(share, 1) : fixed(share, decimals);
}

// Left-aligned in `width` characters; longer text is kept whole and pushes the next column.
std::string pad(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}
std::string pad_left(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

std::string signature_str(const synth::CostModel& cm, const Instruction& in) {
  const synth::GraphNode& n = cm.graph().nodes[in.node];
  std::string s;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i] < 0) continue;
    if (!s.empty()) s += ",";
    s += cm.input_prop(in.node, in.signature, i).str();
  }
  s += "->";
  for (size_t o = 0; o < n.outputs.size(); ++o)
    s += (o ? "," : "") + cm.output_prop(in.node, in.signature, o).str();
  return s;
}

// The bytes a factor_broadcast gathers: its node's Sharded inputs but the parameters, and its
// Sharded outputs' gradients.
double factors_bytes(const synth::CostModel& cm, const Instruction& in) {
  const synth::Graph& g = cm.graph();
  const synth::GraphNode& n = g.nodes[static_cast<size_t>(in.node)];
  double b = 0;
  for (size_t k = 0; k < n.inputs.size(); ++k)
    if (n.inputs[k] >= 0 &&
        g.tensors[static_cast<size_t>(n.inputs[k])].role != synth::TensorRole::Parameter &&
        cm.input_prop(in.node, in.signature, k).kind == ops::PropKind::Sharded)
      b += static_cast<double>(g.tensors[static_cast<size_t>(n.inputs[k])].bytes());
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (cm.output_prop(in.node, in.signature, o).kind == ops::PropKind::Sharded)
      b += static_cast<double>(g.tensors[static_cast<size_t>(n.outputs[o])].bytes());
  return b;
}

}  // namespace

std::string plan_report(const synth::CostModel& cm, const synth::DistributedProgram& p,
                        const std::vector<synth::DistributedProgram>& baselines) {
  const synth::Graph& g = cm.graph();
  const synth::Cluster& c = cm.cluster();
  std::ostringstream os;
  os << "plan: strategy " << p.strategy << " on " << c.name << " (" << c.size() << " devices, "
     << c.num_nodes() << " nodes); " << g.nodes.size() << " ops, " << g.parameter_count()
     << " parameters\n";
  if (!p.devices.empty()) os << "devices: " << p.devices_note << "\n";
  if (const auto n = std::count(p.recompute.begin(), p.recompute.end(), true); n > 0)
    os << "recomputation: " << n << " of " << p.recompute.size()
       << " segments keep no activations for backward and run their forward again there\n";
  // Hierarchical collectives: how many, over which nodes, and what they save against the best
  // flat form (each priced on its own, overlap and buckets left out).
  int hierarchical = 0, all_reduces = 0;
  double flat_s = 0, hier_s = 0;
  for (const synth::Instruction& in : p.instructions) {
    if (in.method != synth::CollectiveMethod::Hierarchical) continue;
    ++hierarchical;
    const bool reduces = in.kind == InstrKind::AllReduce || in.kind == InstrKind::GradAllReduce;
    all_reduces += reduces ? 1 : 0;
    hier_s += in.cost_s;
    const std::vector<double>& r = p.ratios[static_cast<size_t>(in.segment)];
    double flat = cm.communication(in.kind, in.tensor, synth::CollectiveMethod::Grouped).eval(r);
    if (!reduces)
      flat = std::min(
          flat, cm.communication(in.kind, in.tensor, synth::CollectiveMethod::Padded).eval(r));
    flat_s += flat;
  }
  if (hierarchical > 0) {
    const int lanes = cm.hierarchy_lanes();
    os << "hierarchical collectives: " << hierarchical << " (" << all_reduces << " all-reduce"
       << (all_reduces == 1 ? "" : "s") << ", " << hierarchical - all_reduces
       << " all-gathers and reduce-scatters; inside each of the " << c.num_nodes()
       << " nodes, then across them in " << lanes << " lane" << (lanes == 1 ? "" : "s")
       << "): " << fmt_s(hier_s) << " per step where flat ones would take " << fmt_s(flat_s)
       << "\n";
  }

  // ZeRO storage: parameters stored sharded and all-gathered for use.
  int gathered = 0, regathered = 0;
  double gathered_bytes = 0;
  for (const synth::Instruction& in : p.instructions) {
    if (in.kind != InstrKind::AllGather ||
        g.tensors[static_cast<size_t>(in.tensor)].role != synth::TensorRole::Parameter)
      continue;
    ++gathered;
    regathered += in.regather ? 1 : 0;
    gathered_bytes += static_cast<double>(g.tensors[static_cast<size_t>(in.tensor)].bytes());
  }
  if (gathered > 0)
    os << "ZeRO storage: " << gathered << " parameter" << (gathered == 1 ? "" : "s") << " ("
       << fmt_bytes(gathered_bytes)
       << ") stored sharded with their gradients and optimizer state, all-gathered for use and "
          "their gradients reduce-scattered; "
       << regathered << " of them not kept for backward but gathered again there\n";

  // Sufficient factor broadcasting: products whose parameters' gradients come from whole factors.
  int factor_nodes = 0;
  double factor_param_bytes = 0, factor_bytes = 0;
  for (const synth::Instruction& in : p.instructions) {
    if (in.kind != InstrKind::FactorBroadcast) continue;
    ++factor_nodes;
    factor_bytes += factors_bytes(cm, in);
    for (int t : g.nodes[static_cast<size_t>(in.node)].inputs)
      if (t >= 0 && g.tensors[static_cast<size_t>(t)].role == synth::TensorRole::Parameter)
        factor_param_bytes += static_cast<double>(g.tensors[static_cast<size_t>(t)].bytes());
  }
  if (factor_nodes > 0)
    os << "factor broadcasting: " << factor_nodes << " product" << (factor_nodes == 1 ? "" : "s")
       << " compute their parameters' gradients (" << fmt_bytes(factor_param_bytes)
       << ") whole on every device from their inputs and output gradients all-gathered in "
          "backward ("
       << fmt_bytes(factor_bytes) << ") instead of all-reducing them\n";

  // A segment's work comes in whole rows (granules): where the ratios round to other shares of
  // its largest split computation, say what each device really gets.
  const synth::ShardLayout layout(g, p.instructions, p.ratios);
  std::vector<int> largest(p.ratios.size(), -1);
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const Instruction& in = p.instructions[i];
    if (in.kind != InstrKind::Compute || !cm.splits_work(in.node, in.signature)) continue;
    int& best = largest[static_cast<size_t>(in.segment)];
    if (best < 0 || cm.step_flops(in.node) > cm.step_flops(p.instructions[best].node))
      best = static_cast<int>(i);
  }
  os << "\nratios (share of each device, per segment):\n";
  for (size_t s = 0; s < p.ratios.size(); ++s) {
    os << "  segment " << s << ":";
    const int decimals = share_decimals(p.ratios[s]);
    for (double r : p.ratios[s]) os << " " << fmt_share(r, decimals);
    if (largest[s] >= 0) {
      const Instruction& in = p.instructions[static_cast<size_t>(largest[s])];
      const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
      const std::vector<double> real =
          cm.compute_shares(in.node, in.signature, p.ratios[s], layout.granule(tensor, dim));
      bool differs = false;
      for (size_t d = 0; d < real.size(); ++d)
        differs = differs || std::abs(real[d] - p.ratios[s][d]) > 1e-9;
      if (differs) {
        os << "  (in whole rows of "
           << (g.nodes[in.node].module.empty() ? "<top>" : g.nodes[in.node].module) << " "
           << ops::op_name(g.nodes[in.node].kind) << ":";
        for (double r : real) os << " " << fmt_share(r, decimals);
        os << ")";
      }
    }
    os << "\n";
  }

  // Strategy per layer: the signature each compute takes, grouped by module and op, so that
  // identical blocks collapse to one line each.
  os << "\nstrategy per layer (module: op signature):\n";
  std::map<std::string, std::vector<std::string>> rows;
  std::vector<std::string> order;
  for (const Instruction& in : p.instructions) {
    if (in.kind != InstrKind::Compute) continue;
    const synth::GraphNode& n = g.nodes[in.node];
    if (cm.step_flops(in.node) == 0 && !cm.splits_work(in.node, in.signature)) continue;
    std::string module = n.module.empty() ? "<top>" : n.module;
    if (!rows.count(module)) order.push_back(module);
    rows[module].push_back(std::string(ops::op_name(n.kind)) + " " + signature_str(cm, in));
  }
  std::map<std::string, std::vector<std::string>> seen;  // collapse identical layers
  for (const std::string& m : order) {
    std::string joined;
    for (const std::string& r : rows[m]) joined += "  " + r;
    std::string key = joined;
    seen[key].push_back(m);
  }
  for (const std::string& m : order) {
    std::string joined;
    for (const std::string& r : rows[m]) joined += "  " + r;
    auto& same = seen[joined];
    if (same.empty() || same.front() != m) continue;
    std::string names =
        same.size() > 1 ? same.front() + " (+" + std::to_string(same.size() - 1) + " alike)" : m;
    os << "  " << names << ":" << joined << "\n";
  }

  os << "\ncollectives per step:\n";
  std::map<std::string, std::pair<int, double>> coll;  // kind/method -> (count, seconds)
  double bytes_total = 0;
  int listed = 0;
  for (const Instruction& in : p.instructions) {
    if (in.kind == InstrKind::Compute || in.kind == InstrKind::Update) continue;
    if (c.size() == 1) continue;  // one device communicates with nobody: nothing moves
    double bytes = in.kind == InstrKind::FactorBroadcast
                       ? factors_bytes(cm, in)
                       : static_cast<double>(g.tensors[in.tensor].bytes());
    bytes_total += bytes;
    std::string key = std::string(synth::instr_name(in.kind)) + " " + synth::method_name(in.method);
    coll[key].first++;
    coll[key].second += in.cost_s;
    if (in.kind == InstrKind::Reshard && in.cost_s == 0) continue;  // equal ratios: nothing moves
    if (listed++ < 40) {
      const synth::GraphTensor& t = g.tensors[in.tensor];
      std::string where = in.kind == InstrKind::FactorBroadcast ? g.nodes[in.node].module
                          : t.producer >= 0                     ? g.nodes[t.producer].module
                                                                : t.name;
      os << "  " << pad(std::string(synth::instr_name(in.kind)) + (in.regather ? "*" : ""), 16)
         << " " << pad(synth::method_name(in.method), 8) << " "
         << pad("%" + std::to_string(in.tensor), 9) << " "
         << (in.kind == InstrKind::FactorBroadcast
                 ? pad("factors", 14)  // the node's inputs and output gradients, gathered
                 : pad(in.from.str(), 6) + "->" + pad(in.to.str(), 6))
         << " " << pad_left(fmt_bytes(bytes), 10) << "  " << pad_left(fmt_s(in.cost_s), 10) << "  ("
         << where << ")\n";
    }
  }
  if (listed > 40) os << "  ... " << listed - 40 << " more\n";
  if (regathered > 0) os << "  (* gathered again in backward: its time counts twice the gather)\n";
  for (auto& [k, v] : coll)
    os << "  total " << k << ": " << v.first << " x, " << fmt_s(v.second) << "\n";
  if (listed == 0) os << (c.size() == 1 ? "  none (one device)\n" : "  none\n");

  os << "\npredicted step time: " << fmt_s(p.predicted_step_s) << " (compute " << fmt_s(p.compute_s)
     << ", communication " << fmt_s(p.communication_s);
  if (p.shared_latency_s > 0)
    os << ", less " << fmt_s(p.shared_latency_s)
       << " of latency that buckets pay once for all their members";
  if (p.hidden_communication_s > 0)
    os << ", of which " << fmt_s(p.hidden_communication_s) << " hidden behind computation";
  os << ")\n";
  if (cm.overlap_grad_comm() && cm.overlap() < 1)
    os << "overlap: gradient buckets and parameter gathers move at " << fixed(cm.overlap() * 100, 0)
       << "% of their pace while the devices compute (the least 'overlap' of the links used)\n";
  if (!p.note.empty()) os << "note: " << p.note << "\n";
  os << "compute lower bound (total FLOPs / total FLOP/s): " << fmt_s(cm.compute_lower_bound_s())
     << ", ratio " << p.predicted_step_s / cm.compute_lower_bound_s() << "\n";
  os << "per device:\n";
  // Where kernel overheads are profiled: each device's part of its compute that is fixed costs
  // per kernel call (on the nodes it computes any rows of).
  bool overheads = false;
  for (const synth::Device& device : c.devices)
    overheads = overheads || device.kernel_overhead_s > 0;
  std::vector<double> fixed_s(static_cast<std::size_t>(c.size()), 0.0);
  if (overheads) {
    const synth::ShardLayout layout(cm.graph(), p.instructions, p.ratios);
    for (const synth::Instruction& in : p.instructions) {
      if (in.kind != InstrKind::Compute) continue;
      const auto [tensor, dim] = cm.split_dim(in.node, in.signature);
      const std::vector<double> share =
          cm.compute_shares(in.node, in.signature, p.ratios[static_cast<std::size_t>(in.segment)],
                            tensor < 0 ? 1 : layout.granule(tensor, dim));
      for (int d = 0; d < c.size(); ++d)
        if (!cm.splits_work(in.node, in.signature) || share[static_cast<std::size_t>(d)] > 0)
          fixed_s[static_cast<std::size_t>(d)] += cm.fixed_compute_s(in.node, d);
    }
  }
  std::size_t name_width = 16;
  for (const synth::Device& device : c.devices)
    name_width = std::max(name_width, device.name.size());
  for (int d = 0; d < c.size(); ++d) {
    const double capacity = static_cast<double>(c.devices[d].memory_bytes);
    os << "  " << pad(std::to_string(d), 3) << " " << pad(c.devices[d].name, name_width)
       << " compute " << pad_left(fmt_s(p.device_compute_s[d]), 10)
       << (overheads ? " (kernel overheads " + fmt_s(fixed_s[static_cast<std::size_t>(d)]) + ")"
                     : std::string())
       << "  memory " << pad_left(fmt_bytes(p.device_memory_bytes[d]), 10) << " of "
       << pad_left(fmt_bytes(capacity), 10) << (p.device_memory_bytes[d] > capacity ? "  OVER" : "")
       << "\n";
  }
  if (!baselines.empty()) {
    os << "predicted speed-up of " << p.strategy << " over:";
    for (const synth::DistributedProgram& b : baselines)
      os << " " << b.strategy << " " << fmt_ratio(b.predicted_step_s / p.predicted_step_s) << "x ("
         << fmt_s(b.predicted_step_s) << ");";
    os << "\n";
  }
  os << "synthesis time: " << fixed(p.synthesis_s, 3) << " s (" << p.search_iterations
     << " search rounds, " << p.states_expanded << " states)\n";
  for (const synth::SynthesisStep& st : p.steps)
    os << "  " << pad(st.what, 28) << pad_left(fixed(st.seconds, 3), 8) << " s "
       << pad_left(std::to_string(st.states), 9) << " states  "
       << (st.cost_s >= 0 ? "predicted " + fmt_s(st.cost_s) : std::string()) << st.outcome << "\n";
  return os.str();
}

}  // namespace hap::train
