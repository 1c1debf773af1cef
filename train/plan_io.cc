#include "train/plan_io.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/input_file.h"
#include "synth/synthesizer.h"
#include "train/config.h"

namespace hap::train {

using synth::CollectiveMethod;
using synth::InstrKind;
using synth::Instruction;
using synth::Prop;

namespace {

std::string hex(uint64_t h) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << h;
  return os.str();
}

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string graph_fingerprint(const synth::Graph& g) {
  std::ostringstream os;
  for (const synth::GraphTensor& t : g.tensors)
    os << static_cast<int>(t.role) << shape_str(t.shape) << dtype_name(t.dtype) << t.name << ";";
  for (const synth::GraphNode& n : g.nodes) {
    os << ops::op_name(n.kind) << ":" << ops::attrs_str(n.attrs) << ":";
    for (int i : n.inputs) os << i << ",";
    os << ";";
  }
  return hex(fnv(os.str()));
}

std::string cluster_fingerprint(const synth::Cluster& c) {
  std::ostringstream os;
  for (const synth::Device& d : c.devices)
    os << d.name << d.flops_per_s << d.memory_bytes << d.node << ";";
  for (const synth::Node& n : c.nodes)
    os << n.name << n.link.bandwidth_bytes_per_s << n.link.latency_s << ";";
  os << c.inter_node.bandwidth_bytes_per_s << c.inter_node.latency_s;
  return hex(fnv(os.str()));
}

nlohmann::json plan_to_json(const synth::CostModel& cm, const synth::DistributedProgram& p) {
  HAP_CHECK(!p.ratios.empty() && static_cast<int>(p.ratios[0].size()) == cm.num_devices(),
            "plan file: the program runs on ", p.ratios.empty() ? 0 : p.ratios[0].size(),
            " devices but the cost model is of ", cm.num_devices(),
            " (a program on a device subset is written with the subset's cost model)");
  using nlohmann::json;
  json instrs = json::array();
  for (const Instruction& in : p.instructions) {
    json j = {{"kind", synth::instr_name(in.kind)}, {"segment", in.segment}, {"cost_s", in.cost_s}};
    if (in.kind == InstrKind::Compute || in.kind == InstrKind::FactorBroadcast) {
      j["node"] = in.node;
      j["signature"] = in.signature;
      j["op"] = ops::op_name(cm.graph().nodes[in.node].kind);
      j["module"] = cm.graph().nodes[in.node].module;
      if (in.kind == InstrKind::FactorBroadcast) j["method"] = synth::method_name(in.method);
    } else {
      j["tensor"] = in.tensor;
      j["from"] = in.from.str();
      j["to"] = in.to.str();
      j["method"] = synth::method_name(in.method);
      j["bytes"] = cm.graph().tensors[in.tensor].bytes();
      if (in.kind == InstrKind::Reshard) j["from_segment"] = in.from_segment;
      if (in.regather) j["regather"] = true;
    }
    instrs.push_back(j);
  }
  json storage = json::object();
  for (const synth::GraphTensor& t : cm.graph().tensors)
    if (t.producer < 0 && !t.name.empty() && t.role != synth::TensorRole::Constant)
      storage[t.name] = p.storage[t.id].str();
  json out = {{"format", "hap-plan-v1"},
              {"strategy", p.strategy},
              {"graph_fingerprint", graph_fingerprint(cm.graph())},
              {"cluster", cm.cluster().name},
              {"cluster_fingerprint", cluster_fingerprint(cm.cluster())},
              {"ratios", p.ratios},
              {"node_segment", p.node_segment},
              {"storage", storage},
              {"instructions", instrs},
              {"predicted_step_s", p.predicted_step_s},
              {"compute_s", p.compute_s},
              {"communication_s", p.communication_s},
              {"hidden_communication_s", p.hidden_communication_s},
              {"shared_latency_s", p.shared_latency_s},
              {"compute_lower_bound_s", cm.compute_lower_bound_s()},
              {"device_compute_s", p.device_compute_s},
              {"device_memory_bytes", p.device_memory_bytes},
              {"synthesis_s", p.synthesis_s}};
  if (std::find(p.recompute.begin(), p.recompute.end(), true) != p.recompute.end()) {
    json r = json::array();
    for (bool b : p.recompute) r.push_back(b);
    out["recompute"] = r;
  }
  if (!p.devices.empty()) {
    // The cost model is the subset's: its devices, in rank order, are the program's.
    json names = json::array();
    for (const synth::Device& d : cm.cluster().devices) names.push_back(d.name);
    out["devices"] = names;
    out["devices_note"] = p.devices_note;
  }
  return out;
}

void save_plan(const std::string& path, const synth::CostModel& cm,
               const synth::DistributedProgram& p) {
  std::ofstream out(path);
  if (out) out << plan_to_json(cm, p).dump(2) << "\n";
  if (out) out.close();
  HAP_CHECK(out.good(), "cannot write the plan to '", path, "': ", std::strerror(errno));
}

namespace {

// A JSON integer in [lo, hi] (no wrap of 2^32 + 35 to 35, no fractions, no strings).
int64_t json_int(const nlohmann::json& v, const std::string& where, int64_t lo, int64_t hi) {
  const std::string range =
      "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (!v.is_number_integer())
    throw ConfigError(where + ": expected " + range + ", got " + v.dump());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    throw ConfigError(where + ": expected " + range + ", got " + v.dump());
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) throw ConfigError(where + ": expected " + range + ", got " + v.dump());
  return x;
}

// A property of a tensor of `rank` dims: R, P or S(d) with 0 <= d < rank.
Prop parse_prop(const nlohmann::json& v, const std::string& where, size_t rank) {
  if (!v.is_string())
    throw ConfigError(where + ": expected a property R, P or S(d), got " + v.dump());
  const std::string s = v.get<std::string>();
  if (s == "R") return Prop::replicated();
  if (s == "P") return Prop::partial();
  if (s.size() > 3 && s.size() < 8 && s.rfind("S(", 0) == 0 && s.back() == ')') {
    const std::string d = s.substr(2, s.size() - 3);
    if (std::all_of(d.begin(), d.end(), ::isdigit)) {
      const int64_t dim = std::stoll(d);
      if (dim < static_cast<int64_t>(rank)) return Prop::sharded(dim);
      throw ConfigError(where + ": " + s + " names dim " + d + " of a tensor with " +
                        std::to_string(rank) + " dims");
    }
  }
  throw ConfigError(where + ": expected a property R, P or S(d), got '" + s + "'");
}

// What each kind of collective turns into what: the executor runs it on these properties only.
bool props_fit(InstrKind k, const Prop& from, const Prop& to) {
  using ops::PropKind;
  switch (k) {
    case InstrKind::AllGather:
      return from.kind == PropKind::Sharded && to.kind == PropKind::Replicated;
    case InstrKind::ReduceScatter:
      return from.kind == PropKind::Partial && to.kind == PropKind::Sharded;
    case InstrKind::AllReduce:
    case InstrKind::GradAllReduce:
      return from.kind == PropKind::Partial && to.kind == PropKind::Replicated;
    case InstrKind::AllToAll:
      return from.kind == PropKind::Sharded && to.kind == PropKind::Sharded && from.dim != to.dim;
    case InstrKind::Slice:
      return from.kind == PropKind::Replicated && to.kind == PropKind::Sharded;
    case InstrKind::Reshard:
      return from.kind == PropKind::Sharded && to == from;
    case InstrKind::ToPartial:
      return from.kind == PropKind::Replicated && to.kind == PropKind::Partial;
    case InstrKind::Update:
      return from == to;
    case InstrKind::Compute:
    case InstrKind::FactorBroadcast:
      return false;
  }
  return false;
}

// Replays what a rank would hold: every computation's inputs and every collective's source must
// be held when it runs (computed, converted, or a leaf read as stored), and the loss must end up
// Partial or Replicated. A plan that fails would stop the executor midway, on every rank.
void check_program(const synth::CostModel& cm, const synth::DistributedProgram& p,
                   const std::string& path) {
  const synth::Graph& g = cm.graph();
  std::vector<std::vector<Prop>> held(g.tensors.size());
  auto holds = [&](int t, const Prop& q) {
    const synth::GraphTensor& gt = g.tensors[static_cast<size_t>(t)];
    if (std::find(held[t].begin(), held[t].end(), q) != held[t].end()) return true;
    if (gt.producer >= 0) return false;
    if (gt.role == synth::TensorRole::Parameter) return p.storage[t] == q;
    return q.kind != ops::PropKind::Partial;  // inputs and constants are read whole or in shards
  };
  auto name = [&](int t) {
    const synth::GraphTensor& gt = g.tensors[static_cast<size_t>(t)];
    return "%" + std::to_string(t) + (gt.name.empty() ? "" : " (" + gt.name + ")");
  };
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const synth::Instruction& in = p.instructions[i];
    const std::string where = path + ": instructions[" + std::to_string(i) + "]";
    if (in.kind == InstrKind::Compute) {
      const synth::GraphNode& n = g.nodes[static_cast<size_t>(in.node)];
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int t = n.inputs[k];
        if (t < 0) continue;
        const Prop q = cm.input_prop(n.id, in.signature, k);
        if (!holds(t, q))
          throw ConfigError(where + ": " + ops::op_name(n.kind) + " (node " + std::to_string(n.id) +
                            ") reads " + name(t) + " as " + q.str() +
                            ", which no earlier instruction makes");
      }
      for (size_t o = 0; o < n.outputs.size(); ++o)
        held[n.outputs[o]].push_back(cm.output_prop(n.id, in.signature, o));
      continue;
    }
    if (in.kind == InstrKind::FactorBroadcast) {
      const synth::GraphNode& n = g.nodes[static_cast<size_t>(in.node)];
      const std::string what = where + ": factor_broadcast at " + ops::op_name(n.kind) + " (node " +
                               std::to_string(n.id) + ")";
      bool computed = false;
      for (size_t j = 0; j < i; ++j)
        computed = computed || (p.instructions[j].kind == InstrKind::Compute &&
                                p.instructions[j].node == in.node &&
                                p.instructions[j].signature == in.signature);
      if (!computed)
        throw ConfigError(what + ": no earlier compute of that node under signature " +
                          std::to_string(in.signature));
      if (!cm.factor_broadcast_allowed(in.node, in.signature))
        throw ConfigError(what + ": its signature " + std::to_string(in.signature) +
                          " does not allow it (it needs a product whose parameters are read "
                          "Replicated, some other input Sharded and nothing Partial)");
      for (int t : n.inputs) {
        if (t < 0 || g.tensors[static_cast<size_t>(t)].role != synth::TensorRole::Parameter)
          continue;
        const auto& readers = g.tensors[static_cast<size_t>(t)].consumers;
        if (!(p.storage[t] == Prop::replicated()) ||
            std::any_of(readers.begin(), readers.end(), [&](int c) { return c != n.id; }))
          throw ConfigError(what + ": parameter " + name(t) +
                            " must be stored R and read by that node alone");
        for (const synth::Instruction& x : p.instructions)
          if (x.kind == InstrKind::GradAllReduce && x.tensor == t)
            throw ConfigError(what + ": parameter " + name(t) +
                              " also has a grad_all_reduce (its gradient would be summed twice)");
      }
      continue;
    }
    if (!props_fit(in.kind, in.from, in.to))
      throw ConfigError(where + ": " + synth::instr_name(in.kind) + " cannot turn " +
                        in.from.str() + " into " + in.to.str());
    const bool param = g.tensors[in.tensor].role == synth::TensorRole::Parameter;
    if ((in.kind == InstrKind::Update || in.kind == InstrKind::GradAllReduce) && !param)
      throw ConfigError(where + ": " + synth::instr_name(in.kind) + " of " + name(in.tensor) +
                        ", which is not a parameter");
    if (in.kind == InstrKind::Update || in.kind == InstrKind::GradAllReduce) continue;
    if (!holds(in.tensor, in.from))
      throw ConfigError(where + ": " + synth::instr_name(in.kind) + " of " + name(in.tensor) +
                        " from " + in.from.str() + ", which no earlier instruction makes");
    held[in.tensor].push_back(in.to);
  }
  if (!holds(g.loss, Prop::partial()) && !holds(g.loss, Prop::replicated()))
    throw ConfigError(path + ": the program never makes the loss (Partial or Replicated)");
}

