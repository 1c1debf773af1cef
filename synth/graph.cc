#include "synth/graph.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "ops/dispatch.h"

namespace hap::synth {

const char* role_name(TensorRole r) {
  switch (r) {
    case TensorRole::Input:
      return "input";
    case TensorRole::Parameter:
      return "param";
    case TensorRole::Constant:
      return "const";
    case TensorRole::Activation:
      return "act";
    case TensorRole::State:
      return "state";
    case TensorRole::Loss:
      return "loss";
  }
  return "?";
}

double Graph::total_flops() const {
  double f = 0;
  for (const GraphNode& n : nodes) f += n.flops;
  return f;
}

int64_t Graph::parameter_count() const {
  int64_t c = 0;
  for (const GraphTensor& t : tensors)
    if (t.role == TensorRole::Parameter) c += shape_numel(t.shape);
  return c;
}

std::vector<int> narrow_order(const Graph& graph) {
  const int n = static_cast<int>(graph.nodes.size());
  // Reads of each tensor still to come, and inputs of each node still to be computed.
  std::vector<int> reads_left(graph.tensors.size(), 0), waiting(n, 0);
  for (const GraphNode& node : graph.nodes)
    for (int t : node.inputs)
      if (t >= 0) {
        ++reads_left[t];
        if (graph.tensors[t].producer >= 0) ++waiting[node.id];
      }
  std::vector<int> ready;  // node ids, kept sorted (ties go to program order)
  for (const GraphNode& node : graph.nodes)
    if (waiting[node.id] == 0) ready.push_back(node.id);
  std::vector<int> order;
  order.reserve(n);
  std::vector<char> live(graph.tensors.size(), 0);  // read before and read again
  auto score = [&](const GraphNode& node) {
    int delta = 0;
    for (int t : node.outputs)
      if (!graph.tensors[t].consumers.empty()) ++delta;
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const int t = node.inputs[k];
      if (t < 0) continue;
      bool seen = false;  // a tensor read twice by this node counts once
      for (size_t j = 0; j < k; ++j) seen = seen || node.inputs[j] == t;
      if (seen) continue;
      int here = 0;
      for (int u : node.inputs) here += u == t;
      const bool last = reads_left[t] == here;
      if (graph.tensors[t].producer < 0) {
        if (!live[t] && !last) ++delta;  // a leaf first read here and again later
        if (live[t] && last) --delta;
      } else if (last) {
        --delta;
      }
    }
    return delta;
  };
  while (!ready.empty()) {
    // A node that adds live tensors runs in program order (pulled forward it would only hold
    // its outputs longer): only nodes that free as many as they add jump the queue.
    size_t best = 0;
    int best_score = std::min(score(graph.nodes[ready[0]]), 1);
    for (size_t i = 1; i < ready.size(); ++i) {
      const int s = score(graph.nodes[ready[i]]);
      if (s < best_score) {
        best = i;
        best_score = s;
      }
    }
    const GraphNode& node = graph.nodes[ready[best]];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    order.push_back(node.id);
    for (int t : node.inputs)
      if (t >= 0 && --reads_left[t] > 0 && graph.tensors[t].producer < 0) live[t] = 1;
    for (int t : node.outputs)
      for (int c : graph.tensors[t].consumers)  // one entry per read
        if (--waiting[c] == 0) ready.insert(std::upper_bound(ready.begin(), ready.end(), c), c);
  }
  HAP_CHECK(static_cast<int>(order.size()) == n, "narrow_order: the graph has a cycle (",
            order.size(), " of ", n, " nodes ordered)");
  return order;
}

std::string Graph::str() const {
  std::ostringstream os;
  auto tensor_str = [&](int id) {
    if (id < 0) return std::string("-");
    const GraphTensor& t = tensors[id];
    std::string s = "%" + std::to_string(id);
    if (!t.name.empty()) s += "(" + t.name + ")";
    return s + ":" + dtype_name(t.dtype) + shape_str(t.shape);
  };
  os << "graph: " << nodes.size() << " nodes, " << tensors.size() << " tensors, "
     << parameter_count() << " parameters, " << std::setprecision(4) << total_flops() / 1e9
     << " GFLOP forward\n";
  for (const GraphTensor& t : tensors)
    if (t.role == TensorRole::Input || t.role == TensorRole::Parameter ||
        t.role == TensorRole::State)
      os << "  " << role_name(t.role) << " " << tensor_str(t.id) << "\n";
  for (const GraphNode& n : nodes) {
    os << "  [" << n.id << "] " << std::left << std::setw(20)
       << (n.module.empty() ? "<top>" : n.module) << " " << std::setw(18) << ops::op_name(n.kind)
       << " ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << tensor_str(n.outputs[i]);
    os << " <- ";
    for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", " : "") << tensor_str(n.inputs[i]);
    std::string a = ops::attrs_str(n.attrs);
    if (!a.empty()) os << "  {" << a << "}";
    os << "  " << std::setprecision(3) << n.flops / 1e6 << " MFLOP\n";
  }
  os << "  loss: " << tensor_str(loss) << "\n";
  return os.str();
}

namespace {
// A node's inputs as the op registry's functions see them (an omitted optional input undefined).
ops::Metas input_metas(const Graph& g, const GraphNode& n) {
  ops::Metas in;
  for (int t : n.inputs)
    in.push_back(t < 0 ? ops::TensorMeta{{}, DType::F32, false}
                       : ops::TensorMeta{g.tensors[t].shape, g.tensors[t].dtype, true});
  return in;
}
}  // namespace

