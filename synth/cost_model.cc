#include "synth/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "core/split.h"
#include "ops/op.h"

namespace hap::synth {

const char* instr_name(InstrKind k) {
  switch (k) {
    case InstrKind::Compute:
      return "compute";
    case InstrKind::AllGather:
      return "all_gather";
    case InstrKind::ReduceScatter:
      return "reduce_scatter";
    case InstrKind::AllReduce:
      return "all_reduce";
    case InstrKind::AllToAll:
      return "all_to_all";
    case InstrKind::Slice:
      return "slice";
    case InstrKind::Reshard:
      return "reshard";
    case InstrKind::GradAllReduce:
      return "grad_all_reduce";
    case InstrKind::ToPartial:
      return "to_partial";
    case InstrKind::Update:
      return "update";
    case InstrKind::FactorBroadcast:
      return "factor_broadcast";
  }
  return "?";
}

double LinearCost::eval(const std::vector<double>& r) const {
  double m = 0;
  for (size_t d = 0; d < coef.size(); ++d)
    m = std::max(m, coef[d] * r[d] + (d < fixed.size() && r[d] > 0 ? fixed[d] : 0.0));
  return m + constant_s;
}

CostModel::CostModel(const Graph& graph, const Cluster& cluster, int optimizer_state_slots,
                     bool overlap_grad_comm)
    : graph_(graph),
      cluster_(cluster),
      param_state_factor_(2.0 + optimizer_state_slots),
      overlap_grad_comm_(overlap_grad_comm) {
  HAP_CHECK(optimizer_state_slots >= 0, "cost model: optimizer_state_slots must be >= 0, got ",
            optimizer_state_slots);
  std::vector<int> all(cluster.devices.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  link_ = cluster.bottleneck(all);

  requires_grad_.assign(graph.tensors.size(), false);
  bytes_.resize(graph.tensors.size());
  for (const GraphTensor& t : graph.tensors) bytes_[t.id] = static_cast<double>(t.bytes());
  for (const GraphTensor& t : graph.tensors)
    if (t.role == TensorRole::Parameter) {
      requires_grad_[t.id] = true;
      ++num_params_;
    }
  sigs_.resize(graph.nodes.size());
  step_flops_.resize(graph.nodes.size());
  step_bytes_.resize(graph.nodes.size());
  kernel_calls_.resize(graph.nodes.size());
  own_s_.resize(graph.nodes.size());
  const int P = num_devices();
  for (const GraphNode& n : graph.nodes) {
    const ops::OpDef& def = ops::op_def(n.kind);
    int grad_inputs = 0;
    for (int t : n.inputs)
      if (t >= 0 && requires_grad_[t]) ++grad_inputs;
    sigs_[n.id] = signatures_of(graph, n);
    bool differentiable = def.backward != nullptr && grad_inputs > 0;
    if (differentiable)
      for (int t : n.outputs)
        if (is_floating(graph.tensors[t].dtype)) requires_grad_[t] = true;
    // Backward of a product costs one product per input that needs a gradient; other ops about
    // one forward's worth.
    const bool product = def.product;
    double bw = !differentiable ? 0.0 : product ? std::min(grad_inputs, 2) : 1.0;
    step_flops_[n.id] = n.flops * (1.0 + bw);
    // Memory traffic: a backward reads the output gradient and what it saved and writes the
    // input gradients, about twice the forward's bytes.
    step_bytes_[n.id] = n.bytes * (differentiable ? 3.0 : 1.0);
    kernel_calls_[n.id] = differentiable ? 2 : 1;
    // The op's own collectives (executor: ShardContext::all_gather, a grouped all-gather whose
    // backward is a grouped reduce-scatter; sum_over_ranks, a regular all-gather of one value per
    // rank, Communicator::allreduce); those of its backward only where that runs.
    if (def.own_collectives == nullptr || P <= 1) continue;
    for (const ops::ShardSignature& sig : sigs_[n.id]) {
      std::pair<double, double> s{0.0, 0.0};
      for (const ops::OwnCollective& c : own_collectives_of(graph, n, sig)) {
        if (!c.forward && !differentiable) continue;
        const bool gather = c.kind == ops::OwnCollective::Kind::AllGather;
        const Link link =
            link_.for_collective(gather ? Collective::AllGather : Collective::ReduceScatter);
        const CollectiveTerms t =
            collective_terms(gather ? InstrKind::AllGather : InstrKind::ReduceScatter, c.method, P,
                             c.bytes * P, 1.0 / P);
        (c.forward ? s.first : s.second) +=
            t.latency_terms * link.latency_s + t.byte_terms / link.bandwidth_bytes_per_s;
      }
      own_s_[n.id].push_back(s);
    }
  }
}

double CostModel::own_collectives_s(int node, int sig) const {
  if (sig < 0 || own_s_[node].empty()) return 0.0;
  return own_s_[node][sig].first + own_collectives_backward_s(node, sig);
}

double CostModel::own_collectives_backward_s(int node, int sig) const {
  if (sig < 0 || own_s_[node].empty()) return 0.0;
  const auto [forward, backward] = own_s_[node][sig];
  return (recomputed(node) ? forward : 0.0) + backward;
}

int CostModel::step_kernel_calls() const {
  int calls = 0;
  for (const GraphNode& n : graph_.nodes) calls += kernel_calls(n.id);
  return calls;
}

Prop CostModel::input_prop(int node, int sig, size_t input) const {
  return sig < 0 ? Prop::replicated() : sigs_[node][sig].inputs[input];
}
Prop CostModel::output_prop(int node, int sig, size_t output) const {
  return sig < 0 ? Prop::replicated() : sigs_[node][sig].outputs[output];
}
bool CostModel::splits_work(int node, int sig) const {
  if (sig < 0) return false;
  for (const Prop& p : sigs_[node][sig].outputs)
    if (p.kind != PropKind::Replicated) return true;
  return false;
}

LinearCost CostModel::compute(int node, int sig) const {
  LinearCost c;
  if (splits_work(node, sig)) {
    bool overheads = false;
    for (int d = 0; d < num_devices(); ++d) {
      c.coef.push_back(device_compute_s(node, d));
      c.fixed.push_back(fixed_compute_s(node, d));
      overheads = overheads || c.fixed.back() > 0;
    }
    if (!overheads) c.fixed.clear();
    c.constant_s = own_collectives_s(node, sig);
  } else {
    double worst = 0;
    for (int d = 0; d < num_devices(); ++d)
      worst = std::max(worst, device_compute_s(node, d) + fixed_compute_s(node, d));
    c.constant_s = worst + own_collectives_s(node, sig);
  }
  return c;
}

std::pair<int, int64_t> CostModel::split_dim(int node, int sig) const {
  if (!splits_work(node, sig)) return {-1, -1};
  const GraphNode& n = graph_.nodes[node];
  const ops::ShardSignature& s = sigs_[node][sig];
  for (size_t o = 0; o < s.outputs.size(); ++o)
    if (s.outputs[o].kind == PropKind::Sharded) return {n.outputs[o], s.outputs[o].dim};
  for (size_t i = 0; i < s.inputs.size(); ++i)
    if (s.inputs[i].kind == PropKind::Sharded && n.inputs[i] >= 0)
      return {n.inputs[i], s.inputs[i].dim};
  return {-1, -1};
}

namespace {
// Whole-granule shard lengths of a dimension of n elements.
std::vector<int64_t> granular_lengths(int64_t n, const std::vector<double>& r, int64_t granule) {
  if (granule <= 0 || n % granule != 0) granule = 1;
  std::vector<int64_t> l = shard_lengths(n / granule, r);
  for (int64_t& x : l) x *= granule;
  return l;
}
}  // namespace

std::vector<double> CostModel::compute_shares(int node, int sig, const std::vector<double>& r,
                                              int64_t granule) const {
  // Each device computes on whole rows (granules) of the split dimension.
  const auto [tensor, dim] = split_dim(node, sig);
  if (tensor < 0) return r;
  const int64_t extent = graph_.tensors[tensor].shape[dim];
  if (extent <= 0) return r;
  const std::vector<int64_t> lengths = granular_lengths(extent, r, granule);
  std::vector<double> shares(r.size());
  for (size_t d = 0; d < r.size(); ++d)
    shares[d] = static_cast<double>(lengths[d]) / static_cast<double>(extent);
  return shares;
}

double CostModel::compute_s(int node, int sig, const std::vector<double>& r,
                            int64_t granule) const {
  return compute(node, sig).eval(compute_shares(node, sig, r, granule));
}

std::vector<double> CostModel::compute_device_s(int node, int sig, const std::vector<double>& r,
                                                int64_t granule) const {
  std::vector<double> t(static_cast<size_t>(num_devices()));
  if (!splits_work(node, sig)) {
    for (int d = 0; d < num_devices(); ++d)
      t[d] = device_compute_s(node, d) + fixed_compute_s(node, d);
    return t;
  }
  return compute_device_s_at(node, compute_shares(node, sig, r, granule));
}

std::vector<double> CostModel::compute_device_s_at(int node,
                                                   const std::vector<double>& share) const {
  std::vector<double> t(static_cast<size_t>(num_devices()));
  for (int d = 0; d < num_devices(); ++d)
    t[d] = device_compute_s(node, d) * share[d] + (share[d] > 0 ? fixed_compute_s(node, d) : 0.0);
  return t;
}

CollectiveTerms collective_terms(InstrKind kind, CollectiveMethod method, int num_devices,
                                 double bytes, double max_share) {
  CollectiveTerms t;
  const double P = num_devices;
  if (num_devices <= 1) return t;
  const double logp = std::ceil(std::log2(P));
  switch (kind) {
    case InstrKind::AllGather:
    case InstrKind::ReduceScatter:
      // One uneven gather or scatter pass: a ring over shards padded to the largest, or one
      // broadcast/reduce per rank inside a group call.
      if (method == CollectiveMethod::Grouped) {
        t.byte_terms = bytes;
        t.latency_terms = P * logp;
      } else {
        t.byte_terms = (P - 1) * bytes * max_share;
        t.latency_terms = P - 1;
      }
      break;
    case InstrKind::AllReduce:
    case InstrKind::GradAllReduce:  // ring all-reduce
      t.byte_terms = 2.0 * (P - 1) / P * bytes;
      t.latency_terms = 2.0 * (P - 1);
      break;
    case InstrKind::AllToAll:
      t.byte_terms = bytes * max_share;
      t.latency_terms = P - 1;
      break;
    case InstrKind::Slice:
    case InstrKind::ToPartial:
      break;
    case InstrKind::Reshard:
    case InstrKind::Compute:
    case InstrKind::Update:
    case InstrKind::FactorBroadcast:
      HAP_ASSERT(false, "collective_terms() called for ", instr_name(kind));
  }
  return t;
}

LinearCost CostModel::communication(InstrKind kind, int tensor, CollectiveMethod method,
                                    bool regather) const {
  HAP_ASSERT(!regather || kind == InstrKind::AllGather, "only an all-gather is gathered again");
  LinearCost c;
  int P = num_devices();
  if (P <= 1) return c;
  const double B = bytes_[static_cast<size_t>(tensor)];
  bool grad = requires_grad_[tensor];
  // (A parameter's all-gather kept for backward runs in a bucket with the others at the start of
  // the forward pass, and its gradient's reduce-scatter in a bucket of the backward pass,
  // parallel::Executor, yet pays its own latencies here: a share of one bucket's, as a gradient
  // all-reduce pays, made ZeRO storage so cheap in the search, whose pricing has no overlap,
  // that more memory often gave slower plans, Synthesizer.MoreMemoryNeverYieldsASlowerPlan.
  // step_time puts its reduce-scatter on the buckets' channel.)
  // Terms whose bytes scale with the largest share become per-device LP coefficients (the share
  // is r[d]); the rest is constant. Each pass is priced with its own collective's link figures.
  auto add = [&](double times, Collective over) {
    if (method == CollectiveMethod::Hierarchical) {  // (an all-gather's or reduce-scatter's)
      c.constant_s +=
          times *
          hierarchical_time(
              over == Collective::AllGather ? InstrKind::AllGather : InstrKind::ReduceScatter, B)
              .total_s();
      return;
    }
    const Link link = link_.for_collective(over);
    const bool by_share = kind == InstrKind::AllToAll ||
                          ((kind == InstrKind::AllGather || kind == InstrKind::ReduceScatter) &&
                           method != CollectiveMethod::Grouped);
    const CollectiveTerms t = collective_terms(kind, method, P, B, 1.0);
    c.constant_s += times * t.latency_terms * link.latency_s;
    if (by_share) {
      if (c.coef.empty()) c.coef.assign(P, 0.0);
      for (double& x : c.coef) x += times * t.byte_terms / link.bandwidth_bytes_per_s;
    } else {
      c.constant_s += times * t.byte_terms / link.bandwidth_bytes_per_s;
    }
  };
  // Gradients follow the executor's convention (parallel/autograd_collectives.h): the gradient
  // of a Replicated tensor is Partial, of Sharded(d) Sharded(d), of Partial Replicated; every
  // backward is the transpose of its forward.
  switch (kind) {
    case InstrKind::AllGather:  // backward: reduce-scatter of the Partial gradient
      add(regather ? 2 : 1, Collective::AllGather);
      if (grad) add(1, Collective::ReduceScatter);
      break;
    case InstrKind::ReduceScatter:  // backward: all-gather of the Sharded gradient
      add(1, Collective::ReduceScatter);
      if (grad) add(1, Collective::AllGather);
      break;
    case InstrKind::AllReduce:  // backward: all-reduce of the Partial gradient
      if (method == CollectiveMethod::Hierarchical)
        c.constant_s = (grad ? 2 : 1) * all_reduce_time(B, method).total_s();
      else
        add(grad ? 2 : 1, Collective::AllReduce);
      break;
    case InstrKind::AllToAll:  // backward: the reverse all-to-all
      add(grad ? 2 : 1, Collective::AllToAll);
      break;
    case InstrKind::GradAllReduce: {
      // A Replicated parameter's Partial gradient, once per step. The executor sums all of them
      // in one bucketed all-reduce (Executor::backward): each pays its bytes and an equal share
      // of the bucket's latency.
      const AllReduceTime t = all_reduce_time(B, method);
      c.constant_s = t.bytes_s + t.latency_s / std::max(1, num_params_);
      break;
    }
    case InstrKind::Slice:      // local; backward embeds the shard's gradient as a Partial
    case InstrKind::ToPartial:  // local both ways (e.g. a Replicated bias on a Partial sum)
      break;
    case InstrKind::Reshard:
    case InstrKind::Compute:
    case InstrKind::Update:
    case InstrKind::FactorBroadcast:
      HAP_ASSERT(false, "communication() called for ", instr_name(kind));
  }
  return c;
}

bool CostModel::factor_broadcast_allowed(int node, int sig) const {
  const GraphNode& n = graph_.nodes[node];
  const ops::OpDef& def = ops::op_def(n.kind);
  if (!def.product || !def.saves_inputs || def.saves_outputs || num_devices() < 2) return false;
  bool param = false, sharded = false;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int t = n.inputs[k];
    if (t < 0) continue;
    const Prop q = input_prop(node, sig, k);
    if (q.kind == PropKind::Partial) return false;
    if (graph_.tensors[t].role == TensorRole::Parameter) {
      if (q.kind != PropKind::Replicated || !requires_grad_[t]) return false;
      param = true;
    } else {
      sharded = sharded || q.kind == PropKind::Sharded;
    }
  }
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (output_prop(node, sig, o).kind == PropKind::Partial) return false;
  return param && sharded;
}

LinearCost CostModel::factor_broadcast(int node, int sig, CollectiveMethod method) const {
  HAP_ASSERT(factor_broadcast_allowed(node, sig), "factor_broadcast() called for node ", node,
             " under signature ", sig, ", which does not allow it");
  LinearCost c;
  const int P = num_devices();
  const GraphNode& n = graph_.nodes[node];
  const Link link = link_.for_collective(Collective::AllGather);
  auto gather = [&](double bytes) {
    const CollectiveTerms terms = collective_terms(InstrKind::AllGather, method, P, bytes, 1.0);
    c.constant_s += terms.latency_terms * link.latency_s;
    if (method == CollectiveMethod::Grouped) {
      c.constant_s += terms.byte_terms / link.bandwidth_bytes_per_s;
    } else {
      if (c.coef.empty()) c.coef.assign(P, 0.0);
      for (double& x : c.coef) x += terms.byte_terms / link.bandwidth_bytes_per_s;
    }
  };
  // The whole factors: every Sharded input but the parameters, every Sharded output's gradient.
  int products = 0;  // the parameters' gradient products (one forward-sized product each)
  std::vector<std::pair<int, int64_t>> factors;  // (tensor, sharded dim)
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int t = n.inputs[k];
    if (t < 0) continue;
    const Prop q = input_prop(node, sig, k);
    if (graph_.tensors[t].role == TensorRole::Parameter)
      products += k < 2 ? 1 : 0;  // a bias's gradient is a sum, no product
    else if (q.kind == PropKind::Sharded)
      factors.push_back({t, q.dim});
  }
  for (size_t o = 0; o < n.outputs.size(); ++o)
    if (const Prop q = output_prop(node, sig, o); q.kind == PropKind::Sharded)
      factors.push_back({n.outputs[o], q.dim});
  // Factors split along dims of one length (so in shards of one length per rank) and of one
  // dtype travel in one all-gather (the executor packs them side by side), others one each.
  bool together = true;
  for (const auto& [t, dim] : factors)
    together =
        together &&
        graph_.tensors[t].shape[dim] == graph_.tensors[factors[0].first].shape[factors[0].second] &&
        graph_.tensors[t].dtype == graph_.tensors[factors[0].first].dtype;
  if (together) {
    double bytes = 0;
    for (const auto& f : factors) bytes += static_cast<double>(graph_.tensors[f.first].bytes());
    gather(bytes);
  } else {
    for (const auto& f : factors) gather(static_cast<double>(graph_.tensors[f.first].bytes()));
  }
  // Those products over the whole batch on every device, at the slowest (the node's own compute
  // still counts the device's share of them: an overestimate by at most that share).
  double slowest = 0;
  for (const Device& d : cluster_.devices)
    slowest = std::max(slowest, products * n.flops / d.flops_per_s);
  c.constant_s += slowest;
  return c;
}