InstrKind parse_kind(const std::string& s, const std::string& where) {
  for (int k = 0; k <= static_cast<int>(InstrKind::FactorBroadcast); ++k)
    if (s == synth::instr_name(static_cast<InstrKind>(k))) return static_cast<InstrKind>(k);
  throw ConfigError(where + ": unknown instruction kind '" + s + "'");
}

CollectiveMethod parse_method(const std::string& s, const std::string& where) {
  for (auto m : {CollectiveMethod::None, CollectiveMethod::Padded, CollectiveMethod::Grouped,
                 CollectiveMethod::Hierarchical})
    if (s == synth::method_name(m)) return m;
  throw ConfigError(where + ": unknown collective method '" + s + "'");
}

// The JSON of a plan file (size-checked, parsed); ConfigError naming the file otherwise.
nlohmann::json read_plan_json(const std::string& path) {
  if (const std::string why = unreadable_reason(path, kMaxPlanBytes); !why.empty())
    throw ConfigError(path + ": cannot read the plan file: it " + why);
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the plan file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw ConfigError(path + ": not a JSON plan file (" + e.what() + ")");
  }
  return j;
}

}  // namespace

std::vector<int> plan_devices(const std::string& path, const synth::Cluster& cluster) {
  const nlohmann::json j = read_plan_json(path);
  std::vector<int> ranks;
  if (!j.is_object() || !j.contains("devices")) return ranks;
  const nlohmann::json& names = j.at("devices");
  if (!names.is_array() || names.empty())
    throw ConfigError(path + ": devices: expected a non-empty list of device names");
  for (const nlohmann::json& n : names) {
    if (!n.is_string()) throw ConfigError(path + ": devices: expected device names (strings)");
    const std::string name = n.get<std::string>();
    const int rank = device_rank(cluster, name);
    if (rank < 0)
      throw ConfigError(path + ": devices: the cluster '" + cluster.name + "' has no device '" +
                        name + "'");
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
      throw ConfigError(path + ": devices: '" + name + "' is listed twice");
    ranks.push_back(rank);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

synth::DistributedProgram load_plan(const std::string& path, const synth::CostModel& cm) {
  nlohmann::json j = read_plan_json(path);
  try {
    if (j.value("format", "") != "hap-plan-v1")
      throw ConfigError(path +
                        ": format: expected 'hap-plan-v1' (a file written by hap-plan --json)");
    std::string g = graph_fingerprint(cm.graph()), c = cluster_fingerprint(cm.cluster());
    if (j.at("graph_fingerprint") != g)
      throw ConfigError(
          path + ": the plan was made for another model or batch (graph fingerprint " +
          j.at("graph_fingerprint").get<std::string>() + ", this run's is " + g + ")");
    if (j.at("cluster_fingerprint") != c)
      throw ConfigError(path + ": the plan was made for another cluster ('" +
                        j.value("cluster", "?") + "', fingerprint " +
                        j.at("cluster_fingerprint").get<std::string>() + "; this run's '" +
                        cm.cluster().name + "' is " + c + ")");
    synth::DistributedProgram p;
    p.strategy = j.at("strategy").get<std::string>();
    p.ratios = j.at("ratios").get<std::vector<std::vector<double>>>();
    for (size_t s = 0; s < p.ratios.size(); ++s) {
      const auto& r = p.ratios[s];
      std::string where = path + ": ratios[" + std::to_string(s) + "]";
      if (static_cast<int>(r.size()) != cm.num_devices())
        throw ConfigError(where + ": expected " + std::to_string(cm.num_devices()) +
                          " shares, got " + std::to_string(r.size()));
      double sum = 0;
      for (double x : r) {
        if (!(x > 0) || !std::isfinite(x))
          throw ConfigError(where + ": expected positive shares, got " + std::to_string(x));
        sum += x;
      }
      if (std::abs(sum - 1.0) > 1e-6)
        throw ConfigError(where + ": shares sum to " + std::to_string(sum) + ", expected 1");
    }
    const auto& segments = j.at("node_segment");
    if (!segments.is_array() || segments.size() != cm.graph().nodes.size())
      throw ConfigError(path + ": node_segment: expected " +
                        std::to_string(cm.graph().nodes.size()) + " entries");
    const int64_t last_segment = static_cast<int64_t>(p.ratios.size()) - 1;
    for (size_t n = 0; n < segments.size(); ++n)
      p.node_segment.push_back(static_cast<int>(json_int(
          segments[n], path + ": node_segment[" + std::to_string(n) + "]", 0, last_segment)));
    p.storage.assign(cm.graph().tensors.size(), Prop::replicated());
    const auto& storage = j.at("storage");
    for (const synth::GraphTensor& t : cm.graph().tensors)
      if (storage.contains(t.name))
        p.storage[t.id] = parse_prop(storage[t.name], path + ": storage." + t.name, t.shape.size());
    const int64_t last_node = static_cast<int64_t>(cm.graph().nodes.size()) - 1;
    const int64_t last_tensor = static_cast<int64_t>(cm.graph().tensors.size()) - 1;
    int i = 0;
    for (const auto& e : j.at("instructions")) {
      std::string where = path + ": instructions[" + std::to_string(i++) + "]";
      synth::Instruction in;
      in.kind = parse_kind(e.at("kind"), where);
      in.segment = static_cast<int>(json_int(e.at("segment"), where + ".segment", 0, last_segment));
      if (in.kind == InstrKind::Compute || in.kind == InstrKind::FactorBroadcast) {
        in.node = static_cast<int>(json_int(e.at("node"), where + ".node", 0, last_node));
        in.signature =
            static_cast<int>(json_int(e.at("signature"), where + ".signature", -1,
                                      static_cast<int64_t>(cm.signatures(in.node).size()) - 1));
        if (in.kind == InstrKind::FactorBroadcast) {
          in.method = parse_method(e.at("method"), where + ".method");
          if (in.method != CollectiveMethod::Padded && in.method != CollectiveMethod::Grouped)
            throw ConfigError(where +
                              ".method: a factor_broadcast gathers padded or grouped, got " +
                              std::string(synth::method_name(in.method)));
          for (int t : cm.graph().nodes[in.node].inputs)
            if (in.tensor < 0 && t >= 0 &&
                cm.graph().tensors[t].role == synth::TensorRole::Parameter)
              in.tensor = t;
          if (in.tensor < 0)
            throw ConfigError(where + ": factor_broadcast at node " + std::to_string(in.node) +
                              ", which reads no parameter");
        }
      } else {
        in.tensor = static_cast<int>(json_int(e.at("tensor"), where + ".tensor", 0, last_tensor));
        const size_t rank = cm.graph().tensors[in.tensor].shape.size();
        in.from = parse_prop(e.at("from"), where + ".from", rank);
        in.to = parse_prop(e.at("to"), where + ".to", rank);
        in.method = parse_method(e.at("method"), where + ".method");
        if (in.method == CollectiveMethod::Hierarchical) {
          if (in.kind != InstrKind::AllReduce && in.kind != InstrKind::GradAllReduce &&
              in.kind != InstrKind::AllGather && in.kind != InstrKind::ReduceScatter)
            throw ConfigError(where +
                              ".method: only an all_reduce, grad_all_reduce, all_gather or "
                              "reduce_scatter can be hierarchical, this is a " +
                              std::string(synth::instr_name(in.kind)));
          if (!cm.hierarchical_possible())
            throw ConfigError(where +
                              ".method: hierarchical needs several nodes, one of them "
                              "with several devices; the plan's devices of cluster '" +
                              cm.cluster().name + "' are on " +
                              std::to_string(cm.cluster().num_nodes()) + " node(s)");
        }
        // Plans written before every moving collective carried its method: the grouped one ran.
        if (in.method == CollectiveMethod::None &&
            (in.kind == InstrKind::AllReduce || in.kind == InstrKind::AllToAll ||
             in.kind == InstrKind::GradAllReduce))
          in.method = CollectiveMethod::Grouped;
        if (e.contains("regather")) {
          if (!e.at("regather").is_boolean())
            throw ConfigError(where + ".regather: expected true or false");
          in.regather = e.at("regather").get<bool>();
          const synth::GraphTensor& gt = cm.graph().tensors[in.tensor];
          if (in.regather && (in.kind != InstrKind::AllGather ||
                              gt.role != synth::TensorRole::Parameter || gt.producer >= 0))
            throw ConfigError(where +
                              ".regather: only the all_gather of a parameter can be "
                              "gathered again in backward, this is a " +
                              std::string(synth::instr_name(in.kind)) + " of '" + gt.name + "'");
        }
        in.from_segment = e.contains("from_segment")
                              ? static_cast<int>(json_int(e.at("from_segment"),
                                                          where + ".from_segment", 0, last_segment))
                              : in.segment;
      }
      p.instructions.push_back(in);
    }
    if (j.contains("recompute")) {
      const auto& r = j.at("recompute");
      if (!r.is_array() || r.size() != p.ratios.size())
        throw ConfigError(path + ": recompute: expected " + std::to_string(p.ratios.size()) +
                          " booleans, one per segment");
      for (size_t s = 0; s < r.size(); ++s) {
        if (!r[s].is_boolean())
          throw ConfigError(path + ": recompute[" + std::to_string(s) +
                            "]: expected true or false");
        p.recompute.push_back(r[s].get<bool>());
      }
    }
    synth::record_nodes(p, cm.cluster());
    check_program(cm, p, path);
    // Priced as it runs: with the segments it recomputes.
    synth::CostModel priced = cm;
    priced.set_recompute(p.node_segment, p.recompute);
    p.predicted_step_s = synth::recost(priced, p.instructions, p.ratios);
    p.device_memory_bytes = synth::program_memory(priced, p.instructions, p.storage, p.ratios);
    p.device_compute_s = synth::device_compute_times(priced, p.instructions, p.ratios);
    for (const synth::Instruction& x : p.instructions)
      (x.kind == InstrKind::Compute || x.kind == InstrKind::Update ? p.compute_s
                                                                   : p.communication_s) += x.cost_s;
    const synth::StepTime st = synth::step_time(priced, p.instructions);
    p.hidden_communication_s = st.hidden_s;
    p.shared_latency_s = st.shared_latency_s;
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": malformed plan (" + e.what() + ")");
  }
}

}  // namespace hap::train