std::vector<ops::ShardSignature> signatures_of(const Graph& g, const GraphNode& n) {
  const ops::OpDef& def = ops::op_def(n.kind);
  if (!def.shard) return {};
  ops::Metas out;
  for (int t : n.outputs) out.push_back({g.tensors[t].shape, g.tensors[t].dtype, true});
  return def.shard(input_metas(g, n), out, n.attrs);
}

std::vector<ops::OwnCollective> own_collectives_of(const Graph& g, const GraphNode& n,
                                                   const ops::ShardSignature& sig) {
  const ops::OpDef& def = ops::op_def(n.kind);
  if (def.own_collectives == nullptr) return {};
  return def.own_collectives(sig, input_metas(g, n), n.attrs);
}

namespace {

class Tracer : public ops::TraceHook {
 public:
  Graph graph;
  std::unordered_map<const TensorImpl*, int> ids;

  int add_leaf(const Tensor& t, const std::string& name, TensorRole role) {
    auto it = ids.find(t.impl());
    if (it != ids.end()) return it->second;
    GraphTensor g;
    g.id = static_cast<int>(graph.tensors.size());
    g.name = name;
    g.shape = t.shape();
    g.dtype = t.dtype();
    g.role = role;
    graph.tensors.push_back(g);
    ids[t.impl()] = g.id;
    return g.id;
  }

  void on_call(ops::OpKind kind, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& outputs, const ops::Attrs& attrs) override {
    GraphNode n;
    n.id = static_cast<int>(graph.nodes.size());
    n.kind = kind;
    n.attrs = attrs;
    n.module = ops::current_scope();
    ops::Metas in_meta, out_meta;
    for (const Tensor& t : inputs) {
      if (!t.defined()) {
        n.inputs.push_back(-1);
        in_meta.push_back({{}, DType::F32, false});
        continue;
      }
      const bool known = ids.count(t.impl()) > 0;
      int id = add_leaf(t, "", TensorRole::Constant);
      if (!known && t.has_storage()) graph.tensors[id].value = t.contiguous().clone();
      graph.tensors[id].consumers.push_back(n.id);
      n.inputs.push_back(id);
      in_meta.push_back({t.shape(), t.dtype(), true});
      n.bytes += static_cast<double>(t.nbytes());
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& t = outputs[i];
      GraphTensor g;
      g.id = static_cast<int>(graph.tensors.size());
      g.shape = t.shape();
      g.dtype = t.dtype();
      g.producer = n.id;
      g.output_index = static_cast<int>(i);
      graph.tensors.push_back(g);
      ids[t.impl()] = g.id;
      n.outputs.push_back(g.id);
      out_meta.push_back({t.shape(), t.dtype(), true});
      n.bytes += static_cast<double>(t.nbytes());
    }
    const ops::OpDef& def = ops::op_def(kind);
    n.flops = def.flops ? def.flops(in_meta, out_meta, attrs) : 0.0;
    graph.nodes.push_back(std::move(n));
  }

  void on_state_update(const Tensor& state, const Tensor& value, double keep,
                       double take) override {
    auto s = ids.find(state.impl());
    HAP_CHECK(s != ids.end() && graph.tensors[s->second].role == TensorRole::State,
              "trace: a running average updates ", state.str(),
              ", which is not one of the model's buffers (register it with register_buffer)");
    auto v = ids.find(value.impl());
    HAP_CHECK(v != ids.end() && graph.tensors[v->second].producer >= 0,
              "trace: the running average of buffer '", graph.tensors[s->second].name,
              "' takes a value no traced op computed");
    for (const StateUpdate& u : graph.state_updates)
      HAP_CHECK(u.state != s->second, "trace: buffer '", graph.tensors[s->second].name,
                "' is updated twice in one forward (a module called twice?)");
    graph.state_updates.push_back({s->second, v->second, keep, take});
  }
};

}  // namespace

Graph trace(const std::function<Tensor()>& forward,
            const std::vector<std::pair<std::string, Tensor>>& parameters,
            const std::vector<std::pair<std::string, Tensor>>& inputs,
            const std::vector<std::pair<std::string, Tensor>>& states) {
  Tracer tracer;
  for (const auto& [name, t] : parameters) tracer.add_leaf(t, name, TensorRole::Parameter);
  for (const auto& [name, t] : inputs) tracer.add_leaf(t, name, TensorRole::Input);
  for (const auto& [name, t] : states) tracer.add_leaf(t, name, TensorRole::State);
  Tensor loss;
  {
    NoGradGuard no_grad;  // tracing records the forward only
    ops::TraceGuard guard(&tracer);
    loss = forward();
  }
  HAP_CHECK(loss.defined() && loss.numel() == 1,
            "trace: the forward function must return a scalar loss, got ",
            loss.defined() ? loss.str() : "an undefined tensor");
  auto it = tracer.ids.find(loss.impl());
  HAP_CHECK(it != tracer.ids.end() && tracer.graph.tensors[it->second].producer >= 0,
            "trace: the loss was not computed by traced ops");
  tracer.graph.loss = it->second;
  tracer.graph.tensors[it->second].role = TensorRole::Loss;
  for (GraphTensor& t : tracer.graph.tensors)
    if (t.role == TensorRole::Constant && t.producer < 0 && t.name.empty())
      t.name = "const" + std::to_string(t.id);
  return std::move(tracer.graph);
}

}  // namespace hap::synth