CollectiveMethod CostModel::best_factor_broadcast(int node, int sig, const std::vector<double>& r,
                                                  double* cost_s) const {
  const double padded = factor_broadcast(node, sig, CollectiveMethod::Padded).eval(r);
  const double grouped = factor_broadcast(node, sig, CollectiveMethod::Grouped).eval(r);
  *cost_s = std::min(padded, grouped);
  return grouped < padded ? CollectiveMethod::Grouped : CollectiveMethod::Padded;
}

double CostModel::device_compute_s(int node, int device) const {
  const Device& d = cluster_.devices[device];
  const GraphNode& n = graph_.nodes[node];
  const bool again = recomputed(node);
  double s = (step_flops_[node] + (again ? n.flops : 0.0)) / d.flops_per_s;
  if (d.memory_bandwidth_bytes_per_s > 0)
    s += (step_bytes_[node] + (again ? n.bytes : 0.0)) / d.memory_bandwidth_bytes_per_s;
  return s;
}

void CostModel::set_recompute(const std::vector<int>& node_segment,
                              const std::vector<bool>& segments) {
  recomputed_.assign(graph_.nodes.size(), false);
  recomputed_segments_ = segments;
  dropped_.assign(graph_.tensors.size(), false);
  dropped_segment_.assign(graph_.tensors.size(), -1);
  bool any = false;
  for (const GraphNode& n : graph_.nodes) {
    const int s = node_segment[static_cast<size_t>(n.id)];
    recomputed_[n.id] = s >= 0 && s < static_cast<int>(segments.size()) && segments[s];
    any = any || recomputed_[n.id];
  }
  if (!any) {
    recomputed_.clear();
    recomputed_segments_.clear();
    dropped_.clear();
    return;
  }
  for (const GraphTensor& t : graph_.tensors) {
    if (t.id == graph_.loss || t.consumers.empty() || !requires_grad_[t.id]) continue;
    int segment = t.producer >= 0 ? node_segment[t.producer] : -2;
    if (t.producer >= 0 && !recomputed_[t.producer]) continue;
    bool inside = true;
    for (int c : t.consumers) {
      if (!recomputed_[c] || (segment >= 0 && node_segment[c] != segment)) inside = false;
      if (segment == -2) segment = node_segment[c];
    }
    if (!inside || segment < 0) continue;
    dropped_[t.id] = true;
    dropped_segment_[t.id] = segment;
  }
}

