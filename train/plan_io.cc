#include "train/plan_io.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

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
  using nlohmann::json;
  json instrs = json::array();
  for (const Instruction& in : p.instructions) {
    json j = {{"kind", synth::instr_name(in.kind)}, {"segment", in.segment}, {"cost_s", in.cost_s}};
    if (in.kind == InstrKind::Compute) {
      j["node"] = in.node;
      j["signature"] = in.signature;
      j["op"] = ops::op_name(cm.graph().nodes[in.node].kind);
      j["module"] = cm.graph().nodes[in.node].module;
    } else {
      j["tensor"] = in.tensor;
      j["from"] = in.from.str();
      j["to"] = in.to.str();
      j["method"] = synth::method_name(in.method);
      j["bytes"] = cm.graph().tensors[in.tensor].bytes();
      if (in.kind == InstrKind::Reshard) j["from_segment"] = in.from_segment;
    }
    instrs.push_back(j);
  }
  json storage = json::object();
  for (const synth::GraphTensor& t : cm.graph().tensors)
    if (t.producer < 0 && !t.name.empty() && t.role != synth::TensorRole::Constant)
      storage[t.name] = p.storage[t.id].str();
  return {{"format", "hap-plan-v1"},
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
          {"compute_lower_bound_s", cm.compute_lower_bound_s()},
          {"device_compute_s", p.device_compute_s},
          {"device_memory_bytes", p.device_memory_bytes},
          {"synthesis_s", p.synthesis_s}};
}

void save_plan(const std::string& path, const synth::CostModel& cm,
               const synth::DistributedProgram& p) {
  std::ofstream out(path);
  if (out) out << plan_to_json(cm, p).dump(2) << "\n";
  if (out) out.close();
  HAP_CHECK(out.good(), "cannot write the plan to '", path, "': ", std::strerror(errno));
}

namespace {

Prop parse_prop(const std::string& s, const std::string& where) {
  if (s == "R") return Prop::replicated();
  if (s == "P") return Prop::partial();
  if (s.size() > 3 && s.rfind("S(", 0) == 0 && s.back() == ')')
    return Prop::sharded(std::stoll(s.substr(2, s.size() - 3)));
  throw ConfigError(where + ": expected a property R, P or S(d), got '" + s + "'");
}

InstrKind parse_kind(const std::string& s, const std::string& where) {
  for (int k = 0; k <= static_cast<int>(InstrKind::Update); ++k)
    if (s == synth::instr_name(static_cast<InstrKind>(k))) return static_cast<InstrKind>(k);
  throw ConfigError(where + ": unknown instruction kind '" + s + "'");
}

CollectiveMethod parse_method(const std::string& s, const std::string& where) {
  for (auto m : {CollectiveMethod::None, CollectiveMethod::Padded, CollectiveMethod::Grouped})
    if (s == synth::method_name(m)) return m;
  throw ConfigError(where + ": unknown collective method '" + s + "'");
}

}  // namespace

synth::DistributedProgram load_plan(const std::string& path, const synth::CostModel& cm) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the plan file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw ConfigError(path + ": not a JSON plan file (" + e.what() + ")");
  }
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
    p.node_segment = j.at("node_segment").get<std::vector<int>>();
    if (p.node_segment.size() != cm.graph().nodes.size())
      throw ConfigError(path + ": node_segment: expected " +
                        std::to_string(cm.graph().nodes.size()) + " entries");
    for (int s : p.node_segment)
      if (s < 0 || s >= static_cast<int>(p.ratios.size()))
        throw ConfigError(path + ": node_segment: segment " + std::to_string(s) + " has no ratios");
    p.storage.assign(cm.graph().tensors.size(), Prop::replicated());
    const auto& storage = j.at("storage");
    for (const synth::GraphTensor& t : cm.graph().tensors)
      if (storage.contains(t.name))
        p.storage[t.id] = parse_prop(storage[t.name], path + ": storage." + t.name);
    int i = 0;
    for (const auto& e : j.at("instructions")) {
      std::string where = path + ": instructions[" + std::to_string(i++) + "]";
      synth::Instruction in;
      in.kind = parse_kind(e.at("kind"), where);
      in.segment = e.at("segment");
      if (in.kind == InstrKind::Compute) {
        in.node = e.at("node");
        in.signature = e.at("signature");
        if (in.node < 0 || in.node >= static_cast<int>(cm.graph().nodes.size()) ||
            in.signature >= static_cast<int>(cm.signatures(in.node).size()))
          throw ConfigError(where + ": node or signature out of range");
      } else {
        in.tensor = e.at("tensor");
        if (in.tensor < 0 || in.tensor >= static_cast<int>(cm.graph().tensors.size()))
          throw ConfigError(where + ": tensor out of range");
        in.from = parse_prop(e.at("from"), where + ".from");
        in.to = parse_prop(e.at("to"), where + ".to");
        in.method = parse_method(e.at("method"), where + ".method");
        // Plans written before every moving collective carried its method: the grouped one ran.
        if (in.method == CollectiveMethod::None &&
            (in.kind == InstrKind::AllReduce || in.kind == InstrKind::AllToAll ||
             in.kind == InstrKind::GradAllReduce))
          in.method = CollectiveMethod::Grouped;
        in.from_segment = e.value("from_segment", in.segment);
      }
      if (in.segment < 0 || in.segment >= static_cast<int>(p.ratios.size()))
        throw ConfigError(where + ": segment out of range");
      p.instructions.push_back(in);
    }
    p.predicted_step_s = synth::recost(cm, p.instructions, p.ratios);
    p.device_memory_bytes = synth::program_memory(cm, p.instructions, p.storage, p.ratios);
    p.device_compute_s.assign(cm.num_devices(), 0.0);
    for (const synth::Instruction& x : p.instructions)
      (x.kind == InstrKind::Compute || x.kind == InstrKind::Update ? p.compute_s
                                                                   : p.communication_s) += x.cost_s;
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(path + ": malformed plan (" + e.what() + ")");
  }
}

}  // namespace hap::train