double CostModel::recompute_factor(const Instruction& in) const {
  if (!segment_recomputed(in.segment)) return 1.0;
  switch (in.kind) {
    case InstrKind::AllGather:
      if (bucketed_parameter_gather(graph_, in)) return 1.0;
      break;
    case InstrKind::ReduceScatter:
    case InstrKind::AllReduce:
    case InstrKind::AllToAll:
    case InstrKind::Reshard:
      break;
    default:  // compute (priced by recomputed()), local, and backward or optimizer instructions
      return 1.0;
  }
  return requires_grad_[static_cast<size_t>(in.tensor)] ? 1.5 : 2.0;
}

LinearCost CostModel::update(int tensor, const Prop& stored) const {
  LinearCost c;
  const double elements = static_cast<double>(shape_numel(graph_.tensors[tensor].shape));
  if (stored.kind == PropKind::Sharded) {
    for (const Device& d : cluster_.devices) c.coef.push_back(elements * d.update_s_per_param);
  } else {
    for (const Device& d : cluster_.devices)
      c.constant_s = std::max(c.constant_s, elements * d.update_s_per_param);
  }
  return c;
}

bool CostModel::hierarchical_possible() const {
  if (cluster_.num_nodes() < 2) return false;
  for (const Node& node : cluster_.nodes)
    if (node.devices.size() >= 2) return true;
  return false;  // one device per node: the hierarchical form is the flat one
}

int CostModel::hierarchy_lanes() const {
  int lanes = num_devices();
  for (const Node& node : cluster_.nodes)
    lanes = std::min(lanes, static_cast<int>(node.devices.size()));
  return lanes;
}

CostModel::AllReduceTime CostModel::all_reduce_time(double bytes, CollectiveMethod method) const {
  AllReduceTime t;
  const int P = num_devices();
  if (P <= 1) return t;
  if (method != CollectiveMethod::Hierarchical) {
    const Link link = link_.for_collective(Collective::AllReduce);
    const CollectiveTerms c =
        collective_terms(InstrKind::AllReduce, CollectiveMethod::Grouped, P, bytes, 1.0);
    t.latency_s = c.latency_terms * link.latency_s;
    t.bytes_s = c.byte_terms / link.bandwidth_bytes_per_s;
    return t;
  }
  HAP_CHECK(hierarchical_possible(),
            "cost model: a hierarchical all-reduce needs several nodes, "
            "one of them with several devices; cluster '",
            cluster_.name, "' has ", cluster_.num_nodes(), " node(s)");
  const int lanes = hierarchy_lanes();
  // Inside each node (the slowest node sets the pace): a reduce-scatter and an all-gather of
  // `lanes` even blocks, priced as the uneven collectives with the largest share 1 / lanes.
  for (Collective phase : {Collective::ReduceScatter, Collective::AllGather}) {
    AllReduceTime slowest;
    for (const Node& node : cluster_.nodes) {
      const Link link = node.link.for_collective(phase);
      const CollectiveTerms c = collective_terms(
          phase == Collective::ReduceScatter ? InstrKind::ReduceScatter : InstrKind::AllGather,
          CollectiveMethod::Padded, static_cast<int>(node.devices.size()), bytes, 1.0 / lanes);
      const AllReduceTime here{c.latency_terms * link.latency_s,
                               c.byte_terms / link.bandwidth_bytes_per_s};
      if (here.total_s() > slowest.total_s()) slowest = here;
    }
    t.latency_s += slowest.latency_s;
    t.bytes_s += slowest.bytes_s;
  }
  // Across nodes: each lane all-reduces its block over one device per node; the lanes share the
  // link out of a node, so together they move what one all-reduce of the whole tensor would.
  const Link across = cluster_.across_lanes().for_collective(Collective::AllReduce);
  const CollectiveTerms c = collective_terms(InstrKind::AllReduce, CollectiveMethod::Grouped,
                                             cluster_.num_nodes(), bytes, 1.0);
  t.latency_s += c.latency_terms * across.latency_s;
  t.bytes_s += c.byte_terms / across.bandwidth_bytes_per_s;
  return t;
}

CostModel::AllReduceTime CostModel::hierarchical_time(InstrKind kind, double bytes) const {
  HAP_ASSERT(kind == InstrKind::AllGather || kind == InstrKind::ReduceScatter,
             "hierarchical_time() called for ", instr_name(kind));
  AllReduceTime t;
  if (num_devices() <= 1) return t;
  HAP_CHECK(hierarchical_possible(), "cost model: a hierarchical ", instr_name(kind),
            " needs several nodes, one of them with several devices; cluster '", cluster_.name,
            "' has ", cluster_.num_nodes(), " node(s)");
  const int lanes = hierarchy_lanes();
  const double P = num_devices();
  // Inside each node (the slowest sets the pace), priced as padded passes at even shares: the
  // node's own block (its devices' part of the tensor) gathered among them, and the lanes'
  // pieces of every node's block, one per lane (the whole tensor, largest share 1 / lanes).
  // Node blocks differ with the ratios; at even shares they are small beside the whole.
  const Collective inside_first =
      kind == InstrKind::AllGather ? Collective::AllGather : Collective::ReduceScatter;
  for (int phase = 0; phase < 2; ++phase) {
    AllReduceTime slowest;
    for (const Node& node : cluster_.nodes) {
      const int s = static_cast<int>(node.devices.size());
      // all-gather: the node's block first, the lanes' pieces last; reduce-scatter: the lanes'
      // pieces first (scattered), the node's block last (gathered).
      const bool block = (phase == 0) == (kind == InstrKind::AllGather);
      const Collective c = phase == 0 ? inside_first : Collective::AllGather;
      const Link link = node.link.for_collective(c);
      const CollectiveTerms terms = collective_terms(
          c == Collective::AllGather ? InstrKind::AllGather : InstrKind::ReduceScatter,
          CollectiveMethod::Padded, s, block ? bytes * s / P : bytes,
          block ? 1.0 / s : 1.0 / lanes);
      const AllReduceTime here{terms.latency_terms * link.latency_s,
                               terms.byte_terms / link.bandwidth_bytes_per_s};
      if (here.total_s() > slowest.total_s()) slowest = here;
    }
    t.latency_s += slowest.latency_s;
    t.bytes_s += slowest.bytes_s;
  }
  // Across nodes: lane j moves piece j of every node's block; the lanes share the link out of a
  // node, so together they move what one pass of the whole tensor over the nodes would.
  const int N = cluster_.num_nodes();
  const Link across = cluster_.across_lanes().for_collective(inside_first);
  const CollectiveTerms c = collective_terms(kind, CollectiveMethod::Padded, N, bytes, 1.0 / N);
  t.latency_s += c.latency_terms * across.latency_s;
  t.bytes_s += c.byte_terms / across.bandwidth_bytes_per_s;
  return t;
}

std::vector<CollectiveMethod> CostModel::gather_methods() const {
  std::vector<CollectiveMethod> m = {CollectiveMethod::Grouped, CollectiveMethod::Padded};
  if (hierarchical_available()) m.push_back(CollectiveMethod::Hierarchical);
  return m;
}

double CostModel::collective_latency_s(InstrKind kind, CollectiveMethod method) const {
  if (num_devices() <= 1) return 0;
  if (kind == InstrKind::GradAllReduce || kind == InstrKind::AllReduce)
    return all_reduce_time(1.0, method).latency_s;
  HAP_ASSERT(kind == InstrKind::AllGather || kind == InstrKind::ReduceScatter,
             "collective_latency_s() called for ", instr_name(kind));
  if (method == CollectiveMethod::Hierarchical) return hierarchical_time(kind, 1.0).latency_s;
  const Link link = link_.for_collective(kind == InstrKind::AllGather ? Collective::AllGather
                                                                      : Collective::ReduceScatter);
  return collective_terms(kind, method, num_devices(), 1.0, 1.0).latency_terms * link.latency_s;
}

CollectiveMethod CostModel::grad_all_reduce_method() const {
  if (!hierarchical_available()) return CollectiveMethod::Grouped;
  const double bucket = static_cast<double>(kGradBucketBytes);
  return all_reduce_time(bucket, CollectiveMethod::Hierarchical).total_s() <
                 all_reduce_time(bucket, CollectiveMethod::Grouped).total_s()
             ? CollectiveMethod::Hierarchical
             : CollectiveMethod::Grouped;
}

CollectiveMethod CostModel::best_method(InstrKind kind, int tensor, const std::vector<double>& r,
                                        double* cost_s) const {
  if (kind == InstrKind::AllReduce && hierarchical_available()) {
    const double flat = communication(kind, tensor, CollectiveMethod::Grouped).eval(r);
    const double hier = communication(kind, tensor, CollectiveMethod::Hierarchical).eval(r);
    *cost_s = std::min(flat, hier);
    return hier < flat ? CollectiveMethod::Hierarchical : CollectiveMethod::Grouped;
  }
  if (kind == InstrKind::GradAllReduce) {
    const CollectiveMethod m = grad_all_reduce_method();
    *cost_s = communication(kind, tensor, m).eval(r);
    return m;
  }
  bool uneven =
      kind == InstrKind::AllGather || kind == InstrKind::ReduceScatter || kind == InstrKind::Slice;
  if (!uneven) {
    // One way to move it (all-reduce of even blocks, all-to-all(v)): the exact sizes, grouped;
    // a local instruction moves nothing.
    *cost_s = communication(kind, tensor, CollectiveMethod::Grouped).eval(r);
    return kind == InstrKind::ToPartial ? CollectiveMethod::None : CollectiveMethod::Grouped;
  }
  // Padded first: it wins ties. A slice (local, its backward a local embedding) has no
  // hierarchical form.
  std::vector<CollectiveMethod> methods = {CollectiveMethod::Padded, CollectiveMethod::Grouped};
  if (kind != InstrKind::Slice && hierarchical_available())
    methods.push_back(CollectiveMethod::Hierarchical);
  CollectiveMethod best = CollectiveMethod::None;
  *cost_s = std::numeric_limits<double>::infinity();
  for (CollectiveMethod m : methods) {
    const double c = communication(kind, tensor, m).eval(r);
    if (c < *cost_s) {
      *cost_s = c;
      best = m;
    }
  }
  return best;
}

double CostModel::reshard_coef(int tensor) const {
  if (num_devices() <= 1) return 0;
  return 2.0 * bytes_[static_cast<size_t>(tensor)] /
         link_.for_collective(Collective::AllGather).bandwidth_bytes_per_s;
}

bool CostModel::reshard_moves(int tensor, int dim, const std::vector<double>& a,
                              const std::vector<double>& b, int64_t granule) const {
  if (a == b) return false;
  const int64_t n = graph_.tensors[tensor].shape[dim];
  return granular_lengths(n, a, granule) != granular_lengths(n, b, granule);
}

double CostModel::reshard_s(int tensor, int dim, const std::vector<double>& a,
                            const std::vector<double>& b, CollectiveMethod* method,
                            int64_t granule) const {
  if (method) *method = CollectiveMethod::None;
  if (!reshard_moves(tensor, dim, a, b, granule)) return 0;
  double cost = 0;
  const CollectiveMethod m = best_method(InstrKind::AllGather, tensor, a, &cost);
  if (method) *method = m;
  return cost;
}

double CostModel::held_bytes(int tensor, const Prop& p, double share) const {
  const double b = bytes_[static_cast<size_t>(tensor)];
  return p.kind == PropKind::Sharded ? b * share : b;
}

double CostModel::compute_lower_bound_s() const {
  double f = 0;
  for (double x : step_flops_) f += x;
  return f / cluster_.total_flops_per_s();
}

double CostModel::backward_fraction(int node) const {
  const GraphNode& n = graph_.nodes[node];
  // Recomputed: the forward again is part of the backward pass, (step + forward) in all.
  const bool again = recomputed(node);
  if (step_flops_[node] > 0)
    return again ? step_flops_[node] / (step_flops_[node] + n.flops)
                 : 1.0 - n.flops / step_flops_[node];
  if (step_bytes_[node] > 0)
    return again ? step_bytes_[node] / (step_bytes_[node] + n.bytes)
                 : 1.0 - n.bytes / step_bytes_[node];
  return 0.0;
}

bool bucketed_parameter_gather(const Graph& graph, const Instruction& in) {
  return in.kind == InstrKind::AllGather && !in.regather && in.to.kind == PropKind::Replicated &&
         in.from.kind == PropKind::Sharded &&
         graph.tensors[static_cast<size_t>(in.tensor)].role == TensorRole::Parameter;
}

bool synchronizes(const CostModel& cm, const Instruction& in) {
  switch (in.kind) {
    case InstrKind::Compute:
    case InstrKind::GradAllReduce:  // overlapped with the backward pass
    case InstrKind::ToPartial:
    case InstrKind::Update:
      return false;
    case InstrKind::Slice:
      return cm.requires_grad(in.tensor);  // its backward gathers the gradient
    default:
      return true;
  }
}

StepTime step_time(const CostModel& cm, const std::vector<Instruction>& instrs) {
  const Graph& graph = cm.graph();
  const size_t n = instrs.size();
  // The forward and backward parts of every instruction, and where each parameter's gradient is
  // complete.
  std::vector<double> forward(n, 0.0), backward(n, 0.0);
  std::vector<size_t> first_use(graph.tensors.size(), n);
  // The forward pass's gather buckets (parallel::Executor: each parameter's first bucketed
  // gather, in program order, one method and dtype per bucket, up to kGatherBucketBytes), each
  // one latency and its members' bytes, and the bucket of each such first gather.
  std::vector<double> gather_bucket_s;
  std::vector<int> gather_bucket(n, -1);
  std::vector<bool> gathered(graph.tensors.size(), false);
  std::optional<std::pair<CollectiveMethod, DType>> open_gather;
  double gather_bytes = 0;
  double updates_s = 0, sum_s = 0;
  for (size_t i = 0; i < n; ++i) {
    const Instruction& in = instrs[i];
    sum_s += in.cost_s;
    switch (in.kind) {
      case InstrKind::GradAllReduce:
        continue;
      case InstrKind::Update:
        updates_s += in.cost_s;
        continue;
      case InstrKind::FactorBroadcast:  // all of it in the node's backward
        backward[i] = in.cost_s;
        break;
      case InstrKind::Compute: {
        // The op's own collectives by their own parts, the rest by the op's backward fraction.
        const double own = cm.own_collectives_s(in.node, in.signature);
        backward[i] = std::max(0.0, in.cost_s - own) * cm.backward_fraction(in.node) +
                      cm.own_collectives_backward_s(in.node, in.signature);
        for (int t : graph.nodes[in.node].inputs)
          if (t >= 0) first_use[t] = std::min(first_use[t], i);
        break;
      }
      default: {
        // A collective's backward adjoint costs about what its forward does; a bucketed
        // parameter gather's (its gradient's reduce-scatter) goes to the buckets below. In a
        // recomputed segment its forward runs again in backward (CostModel::recompute_factor).
        const double factor = cm.recompute_factor(in);
        const double priced = in.cost_s / factor;  // its forward (+ adjoint), once
        const double adjoint = cm.requires_grad(in.tensor) ? 0.5 * priced : 0.0;
        const double again = (factor - 1.0) * priced;  // its forward, run again in backward
        first_use[in.tensor] = std::min(first_use[in.tensor], i);
        if (bucketed_parameter_gather(graph, in)) {
          if (gathered[in.tensor]) {  // (read again from the whole copy)
            forward[i] = in.cost_s - adjoint;
            continue;
          }
          gathered[in.tensor] = true;
          const GraphTensor& p = graph.tensors[in.tensor];
          const double b = static_cast<double>(shape_numel(p.shape)) * dtype_size(p.dtype);
          const double latency = cm.collective_latency_s(InstrKind::AllGather, in.method);
          if (!open_gather || open_gather->first != in.method || open_gather->second != p.dtype ||
              gather_bytes + b > static_cast<double>(kGatherBucketBytes)) {
            open_gather.emplace(in.method, p.dtype);
            gather_bytes = 0;
            gather_bucket_s.push_back(latency);
          }
          gather_bytes += b;
          gather_bucket_s.back() += std::max(0.0, in.cost_s - adjoint - latency);
          gather_bucket[i] = static_cast<int>(gather_bucket_s.size()) - 1;
          continue;
        }
        backward[i] = adjoint + again;
        break;
      }
    }
    forward[i] = in.cost_s - backward[i];
  }
  // The forward pass: with overlap, the gather buckets run one after another from its start
  // while it computes, and an instruction that reads a bucket's parameter first waits for it;
  // without, they run before it.
  double forward_serial_s = 0, forward_s = 0;
  for (double x : forward) forward_serial_s += x;
  for (double x : gather_bucket_s) forward_serial_s += x;
  if (cm.overlap_grad_comm()) {
    // The channel moves while the forward pass computes, and pauses while the forward pass's
    // own collectives hold the link (they come first: the pass waits on them).
    std::vector<double> left = gather_bucket_s;  // each bucket's link time still to go
    size_t next = 0;                             // the bucket the channel is on
    // While the pass computes the channel moves at the link's overlap share of its pace.
    auto channel_runs = [&, pace = cm.overlap()](double dt) {
      dt *= pace;
      for (; next < left.size() && dt > 0; ++next) {
        const double take = std::min(dt, left[next]);
        left[next] -= take;
        dt -= take;
        if (left[next] > 0) return;
      }
    };
    for (size_t i = 0; i < n; ++i) {
      if (gather_bucket[i] >= 0) {  // waits, the link all the channel's
        for (; next <= static_cast<size_t>(gather_bucket[i]); ++next) forward_s += left[next];
        continue;
      }
      if (!synchronizes(cm, instrs[i])) channel_runs(forward[i]);
      forward_s += forward[i];
    }
    for (; next < left.size(); ++next) forward_s += left[next];
  } else {
    forward_s = forward_serial_s;
  }
  // done[i]: when the backward pass has finished instruction i.
  std::vector<double> done(n + 1, 0.0);
  double t = forward_s;
  done[n] = t;
  for (size_t i = n; i-- > 0;) {
    t += backward[i];
    done[i] = t;
  }
  const double backward_end = t;
  // The executor's buckets (parallel::Executor::plan_buckets) on one channel: gradient
  // all-reduces, and the reduce-scatters of bucketed parameter gathers (at each parameter's
  // first gather), filled side by side, one collective, method and dtype per bucket, run in the
  // order the backward pass completes them.
  struct Bucket {
    double ready = 0, cost = 0, bytes = 0;
    CollectiveMethod method = CollectiveMethod::None;
    DType dtype = DType::F32;
    size_t position = 0;  // its earliest member's instruction
  };
  std::vector<Bucket> buckets;
  std::optional<Bucket> filling[2];  // all-reduces, reduce-scatters
  std::vector<size_t> first_gather(graph.tensors.size(), n);
  for (size_t i = n; i-- > 0;)
    if (bucketed_parameter_gather(graph, instrs[i]) && cm.requires_grad(instrs[i].tensor))
      first_gather[instrs[i].tensor] = i;
  for (size_t i = n; i-- > 0;) {
    const Instruction& in = instrs[i];
    const bool gather = in.tensor >= 0 && first_gather[in.tensor] == i;
    if (in.kind != InstrKind::GradAllReduce && !gather) continue;
    const GraphTensor& p = graph.tensors[in.tensor];
    const double bytes = static_cast<double>(shape_numel(p.shape)) * dtype_size(p.dtype);
    std::optional<Bucket>& b = filling[gather ? 1 : 0];
    if (b && (p.dtype != b->dtype || in.method != b->method ||
              b->bytes + bytes > static_cast<double>(kGradBucketBytes))) {
      buckets.push_back(*b);
      b.reset();
    }
    // Each member pays its bytes; the bucket one latency (a collective for all its members).
    const InstrKind kind = gather ? InstrKind::ReduceScatter : InstrKind::GradAllReduce;
    if (!b) {
      b.emplace();
      b->method = in.method;
      b->dtype = p.dtype;
      b->cost = cm.collective_latency_s(kind, in.method);
    }
    b->bytes += bytes;
    const double cost = gather ? 0.5 * in.cost_s - cm.collective_latency_s(kind, in.method)
                               : in.cost_s - cm.grad_all_reduce_latency_share_s(in.method);
    b->cost += std::max(0.0, cost);
    b->ready = std::max(b->ready, done[std::min(first_use[in.tensor], n)]);
    b->position = i;
  }
  for (const auto& b : filling)
    if (b) buckets.push_back(*b);
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const Bucket& a, const Bucket& b) { return a.position > b.position; });
  // The backward pass's own collectives hold the link over these intervals (in time order); the
  // channel runs outside them: the pass waits on its collectives, so they come first.
  std::vector<std::pair<double, double>> busy;
  for (size_t i = n; i-- > 0;)
    if (backward[i] > 0 && synchronizes(cm, instrs[i])) busy.emplace_back(done[i + 1], done[i]);
  size_t k = 0;
  // When a bucket started at `at` with `need` seconds of link time ends. Until the backward pass
  // ends, the channel moves at the link's overlap share of its pace (the devices compute).
  const double pace = cm.overlap();
  auto on_the_link = [&](double at, double need) {
    while (k < busy.size() && busy[k].second <= at) ++k;
    while (need > 0) {
      if (k < busy.size() && busy[k].first <= at) {
        at = busy[k++].second;
        continue;
      }
      double free = k < busy.size() ? busy[k].first - at : std::numeric_limits<double>::infinity();
      double rate = 1.0;
      if (at < backward_end) {
        free = std::min(free, backward_end - at);
        rate = pace;
      }
      if (need >= free * rate) {  // (a pace of 0 waits out the pass)
        need -= free * rate;
        at += free;
      } else {
        at += need / rate;
        need = 0;
      }
    }
    return at;
  };
  double channel = cm.overlap_grad_comm() ? forward_s : backward_end;
  double buckets_s = 0;
  for (const Bucket& b : buckets) {
    channel =
        on_the_link(std::max(channel, cm.overlap_grad_comm() ? b.ready : backward_end), b.cost);
    buckets_s += b.cost;
  }
  StepTime st;
  const double serial_s = backward_end - forward_s + forward_serial_s + buckets_s + updates_s;
  st.step_s = cm.overlap_grad_comm() ? std::max(backward_end, channel) + updates_s : serial_s;
  st.shared_latency_s = sum_s - serial_s;
  if (std::abs(st.shared_latency_s) <= 1e-12 * sum_s) st.shared_latency_s = 0;  // rounding
  st.hidden_s = serial_s - st.step_s;
  if (st.hidden_s <= 1e-12 * sum_s) st.hidden_s = 0;  // rounding, not overlap
  return st;
}

}  // namespace hap::synth
