#include "synth/search.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <queue>
#include <string>
#include <type_traits>
#include <unordered_map>

namespace hap::synth {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

uint32_t bit(const Prop& p) {
  switch (p.kind) {
    case PropKind::Replicated:
      return 1u;
    case PropKind::Partial:
      return 2u;
    case PropKind::Sharded:
      return 4u << p.dim;
  }
  return 0;
}
constexpr uint32_t kShardedBits = ~3u;

Prop prop_of_bit(int b) {
  if (b == 0) return Prop::replicated();
  if (b == 1) return Prop::partial();
  return Prop::sharded(b - 2);
}

struct Live {
  int tensor;
  uint32_t mask;
  int16_t segment;  // whose ratios size its Sharded properties
};

struct State {
  int next = 0;
  double g = 0;
  std::vector<Live> live;   // sorted by tensor
  std::vector<double> mem;  // per device class: held for backward, with the recomputation peak
  // Activation recomputation: what the latest recomputed segment holds again while its backward
  // runs, and the most any has so far (already in mem).
  std::vector<double> again, again_peak;
  int again_segment = -1;
  // The largest parameter copy gathered for use and not kept (gathered again in backward): held
  // only while read, the largest such copy so far (already in mem; empty: none yet).
  std::vector<double> transient_peak;
  int parent = -1;
  int signature = -1;  // of the step into this state; the path is replayed to rebuild the program
};

class Expander {
 public:
  Expander(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
           const std::vector<int>& node_segment, const SearchSpace& space)
      : cm_(cm), g_(cm.graph()), ratios_(ratios), seg_(node_segment), space_(space) {
    if (space.narrow_order) {
      order_ = narrow_order(g_);
    } else {
      for (const GraphNode& n : g_.nodes) order_.push_back(n.id);
    }
    last_use_.assign(g_.tensors.size(), -1);
    linear_weight_.assign(g_.tensors.size(), false);
    expert_weight_.assign(g_.tensors.size(), false);
    for (int pos = 0; pos < static_cast<int>(order_.size()); ++pos)
      for (int t : g_.nodes[order_[pos]].inputs)
        if (t >= 0) last_use_[t] = pos;
    // The node that produced each tensor (-1 for leaves).
    std::vector<int> producer(g_.tensors.size(), -1);
    for (const GraphNode& n : g_.nodes)
      for (int o : n.outputs)
        if (o >= 0) producer[static_cast<size_t>(o)] = n.id;
    for (const GraphNode& n : g_.nodes) {
      const bool product = ops::op_def(n.kind).product;
      // A product's weight: a parameter, directly or through views of it (attention's stacked
      // q, k, v weight is split and reshaped into three [C, C] matrices; casts under mixed
      // precision).
      int w = product && n.inputs.size() > 1 ? n.inputs[1] : -1;
      while (w >= 0 && g_.tensors[w].role != TensorRole::Parameter) {
        const int p = producer[static_cast<size_t>(w)];
        if (p < 0 || !ops::op_def(g_.nodes[p].kind).moves_data || g_.nodes[p].inputs.size() != 1) {
          w = -1;
          break;
        }
        w = g_.nodes[p].inputs[0];
      }
      if (w >= 0) linear_weight_[w] = true;
      if (n.kind == ops::OpKind::MatMul && n.inputs.size() > 1 && n.inputs[1] >= 0 &&
          g_.tensors[n.inputs[1]].role == TensorRole::Parameter &&
          g_.tensors[n.inputs[1]].shape.size() >= 3)
        expert_weight_[n.inputs[1]] = true;
    }
    // Views of parameters (a slice of the position table, attention's q, k and v weights split
    // from their stack): their property follows the parameter's storage through the view op, and
    // collectives happen at the parameter, before the view, never on the view itself (only a
    // local slice). Left free, every view would multiply the properties a state can hold.
    param_view_.assign(g_.tensors.size(), false);
    for (int id : order_) {
      const GraphNode& n = g_.nodes[static_cast<size_t>(id)];
      if (!ops::op_def(n.kind).moves_data || n.inputs.size() != 1 || n.inputs[0] < 0) continue;
      const GraphTensor& in = g_.tensors[static_cast<size_t>(n.inputs[0])];
      if (in.role != TensorRole::Parameter && !param_view_[static_cast<size_t>(in.id)]) continue;
      for (int o : n.outputs)
        if (o >= 0) param_view_[static_cast<size_t>(o)] = true;
    }
    // Of those, the ones a product reads (through more views): a weight or a bias split from a
    // stack. These are never converted themselves; other views (a slice of the position table,
    // an expert bias reshaped to broadcast) may still be sliced locally.
    fixed_view_.assign(g_.tensors.size(), false);
    for (auto it = order_.rbegin(); it != order_.rend(); ++it)
      for (int o : g_.nodes[static_cast<size_t>(*it)].outputs) {
        if (o < 0 || !param_view_[static_cast<size_t>(o)]) continue;
        for (int c : g_.tensors[static_cast<size_t>(o)].consumers) {
          const GraphNode& cn = g_.nodes[static_cast<size_t>(c)];
          if (ops::op_def(cn.kind).product) fixed_view_[static_cast<size_t>(o)] = true;
          for (int u : cn.outputs)
            if (u >= 0 && fixed_view_[static_cast<size_t>(u)])
              fixed_view_[static_cast<size_t>(o)] = true;
        }
      }
    // ZeRO storage: parameters that may be stored Sharded(0) where a node reads them whole, and
    // the positions that read such a parameter first (their steps have two more variants).
    zero_param_.assign(g_.tensors.size(), false);
    regather_param_.assign(g_.tensors.size(), false);
    variants_.assign(order_.size(), 1);
    if (space.zero_storage) {
      std::vector<bool> seen(g_.tensors.size(), false);
      for (int pos = 0; pos < static_cast<int>(order_.size()); ++pos)
        for (int t : g_.nodes[order_[pos]].inputs) {
          if (t < 0 || seen[t]) continue;
          seen[t] = true;
          const GraphTensor& gt = g_.tensors[t];
          if (gt.role != TensorRole::Parameter || !cm.requires_grad(t) || gt.shape.empty() ||
              gt.shape[0] < cm.num_devices() || cm.num_devices() < 2 ||
              !leaf_allows(gt, Prop::sharded(0)))
            continue;
          // Read by a view op (a stack split into q, k and v): gathered at the parameter, and
          // kept (the views of the gathered copy would hold it whatever their readers keep).
          bool viewed = false;
          for (int c : gt.consumers)
            for (int o : g_.nodes[c].outputs) viewed = viewed || (o >= 0 && param_view_[o]);
          zero_param_[t] = true;
          regather_param_[t] = !viewed;
          variants_[pos] = 3;
        }
    }
    // Sufficient factor broadcasting: positions whose node is a product reading parameters that
    // no other node reads (once each); their steps have one more variant, the last.
    factor_pos_.assign(order_.size(), false);
    factor_cost_.assign(g_.nodes.size(), {});
    if (space.factor_broadcast && cm.num_devices() > 1)
      for (int pos = 0; pos < static_cast<int>(order_.size()); ++pos) {
        const GraphNode& n = g_.nodes[order_[pos]];
        const ops::OpDef& def = ops::op_def(n.kind);
        if (!def.product || def.saves_outputs) continue;
        bool params = false, alone = true;
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          const int t = n.inputs[k];
          if (t < 0 || g_.tensors[t].role != TensorRole::Parameter) continue;
          params = true;
          alone = alone && cm.requires_grad(t) &&
                  std::count(n.inputs.begin(), n.inputs.end(), t) == 1 &&
                  std::all_of(g_.tensors[t].consumers.begin(), g_.tensors[t].consumers.end(),
                              [&](int c) { return c == n.id; });
        }
        if (!params || !alone) continue;
        factor_pos_[pos] = true;
        ++variants_[pos];
        // Its price per signature under these ratios (infinity where not allowed), once.
        const std::vector<double>& r = ratios_[seg_[n.id]];
        std::vector<std::pair<double, CollectiveMethod>>& costs = factor_cost_[n.id];
        for (int sig = -1; sig < static_cast<int>(cm.signatures(n.id).size()); ++sig) {
          std::pair<double, CollectiveMethod> c{kInf, CollectiveMethod::None};
          if (cm.factor_broadcast_allowed(n.id, sig))
            c.second = cm.best_factor_broadcast(n.id, sig, r, &c.first);
          costs.push_back(c);
        }
      }
    // Devices with the same memory and the same share in every segment use memory alike: the
    // search tracks one value per such class instead of one per device.
    std::map<std::vector<double>, int> classes;
    const auto& devs = cm.cluster().devices;
    for (size_t d = 0; d < devs.size(); ++d) {
      std::vector<double> k = {static_cast<double>(devs[d].memory_bytes)};
      for (const auto& r : ratios) k.push_back(r[d]);
      auto [it, inserted] = classes.try_emplace(k, static_cast<int>(rep_.size()));
      if (inserted) {
        rep_.push_back(static_cast<int>(d));
        limit_.push_back(static_cast<double>(devs[d].memory_bytes));
      }
    }
    // Compute costs under these ratios, per node and signature (index 0 is all-Replicated).
    compute_cost_.resize(g_.nodes.size());
    for (const GraphNode& n : g_.nodes) {
      const std::vector<double>& r = ratios_[seg_[n.id]];
      for (int sig = -1; sig < static_cast<int>(cm.signatures(n.id).size()); ++sig)
        compute_cost_[n.id].push_back(cm.compute_s(n.id, sig, r));
    }
  }

  State initial() const {
    State s;
    s.mem.assign(limit_.size(), 0.0);
    return s;
  }

  // The state after running the node at position parent.next under signature sig, or false if
  // not allowed. sig encodes the node's signature and, where the node reads first a parameter
  // that may be stored sharded (zero_param_), a variant (see num_signatures): 0 stored as read,
  // 1 stored Sharded(0) and all-gathered (the copy kept for backward), 2 the same gathered again
  // in backward (for those of regather_param_; the others stored as read); at a factor_pos_
  // position the last variant stores its parameters Replicated and broadcasts the factors of
  // their gradients instead of all-reducing them.
  bool step(const State& parent, int sig, State& child) const {
    const int pos = parent.next;
    const GraphNode& n = g_.nodes[order_[pos]];
    int seg = seg_[n.id];
    const int nsig = static_cast<int>(cm_.signatures(n.id).size());
    const int variant = (sig + 1) / (nsig + 1);
    sig = (sig + 1) % (nsig + 1) - 1;
    bool zero_used = false;
    // The last variant of a factor_pos_ position: sufficient factor broadcasting.
    const bool factors = factor_pos_[pos] && variant > 0 && variant == variants_[pos] - 1;
    if (factors && factor_cost_[n.id][sig + 1].first == kInf) return false;  // not allowed
    const std::vector<double>& r = ratios_[seg];
    child.next = parent.next + 1;
    child.g = parent.g;
    child.live = parent.live;
    child.mem = parent.mem;
    child.again = parent.again;
    child.again_peak = parent.again_peak;
    child.again_segment = parent.again_segment;
    child.transient_peak = parent.transient_peak;
    instrs_.clear();
    stored_.clear();

    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int t = n.inputs[k];
      if (t < 0) continue;
      Prop q = cm_.input_prop(n.id, sig, k);
      if (q.kind == PropKind::Sharded && g_.tensors[t].shape[q.dim] < 2) return false;
      Live* L = find(child.live, t);
      Live single{};
      bool stored_here =
          std::any_of(stored_.begin(), stored_.end(), [t](const auto& e) { return e.first == t; });
      if (!L && stored_here) {
        // A leaf read twice by this node: the first read stored it.
        for (const auto& [st, sp] : stored_)
          if (st == t) single = {t, bit(sp), static_cast<int16_t>(seg)};
        L = &single;
        if (!(L->mask & bit(q)) && !convert(*L, q, seg, child)) return false;
      } else if (!L) {
        const GraphTensor& gt = g_.tensors[t];
        HAP_ASSERT(gt.producer < 0, "tensor %", t, " used before it is produced");
        // A leaf wanted as a Partial is stored Replicated and handed on by a local to_partial.
        Prop want = q;
        if (q.kind == PropKind::Partial) q = Prop::replicated();
        if (!leaf_allows(gt, q)) return false;
        if (variant > 0 && !factors && want.kind == PropKind::Replicated && zero_param_[t] &&
            (variant == 1 || regather_param_[t])) {
          q = Prop::sharded(0);  // ZeRO storage: gathered below
          zero_used = true;
        } else if (space_.zero_storage_everywhere && want.kind == PropKind::Replicated &&
                   zero_param_[t]) {
          return false;  // every parameter read whole is stored sharded
        }
        stored_.push_back({t, q});
        if (q.kind == PropKind::Replicated && cm_.requires_grad(t) &&
            !(factors && gt.role == TensorRole::Parameter)) {
          // Every rank's copy collects a Partial gradient: one all-reduce per step (with factors
          // broadcast, the gradient is whole on every rank).
          Instruction in;
          in.kind = InstrKind::GradAllReduce;
          in.tensor = t;
          in.from = Prop::partial();
          in.to = Prop::replicated();
          in.segment = seg;
          in.method = cm_.grad_all_reduce_method();  // the executor's bucketed all-reduce
          in.cost_s = cm_.communication(InstrKind::GradAllReduce, t, in.method).eval(r);
          child.g += in.cost_s;
          instrs_.push_back(in);
        }
        if (gt.role == TensorRole::Parameter) {
          // Its optimizer step, on what each device stores.
          Instruction in;
          in.kind = InstrKind::Update;
          in.tensor = t;
          in.from = in.to = q;
          in.segment = seg;
          in.cost_s = cm_.update(t, q).eval(r);
          child.g += in.cost_s;
          instrs_.push_back(in);
        }
        double factor = gt.role == TensorRole::Parameter ? cm_.param_state_factor() : 1.0;
        for (size_t c = 0; c < child.mem.size(); ++c)
          child.mem[c] += factor * cm_.held_bytes(t, q, r[rep_[c]]);
        single = {t, bit(q), static_cast<int16_t>(seg)};
        if (last_use_[t] > pos) {
          insert(child.live, single);
          L = find(child.live, t);
        } else {
          L = &single;
        }
        if (!(want == q) && !convert(*L, want, seg, child, zero_used && variant == 2)) return false;
      } else if (!(L->mask & bit(q)) || (q.kind == PropKind::Sharded && L->segment != seg)) {
        if (!convert(*L, q, seg, child)) return false;
      }
    }

    if (variant > 0 && !zero_used && !factors) return false;  // the same as variant 0

    Instruction c;
    c.kind = InstrKind::Compute;
    c.node = n.id;
    c.signature = sig;
    c.segment = seg;
    c.cost_s = compute_cost_[n.id][sig + 1];
    child.g += c.cost_s;
    instrs_.push_back(c);
    if (factors) {
      Instruction f;
      f.kind = InstrKind::FactorBroadcast;
      f.node = n.id;
      f.signature = sig;
      f.segment = seg;
      for (int t : n.inputs)
        if (f.tensor < 0 && t >= 0 && g_.tensors[t].role == TensorRole::Parameter) f.tensor = t;
      f.cost_s = factor_cost_[n.id][sig + 1].first;
      f.method = factor_cost_[n.id][sig + 1].second;
      child.g += f.cost_s;
      instrs_.push_back(f);
    }

    for (size_t o = 0; o < n.outputs.size(); ++o) {
      int t = n.outputs[o];
      Prop p = cm_.output_prop(n.id, sig, o);
      if (cm_.kept_for_backward(t)) {
        for (size_t c = 0; c < child.mem.size(); ++c)
          child.mem[c] += cm_.held_bytes(t, p, r[rep_[c]]);
      } else {
        hold_again(child, t, p, r);
      }
      if (!g_.tensors[t].consumers.empty())
        insert(child.live, {t, bit(p), static_cast<int16_t>(seg)});
    }
    for (int t : n.inputs)
      if (t >= 0 && last_use_[t] == pos) erase(child.live, t);
    bool fits = true;
    for (size_t c = 0; c < limit_.size(); ++c) {
      // What it holds, plus what the nodes still to run must add whatever their signatures:
      // over the limit, no completion of this state fits.
      const double to_come = mem_min_suffix_.empty() ? 0.0 : mem_min_suffix_[child.next][c];
      double excess = child.mem[c] + to_come - limit_[c];
      if (excess <= 0) continue;
      if (fits) {
        const double f = child.g + (h_const_.empty() ? 0.0 : heuristic(child));
        min_overflow_f_ = std::min(min_overflow_f_, f);
      }
      fits = false;
      // Remember the smallest shortfall seen: the program closest to fitting names the device.
      if (over_device_ < 0 || excess < over_) {
        over_ = excess;
        over_device_ = rep_[c];
      }
    }
    return fits;
  }

  // A lower bound of what the rest of the program costs from state s (admissible: never more
  // than the cheapest completion). The nodes still to run are covered by chains (paths along
  // which one node's output is the next one's input); a chain not yet started costs at least
  // its best run (each node's computation, the leaves it reads first, the conversions between
  // consecutive nodes, by shortest conversion path), and a chain under way at least its best
  // run from the properties its next input holds in s. Other conversions count as free. Not
  // always consistent, which the search allows for: a state reached again more cheaply is
  // expanded again.
  double heuristic(const State& s) const {
    double h = h_const_[s.next];
    for (const auto& [node, tensor] : in_progress_[s.next]) {
      const Live* L = find_const(s.live, tensor);
      HAP_ASSERT(L, "a chain's input %", tensor, " is not live");
      double best = kInf;
      const std::vector<double>& v = chain_value_[node];
      for (int b = 0; b < static_cast<int>(v.size()); ++b)
        if (L->mask & (1u << b)) best = std::min(best, v[b]);
      h += best;
    }
    return h;
  }

  void prepare_heuristic() {
    const int N = static_cast<int>(g_.nodes.size());
    std::vector<int> pos(N);
    for (int i = 0; i < N; ++i) pos[order_[i]] = i;
    // Tensors' possible segments: where produced, and where each reader may move its shards.
    std::vector<std::vector<int>> segs(g_.tensors.size());
    auto add_seg = [&](int t, int sg) {
      if (std::find(segs[t].begin(), segs[t].end(), sg) == segs[t].end()) segs[t].push_back(sg);
    };
    for (const GraphNode& n : g_.nodes) {
      for (int t : n.inputs)
        if (t >= 0) add_seg(t, seg_[n.id]);
      for (int t : n.outputs) add_seg(t, seg_[n.id]);
    }
    // Cheapest conversion path between two properties of a tensor (Floyd-Warshall over R, P and
    // S(d)), each conversion at its cheapest over the tensor's segments; moving shards between
    // segments counts as free.
    auto conversions = [&](int t) {
      const int P = 2 + static_cast<int>(g_.tensors[t].shape.size());
      std::vector<double> d(static_cast<size_t>(P * P), kInf);
      auto edge = [&](int a, int b, InstrKind kind) {
        double best = kInf;
        for (int sg : segs[t]) {
          double c = 0;
          best_method(kind, t, sg, &c);
          best = std::min(best, c);
        }
        d[a * P + b] = std::min(d[a * P + b], best);
      };
      for (int a = 0; a < P; ++a) d[a * P + a] = 0;
      if (fixed_view_[static_cast<size_t>(t)]) return d;  // never converted (convert, below)
      if (param_view_[static_cast<size_t>(t)]) {          // only sliced locally
        if (space_.allow_slice)
          for (int a = 2; a < P; ++a) edge(0, a, InstrKind::Slice);
        return d;
      }
      for (int a = 2; a < P; ++a) {
        if (space_.allow_activation_all_gather || g_.tensors[t].role == TensorRole::Parameter)
          edge(a, 0, InstrKind::AllGather);
        if (space_.allow_slice) edge(0, a, InstrKind::Slice);
        if (space_.allow_reduce_scatter) edge(1, a, InstrKind::ReduceScatter);
        if (space_.allow_all_to_all)
          for (int b = 2; b < P; ++b)
            if (b != a) edge(a, b, InstrKind::AllToAll);
      }
      edge(1, 0, InstrKind::AllReduce);
      if (g_.tensors[t].role == TensorRole::Parameter) edge(0, 1, InstrKind::ToPartial);
      for (int k = 0; k < P; ++k)
        for (int a = 0; a < P; ++a)
          for (int b = 0; b < P; ++b)
            d[a * P + b] = std::min(d[a * P + b], d[a * P + k] + d[k * P + b]);
      return d;
    };
    auto prop_index = [](const Prop& p) {
      return p.kind == PropKind::Replicated ? 0 : p.kind == PropKind::Partial ? 1 : 2 + p.dim;
    };
    // What node n costs at least under signature sig, without its chain input's conversion:
    // its computation and the leaves it reads first (stored as read: Replicated ones with their
    // gradient all-reduce, parameters with their update). Infinity where step() refuses sig.
    std::vector<int> first_read(g_.tensors.size(), -1);
    for (int i = N - 1; i >= 0; --i)
      for (int t : g_.nodes[order_[i]].inputs)
        if (t >= 0) first_read[t] = i;
    auto own_cost = [&](const GraphNode& n, int sig) {
      const std::vector<double>& r = ratios_[seg_[n.id]];
      double c = compute_cost_[n.id][sig + 1];
      // The parameters' storage, as read or (factor_pos_) with factors broadcast: the cheaper.
      double params = 0, params_factors = kInf;
      if (factor_pos_[pos[n.id]] && factor_cost_[n.id][sig + 1].first < kInf) {
        params_factors = factor_cost_[n.id][sig + 1].first;
        for (int t : n.inputs)
          if (t >= 0 && g_.tensors[t].role == TensorRole::Parameter)
            params_factors += cm_.update(t, Prop::replicated()).eval(r);
      }
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int t = n.inputs[k];
        if (t < 0) continue;
        Prop q = cm_.input_prop(n.id, sig, k);
        const GraphTensor& gt = g_.tensors[t];
        if (q.kind == PropKind::Sharded && gt.shape[q.dim] < 2) return kInf;
        if (gt.producer >= 0 || first_read[t] != pos[n.id]) continue;
        bool earlier = false;  // the node's first read of it stores it
        for (size_t j = 0; j < k; ++j) earlier = earlier || n.inputs[j] == t;
        if (earlier) continue;
        const bool partial = q.kind == PropKind::Partial;
        if (partial) q = Prop::replicated();
        if (!leaf_allows(gt, q)) return kInf;
        double store = 0;
        if (q.kind == PropKind::Replicated && cm_.requires_grad(t))
          store +=
              cm_.communication(InstrKind::GradAllReduce, t, cm_.grad_all_reduce_method()).eval(r);
        if (gt.role == TensorRole::Parameter) store += cm_.update(t, q).eval(r);
        if (!partial && zero_param_[t]) {  // or stored Sharded(0) and gathered (step's variants)
          double gather = 0;
          best_method(InstrKind::AllGather, t, seg_[n.id], &gather);
          store = std::min(store, gather + cm_.update(t, Prop::sharded(0)).eval(r));
        }
        (gt.role == TensorRole::Parameter ? params : c) += store;
        if (partial) {
          double p = 0;
          best_method(InstrKind::ToPartial, t, seg_[n.id], &p);
          c += p;
        }
      }
      return c + std::min(params, params_factors);
    };
    // Chains: link a node to a reader of one of its outputs, heaviest tensors first (their
    // conversions cost most), each node with at most one successor and one predecessor.
    struct Link {
      double weight;
      int from, to, tensor;
    };
    std::vector<Link> links;
    for (const GraphNode& n : g_.nodes)
      for (int t : n.outputs)
        for (int c : g_.tensors[t].consumers) {
          // A parameter's view is no activation to chain (it is never converted, and linking a
          // product to it would cut the product from the activations that reach it).
          if (param_view_[static_cast<size_t>(t)]) continue;
          double out = 0;
          for (int u : g_.nodes[c].outputs)
            out = std::max(out, static_cast<double>(g_.tensors[u].bytes()));
          links.push_back({static_cast<double>(g_.tensors[t].bytes()) + 1e-3 * out, n.id, c, t});
        }
    std::stable_sort(links.begin(), links.end(),
                     [](const Link& a, const Link& b) { return a.weight > b.weight; });
    std::vector<int> succ(N, -1), pred(N, -1), via(N, -1);  // via[v]: tensor from pred[v]
    for (const Link& l : links)
      if (succ[l.from] < 0 && pred[l.to] < 0) {
        succ[l.from] = l.to;
        pred[l.to] = l.from;
        via[l.to] = l.tensor;
      }
    // Each chain's best run, from its tail back: chain_value_[v][p] for a node v with a
    // predecessor is the least cost of v and the rest of its chain when v's chain input holds
    // property p; a chain's head gets one figure.
    chain_value_.assign(N, {});
    std::vector<double> head_value(N, kInf);
    std::vector<int> heads;
    for (int i = 0; i < N; ++i)
      if (pred[order_[i]] < 0) heads.push_back(order_[i]);
    for (int head : heads) {
      std::vector<int> chain;
      for (int v = head; v >= 0; v = succ[v]) chain.push_back(v);
      for (int i = static_cast<int>(chain.size()) - 1; i >= 0; --i) {
        const GraphNode& n = g_.nodes[chain[i]];
        const int next = i + 1 < static_cast<int>(chain.size()) ? chain[i + 1] : -1;
        int out_slot = -1;  // which output of n the next node reads
        if (next >= 0)
          for (size_t o = 0; o < n.outputs.size(); ++o)
            if (n.outputs[o] == via[next]) out_slot = static_cast<int>(o);
        int in_slot = -1;  // where n reads its chain input
        if (i > 0)
          for (size_t k = 0; k < n.inputs.size() && in_slot < 0; ++k)
            if (n.inputs[k] == via[n.id]) in_slot = static_cast<int>(k);
        const int in_props = i > 0 ? 2 + static_cast<int>(g_.tensors[via[n.id]].shape.size()) : 1;
        const std::vector<double> conv = i > 0 ? conversions(via[n.id]) : std::vector<double>();
        std::vector<double> value(static_cast<size_t>(in_props), kInf);
        for (int sig = -1; sig < static_cast<int>(cm_.signatures(n.id).size()); ++sig) {
          double c = own_cost(n, sig);
          if (c == kInf) continue;
          if (next >= 0) c += chain_value_[next][prop_index(cm_.output_prop(n.id, sig, out_slot))];
          if (i == 0) {
            value[0] = std::min(value[0], c);
            continue;
          }
          const int q = prop_index(cm_.input_prop(n.id, sig, static_cast<size_t>(in_slot)));
          for (int p = 0; p < in_props; ++p)
            value[p] = std::min(value[p], c + conv[static_cast<size_t>(p * in_props + q)]);
        }
        if (i == 0)
          head_value[n.id] = value[0];
        else
          chain_value_[n.id] = std::move(value);
      }
    }
    // h at position i: the heads of chains not started, plus the chains under way there.
    h_const_.assign(N + 1, 0.0);
    for (int i = N - 1; i >= 0; --i)
      h_const_[i] = h_const_[i + 1] + (pred[order_[i]] < 0 ? head_value[order_[i]] : 0.0);
    in_progress_.assign(N + 1, {});
    for (int v = 0; v < N; ++v)
      if (pred[v] >= 0)
        for (int i = pos[pred[v]] + 1; i <= pos[v]; ++i) in_progress_[i].push_back({v, via[v]});
    // A lower bound of the memory nodes i.. must still add on each device class: per node, the
    // least over its signatures of the leaves it stores first and the outputs it keeps for the
    // backward pass (conversions, which may add more, count as nothing).
    mem_min_suffix_.assign(N + 1, std::vector<double>(limit_.size(), 0.0));
    for (int i = N - 1; i >= 0; --i) {
      const GraphNode& n = g_.nodes[order_[i]];
      const std::vector<double>& r = ratios_[seg_[n.id]];
      std::vector<double> least(limit_.size(), kInf);
      for (int sig = -1; sig < static_cast<int>(cm_.signatures(n.id).size()); ++sig) {
        if (own_cost(n, sig) == kInf) continue;  // a signature step() refuses
        std::vector<double> add(limit_.size(), 0.0);
        for (size_t k = 0; k < n.inputs.size(); ++k) {
          const int t = n.inputs[k];
          if (t < 0 || g_.tensors[t].producer >= 0 || first_read[t] != i) continue;
          bool earlier = false;
          for (size_t j = 0; j < k; ++j) earlier = earlier || n.inputs[j] == t;
          if (earlier) continue;
          Prop q = cm_.input_prop(n.id, sig, k);
          if (q.kind == PropKind::Replicated && zero_param_[t])
            q = Prop::sharded(0);  // stored as a shard, gathered again in backward: the least
          if (q.kind == PropKind::Partial) q = Prop::replicated();
          const double factor =
              g_.tensors[t].role == TensorRole::Parameter ? cm_.param_state_factor() : 1.0;
          for (size_t c = 0; c < add.size(); ++c)
            add[c] += factor * cm_.held_bytes(t, q, r[rep_[c]]);
        }
        for (size_t o = 0; o < n.outputs.size(); ++o)
          if (cm_.kept_for_backward(n.outputs[o]))
            for (size_t c = 0; c < add.size(); ++c)
              add[c] += cm_.held_bytes(n.outputs[o], cm_.output_prop(n.id, sig, o), r[rep_[c]]);
        for (size_t c = 0; c < add.size(); ++c) least[c] = std::min(least[c], add[c]);
      }
      for (size_t c = 0; c < least.size(); ++c)
        mem_min_suffix_[i][c] = mem_min_suffix_[i + 1][c] + (least[c] == kInf ? 0.0 : least[c]);
    }
    // An upper bound of the memory that nodes i.. can still add on any device, whatever their
    // signatures: every input stored (a leaf) and converted once, every output held whole.
    mem_suffix_.assign(g_.nodes.size() + 1, 0.0);
    for (int i = static_cast<int>(g_.nodes.size()) - 1; i >= 0; --i) {
      const GraphNode& n = g_.nodes[order_[i]];
      double add = 0;
      for (int t : n.inputs) {
        if (t < 0) continue;
        const double b = static_cast<double>(g_.tensors[t].bytes());
        if (g_.tensors[t].producer < 0)
          add += (g_.tensors[t].role == TensorRole::Parameter ? cm_.param_state_factor() : 1.0) * b;
        // (An upper bound: a copy a recomputed segment does not keep may still raise the
        // largest segment held again by as much.)
        if (cm_.requires_grad(t)) add += b;
      }
      for (int t : n.outputs)
        if (cm_.requires_grad(t)) add += static_cast<double>(g_.tensors[t].bytes());
      mem_suffix_[i] = mem_suffix_[i + 1] + add;
    }
  }

  // Whether state a makes state b (the same memo key: the same node and live properties, so the
  // same completions) unnecessary: a costs no more, and on every device either uses no more
  // memory than b or cannot run out of memory whatever follows. Every completion of b that fits
  // then completes a, at no more cost, within memory.
  bool covers(const State& a, const State& b) const {
    if (a.g > b.g) return false;
    // Per device class: a holds no more than b there, or cannot run out there whatever follows.
    const double to_come = mem_suffix_[a.next];
    for (size_t c = 0; c < a.mem.size(); ++c)
      if (a.mem[c] > b.mem[c] && a.mem[c] + to_come > limit_[c]) return false;
    return true;
  }

  // Signatures of the node at a position of the visiting order.
  // What a device class holds whatever the program: the leaves this space lets it store only
  // Replicated (parameters with their gradients and optimizer state). When that alone exceeds a
  // device's memory no program fits, and the search need not run to find it out.
  std::string replicated_leaves_overflow() const {
    std::vector<double> held(limit_.size(), 0.0);
    for (const GraphTensor& t : g_.tensors) {
      if (t.producer >= 0 || t.consumers.empty()) continue;
      if (leaf_allows(t, Prop::sharded(0)) ||
          (t.shape.size() > 1 && leaf_allows(t, Prop::sharded(1))))
        continue;
      bool other_dim = false;
      for (size_t d = 2; d < t.shape.size(); ++d)
        other_dim = other_dim || leaf_allows(t, Prop::sharded(static_cast<int>(d)));
      if (other_dim) continue;
      const double factor = t.role == TensorRole::Parameter ? cm_.param_state_factor() : 1.0;
      for (size_t c = 0; c < held.size(); ++c)
        held[c] += factor * cm_.held_bytes(t.id, Prop::replicated(), 1.0);
    }
    for (size_t c = 0; c < held.size(); ++c) {
      if (held[c] <= limit_[c]) continue;
      const Device& dev = cm_.cluster().devices[rep_[c]];
      return "the parameters and inputs this strategy keeps whole on every device need " +
             std::to_string(static_cast<int64_t>(held[c])) +
             " bytes with their gradients and optimizer state, more than the " +
             std::to_string(dev.memory_bytes) + " bytes of device " + std::to_string(rep_[c]) +
             " (" + dev.name + ", " + dev.type + ")";
    }
    return "";
  }

  // The choices at a position, as signatures -1 .. num_signatures - 1: the node's own, once per
  // storage variant (step() decodes them).
  int num_signatures(int pos) const {
    return (static_cast<int>(cm_.signatures(order_[pos]).size()) + 1) * variants_[pos] - 1;
  }
  int num_nodes() const { return static_cast<int>(g_.nodes.size()); }
  // Lifts every device's memory limit (to price the fastest program when none fits).
  void ignore_memory() { std::fill(limit_.begin(), limit_.end(), kInf); }
  double worst_overflow() const { return over_; }
  // The least f = g + h of a state that ran out of memory (infinity if none did).
  double min_overflow_f() const { return min_overflow_f_; }
  int worst_device() const { return over_device_; }

  // What the latest step() added: its instructions, and the leaves it stored first (with their
  // properties). The search reads them only when it replays the path found (finish).
  const std::vector<Instruction>& step_instructions() const { return instrs_; }
  const std::vector<std::pair<int, Prop>>& step_storage() const { return stored_; }

  // The memo key: a 128-bit hash (two independent 64-bit mixes) of the next node and every live
  // tensor's (id, properties, segment). Equal states have equal keys; a collision of both halves
  // is vanishingly unlikely (about 2^-128 per pair).
  static std::pair<uint64_t, uint64_t> key(const State& s) {
    auto mix = [](uint64_t h, uint64_t x, uint64_t m) {
      h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      return h * m;
    };
    uint64_t a = 1469598103934665603ull, b = 0x84222325cbf29ce4ull;
    a = mix(a, static_cast<uint64_t>(s.next), 1099511628211ull);
    b = mix(b, static_cast<uint64_t>(s.next), 0xff51afd7ed558ccdull);
    for (const Live& l : s.live) {
      uint64_t w = (static_cast<uint64_t>(l.tensor) << 32) |
                   (static_cast<uint64_t>(l.mask & 0xFFFFF) << 12) |
                   static_cast<uint64_t>(l.segment & 0xFFF);
      a = mix(a, w, 1099511628211ull);
      b = mix(b, w, 0xff51afd7ed558ccdull);
    }
    return {a, b};
  }

 private:
  bool leaf_allows(const GraphTensor& t, const Prop& q) const {
    if (q.kind == PropKind::Partial) return false;
    if (t.role == TensorRole::Parameter) {
      if (space_.linear_weights_must_shard && linear_weight_[t.id])
        return q.kind == PropKind::Sharded;
      if (space_.expert_weights_must_shard && expert_weight_[t.id])
        return q.kind == PropKind::Sharded && q.dim == 0;
      return q.kind == PropKind::Replicated || space_.shard_parameters;
    }
    if (t.role == TensorRole::Input) {
      if (space_.inputs_must_shard_dim0) return q.kind == PropKind::Sharded && q.dim == 0;
      return q.kind == PropKind::Replicated || space_.shard_inputs;
    }
    return q.kind == PropKind::Replicated;  // constants are made on every rank
  }

  // Adds the cheapest conversion of live tensor L to property q (in segment seg). regather: a
  // parameter's all-gather whose copy is not kept (gathered again in backward).
  bool convert(Live& L, const Prop& q, int seg, State& child, bool regather = false) const {
    const std::vector<double>& r = ratios_[seg];
    int t = L.tensor;
    // A parameter's view is only sliced locally (Replicated -> Sharded) or moved between
    // segments, one that a product reads not even that; collectives happen at the parameter.
    if (fixed_view_[static_cast<size_t>(t)]) return false;
    const bool view = param_view_[static_cast<size_t>(t)];
    Instruction best;
    double best_cost = kInf;
    auto consider = [&](InstrKind kind, const Prop& from, int from_seg) {
      Instruction in;
      in.kind = kind;
      in.tensor = t;
      in.from = from;
      in.to = q;
      in.segment = kind == InstrKind::AllGather ? from_seg : seg;
      in.from_segment = from_seg;
      double cost = 0;
      if (kind == InstrKind::Reshard) {
        cost = reshard(t, from.dim, from_seg, seg, &in.method);
      } else if (regather) {
        if (kind != InstrKind::AllGather) return;
        in.method = regather_method(t, in.segment, &cost);
        in.regather = true;
      } else if (space_.zero_storage_everywhere && kind == InstrKind::AllGather &&
                 g_.tensors[t].role == TensorRole::Parameter && q.kind == PropKind::Replicated) {
        in.method = bucketed_gather_method(t, in.segment, &cost);
      } else {
        in.method = best_method(kind, t, in.segment, &cost);
      }
      cost *= cm_.recompute_factor(in);  // its forward run again in backward, where recomputed
      in.cost_s = cost;
      if (cost < best_cost) {
        best_cost = cost;
        best = in;
      }
    };
    auto offer = [&](InstrKind kind, const Prop& from, int from_seg) {
      if (!view || kind == InstrKind::Slice || kind == InstrKind::Reshard)
        consider(kind, from, from_seg);
    };
    for (int b = 0; b < 32; ++b) {
      if (!(L.mask & (1u << b))) continue;
      Prop p = prop_of_bit(b);
      if (p == q && L.segment != seg) {
        offer(InstrKind::Reshard, p, L.segment);
        continue;
      }
      if (q.kind == PropKind::Replicated) {
        if (p.kind == PropKind::Sharded &&
            (space_.allow_activation_all_gather || g_.tensors[t].role == TensorRole::Parameter))
          offer(InstrKind::AllGather, p, L.segment);
        if (p.kind == PropKind::Partial) offer(InstrKind::AllReduce, p, L.segment);
      } else if (q.kind == PropKind::Partial) {
        // Only parameters (a bias added to a Partial sum): for activations it would only widen
        // the search without new useful programs.
        if (p.kind == PropKind::Replicated && g_.tensors[t].role == TensorRole::Parameter)
          offer(InstrKind::ToPartial, p, L.segment);
      } else if (q.kind == PropKind::Sharded) {
        if (p.kind == PropKind::Partial && space_.allow_reduce_scatter)
          offer(InstrKind::ReduceScatter, p, L.segment);
        if (p.kind == PropKind::Sharded && p.dim != q.dim && space_.allow_all_to_all)
          offer(InstrKind::AllToAll, p, L.segment);
        if (p.kind == PropKind::Replicated && space_.allow_slice)
          offer(InstrKind::Slice, p, L.segment);
      }
    }
    if (best_cost == kInf) return false;
    child.g += best.cost_s;
    instrs_.push_back(best);
    if (q.kind == PropKind::Sharded && L.segment != seg) {
      L.mask &= ~kShardedBits;  // shards of the old segment's lengths are dropped
      L.segment = static_cast<int16_t>(seg);
    }
    L.mask |= bit(q);
    const bool moves = best.kind != InstrKind::Reshard || best.cost_s > 0;  // else the same shard
    if (best.regather) {
      // Held while read in forward, and again while a reader's backward runs: the largest such
      // copy is held on top of what is kept (program_memory's rule).
      if (child.transient_peak.empty()) child.transient_peak.assign(child.mem.size(), 0.0);
      for (size_t c = 0; c < child.mem.size(); ++c) {
        const double b = cm_.held_bytes(t, q, r[rep_[c]]);
        if (b > child.transient_peak[c]) {
          child.mem[c] += b - child.transient_peak[c];
          child.transient_peak[c] = b;
        }
      }
    } else if (moves && cm_.kept_for_backward(t)) {
      for (size_t c = 0; c < child.mem.size(); ++c)
        child.mem[c] += cm_.held_bytes(t, q, r[rep_[c]]);
    } else if (moves) {
      hold_again(child, t, q, r);
    }
    return true;
  }

  // A copy of tensor t that a recomputed segment does not keep: it is held again while that
  // segment's backward runs. mem carries the largest such segment so far (program_memory's
  // rule; a segment whose instructions are interleaved with another's counts from where it
  // resumes).
  void hold_again(State& child, int t, const Prop& p, const std::vector<double>& r) const {
    const int s = cm_.recomputed_segment(t);
    if (s < 0) return;
    if (child.again.empty()) {
      child.again.assign(child.mem.size(), 0.0);
      child.again_peak.assign(child.mem.size(), 0.0);
    }
    if (s != child.again_segment) {
      child.again_segment = s;
      std::fill(child.again.begin(), child.again.end(), 0.0);
    }
    for (size_t c = 0; c < child.mem.size(); ++c) {
      child.again[c] += cm_.held_bytes(t, p, r[rep_[c]]);
      if (child.again[c] > child.again_peak[c]) {
        child.mem[c] += child.again[c] - child.again_peak[c];
        child.again_peak[c] = child.again[c];
      }
    }
  }

  static const Live* find_const(const std::vector<Live>& v, int t) {
    auto it =
        std::lower_bound(v.begin(), v.end(), t, [](const Live& l, int x) { return l.tensor < x; });
    return it != v.end() && it->tensor == t ? &*it : nullptr;
  }
  static Live* find(std::vector<Live>& v, int t) {
    auto it =
        std::lower_bound(v.begin(), v.end(), t, [](const Live& l, int x) { return l.tensor < x; });
    return it != v.end() && it->tensor == t ? &*it : nullptr;
  }
  static void insert(std::vector<Live>& v, const Live& l) {
    auto it = std::lower_bound(v.begin(), v.end(), l.tensor,
                               [](const Live& a, int x) { return a.tensor < x; });
    if (it != v.end() && it->tensor == l.tensor)
      *it = l;
    else
      v.insert(it, l);
  }
  static void erase(std::vector<Live>& v, int t) {
    auto it =
        std::lower_bound(v.begin(), v.end(), t, [](const Live& l, int x) { return l.tensor < x; });
    if (it != v.end() && it->tensor == t) v.erase(it);
  }

  const CostModel& cm_;
  const Graph& g_;
  const std::vector<std::vector<double>>& ratios_;
  const std::vector<int>& seg_;
  const SearchSpace& space_;
  std::vector<bool> linear_weight_;   // the weight (input 1) of a Linear or MatMul
  std::vector<bool> param_view_;      // made by view ops from a parameter (above)
  std::vector<bool> fixed_view_;      // such a view that a product reads: never converted
  std::vector<bool> expert_weight_;   // a parameter of >= 3 dims: a batched MatMul weight
  std::vector<bool> zero_param_;      // may be stored Sharded(0) where read whole (ZeRO)
  std::vector<bool> regather_param_;  // of those, the ones that may be gathered again in backward
  // position -> its storage variants: 1, 2 more where it reads a zero_param_ first, 1 more
  // where factor_pos_
  std::vector<int> variants_;
  std::vector<bool> factor_pos_;  // position -> its node may broadcast factors (see the ctor)
  // Of those nodes: per signature (index sig + 1) the cost and method of broadcasting factors,
  // infinity where the signature does not allow it; empty for the other nodes.
  std::vector<std::vector<std::pair<double, CollectiveMethod>>> factor_cost_;
  std::vector<int> order_;     // position -> node id: the order nodes are visited in
  std::vector<int> last_use_;  // tensor -> position of its last reader
  // The collective method and cost for (kind, tensor, segment), computed once.
  CollectiveMethod best_method(InstrKind kind, int t, int seg, double* cost) const {
    uint64_t k = (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(seg) << 32) |
                 static_cast<uint64_t>(t);
    auto it = comm_cache_.find(k);
    if (it == comm_cache_.end())
      it = comm_cache_.emplace(k, std::make_pair(CollectiveMethod::None, 0.0)).first,
      it->second.first = cm_.best_method(kind, t, ratios_[seg], &it->second.second);
    *cost = it->second.second;
    return it->second.first;
  }

  // The all-gather of a parameter kept for backward where every parameter is stored sharded
  // (SearchSpace::zero_storage_everywhere): such gathers run in buckets (bucketed_parameter_
  // gather), each paying one latency for all of its members, so the form and the price here are
  // the bytes' and the parameter's share of its buckets' latencies (its bytes over a bucket's, at
  // most one whole bucket: the gather's of kGatherBucketBytes, the reduce-scatter's of
  // kGradBucketBytes). synth::recost prices the program whole; priced with whole latencies per
  // parameter, the search kept reading parameters in shards where step_time finds that 2x slower,
  // and chose forms by their latency; priced without, it never chose the hierarchical forms
  // whose gain is the buckets' latency.
  CollectiveMethod bucketed_gather_method(int t, int seg, double* cost) const {
    uint64_t k = (static_cast<uint64_t>(0xFE) << 56) | (static_cast<uint64_t>(seg) << 32) |
                 static_cast<uint64_t>(t);
    auto it = comm_cache_.find(k);
    if (it == comm_cache_.end()) {
      std::pair<CollectiveMethod, double> best{CollectiveMethod::None, kInf};
      const double bytes = static_cast<double>(g_.tensors[t].bytes());
      const double gather_share = std::min(1.0, bytes / static_cast<double>(kGatherBucketBytes));
      const double scatter_share = std::min(1.0, bytes / static_cast<double>(kGradBucketBytes));
      for (CollectiveMethod m : cm_.gather_methods()) {
        const double gather_latency = cm_.collective_latency_s(InstrKind::AllGather, m);
        const double scatter_latency =
            cm_.requires_grad(t) ? cm_.collective_latency_s(InstrKind::ReduceScatter, m) : 0.0;
        const double c = cm_.communication(InstrKind::AllGather, t, m).eval(ratios_[seg]) -
                         gather_latency * (1 - gather_share) -
                         scatter_latency * (1 - scatter_share);
        if (c < best.second) best = {m, std::max(0.0, c)};
      }
      it = comm_cache_.emplace(k, best).first;
    }
    *cost = it->second.second;
    return it->second.first;
  }

  // The same for the all-gather of a parameter gathered again in backward (its method is the
  // all-gather's).
  CollectiveMethod regather_method(int t, int seg, double* cost) const {
    double plain = 0;
    const CollectiveMethod m = best_method(InstrKind::AllGather, t, seg, &plain);
    uint64_t k = (static_cast<uint64_t>(0xFF) << 56) | (static_cast<uint64_t>(seg) << 32) |
                 static_cast<uint64_t>(t);
    auto it = comm_cache_.find(k);
    if (it == comm_cache_.end())
      it = comm_cache_.emplace(k, std::make_pair(m, 0.0)).first,
      it->second.second = cm_.communication(InstrKind::AllGather, t, m, true).eval(ratios_[seg]);
    *cost = it->second.second;
    return m;
  }

  // A reshard's cost and method for (tensor, dim, from segment, to segment), computed once.
  double reshard(int t, int dim, int from_seg, int to_seg, CollectiveMethod* method) const {
    const uint64_t k =
        (static_cast<uint64_t>(t) << 40) | (static_cast<uint64_t>(dim & 0xFF) << 32) |
        (static_cast<uint64_t>(from_seg & 0xFFFF) << 16) | static_cast<uint64_t>(to_seg & 0xFFFF);
    auto it = reshard_cache_.find(k);
    if (it == reshard_cache_.end()) {
      CollectiveMethod m = CollectiveMethod::None;
      const double c = cm_.reshard_s(t, dim, ratios_[from_seg], ratios_[to_seg], &m);
      it = reshard_cache_.emplace(k, std::make_pair(m, c)).first;
    }
    *method = it->second.first;
    return it->second.second;
  }

  std::vector<int> rep_;       // a representative device of each memory class
  std::vector<double> limit_;  // memory of each class
  std::vector<std::vector<double>> compute_cost_;
  mutable std::unordered_map<uint64_t, std::pair<CollectiveMethod, double>> comm_cache_;
  mutable std::unordered_map<uint64_t, std::pair<CollectiveMethod, double>> reshard_cache_;
  std::vector<std::vector<double>> mem_min_suffix_;  // per position, per device class
  std::vector<double> h_const_;                      // per position: chains not yet started
  std::vector<std::vector<std::pair<int, int>>> in_progress_;  // per position: (next node, input)
  std::vector<std::vector<double>> chain_value_;  // per node with a predecessor, per property
  std::vector<double> mem_suffix_;
  mutable std::vector<Instruction> instrs_;           // see step_instructions()
  mutable std::vector<std::pair<int, Prop>> stored_;  // see step_storage()
  mutable double over_ = 0;
  mutable double min_overflow_f_ = kInf;
  mutable int over_device_ = -1;
};

// Dominance: states at the same node holding the same tensors, in the same segments. A state
// dominates another of its group when it holds every property the other holds (perhaps more),
// costs no more and uses no more memory on any device: every completion of the other is then a
// completion of it at no more cost, so the other can be dropped. Each group remembers its last
// kDominanceWindow states; a bounded check that never prunes wrongly, only sometimes misses.
constexpr size_t kDominanceWindow = 8;

uint64_t group_key(const State& s) {
  uint64_t h = 0x243f6a8885a308d3ull ^ static_cast<uint64_t>(s.next);
  for (const Live& l : s.live) {
    h ^= (static_cast<uint64_t>(l.tensor) << 16) ^ static_cast<uint64_t>(l.segment & 0xFFFF);
    h *= 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  return h;
}

bool dominates(const State& a, const State& b) {
  if (a.next != b.next || a.g > b.g || a.live.size() != b.live.size()) return false;
  for (size_t i = 0; i < a.live.size(); ++i) {
    const Live &x = a.live[i], &y = b.live[i];
    if (x.tensor != y.tensor || x.segment != y.segment || (x.mask & y.mask) != y.mask) return false;
  }
  for (size_t c = 0; c < a.mem.size(); ++c)
    if (a.mem[c] > b.mem[c]) return false;
  return true;
}

// An open-addressing hash map from already well-mixed 64- or 128-bit keys to small values: the
// search's memo and dominance groups hold millions of entries, and a node-based map spends most
// of its time allocating and chasing pointers. Key and value share a slot (one cache miss per
// lookup); the all-zero key marks an empty slot, and a key that is all zeros is stored as 1 (a
// collision of probability 2^-64 or less, like any other of these hashes).
template <typename Key, typename Value>
class FlatMap {
 public:
  explicit FlatMap(size_t expected = 1024) {
    size_t cap = 1024;
    while (cap < 2 * expected) cap *= 2;
    slots_.assign(cap, Slot{});
  }
  // Starts loading the slot where `key` would be found (a later lookup of it then waits less:
  // the search looks up every child of a state, and each lookup is a cache miss).
  void prefetch(const Key& key) const {
    __builtin_prefetch(&slots_[static_cast<size_t>(hash(key)) & (slots_.size() - 1)]);
  }
  // The value of `key`, default-constructed when new.
  Value& operator[](Key key) {
    if (key == Key{}) key = one();
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& s = slots_[find(key)];
    if (s.key == Key{}) {
      s.key = key;
      ++size_;
    }
    return s.value;
  }

 private:
  struct Slot {
    Key key{};
    Value value{};
  };
  static uint64_t hash(uint64_t k) { return k ^ (k >> 31); }
  static uint64_t hash(const std::pair<uint64_t, uint64_t>& k) { return k.first ^ (k.second >> 1); }
  static Key one() {
    if constexpr (std::is_same_v<Key, uint64_t>) {
      return 1;
    } else {
      return Key{1, 0};
    }
  }
  size_t find(const Key& key) const {
    const size_t mask = slots_.size() - 1;
    size_t i = static_cast<size_t>(hash(key)) & mask;
    while (!(slots_[i].key == Key{}) && !(slots_[i].key == key)) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    for (Slot& s : old)
      if (!(s.key == Key{})) slots_[find(s.key)] = std::move(s);
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// The recent states of a dominance group (arena indices), a ring of kDominanceWindow.
struct Group {
  int index[kDominanceWindow];
  uint32_t count = 0;  // states ever added
};

// Rebuilds the program of the path to `goal` by replaying its signature choices.
SearchResult finish(const CostModel& cm, const Expander& ex, const std::vector<State>& arena,
                    int goal, const std::vector<std::vector<double>>& ratios) {
  SearchResult res;
  res.storage.assign(cm.graph().tensors.size(), Prop::replicated());
  std::vector<int> sigs;
  for (int s = goal; arena[s].parent >= 0; s = arena[s].parent) sigs.push_back(arena[s].signature);
  std::reverse(sigs.begin(), sigs.end());
  State cur = ex.initial(), next;
  for (int sig : sigs) {
    bool ok = ex.step(cur, sig, next);
    HAP_ASSERT(ok, "replaying the searched path failed");
    for (const Instruction& in : ex.step_instructions()) res.instructions.push_back(in);
    for (const auto& [t, p] : ex.step_storage()) res.storage[t] = p;
    std::swap(cur, next);
  }
  HAP_ASSERT(std::abs(cur.g - arena[goal].g) <= 1e-9 * std::max(1.0, cur.g),
             "replayed cost differs");
  res.cost_s = arena[goal].g;
  res.device_memory_bytes = program_memory(cm, res.instructions, res.storage, ratios);
  return res;
}

bool search_pass(const CostModel& cm, const Expander& ex,
                 const std::vector<std::vector<double>>& ratios, const SearchSpace& space,
                 size_t memo_labels, double bound, SearchResult* out);

// Where no program fits in memory: what the fastest program with no memory limits needs on the
// device it overflows most, or "" when even that cannot be found within the budget.
std::string memory_shortfall(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                             const std::vector<int>& node_segment, const SearchSpace& space) {
  Expander unlimited(cm, ratios, node_segment, space);
  unlimited.ignore_memory();
  unlimited.prepare_heuristic();
  SearchResult fastest;
  try {
    if (!search_pass(cm, unlimited, ratios, space, 1, kInf, &fastest)) return "";
  } catch (const SearchBudgetError&) {
    return "";
  }
  const std::vector<double> need =
      program_memory(cm, fastest.instructions, fastest.storage, ratios);
  int worst = -1;
  double short_by = 0;
  int over = 0;
  for (int d = 0; d < cm.num_devices(); ++d) {
    const double excess = need[d] - static_cast<double>(cm.cluster().devices[d].memory_bytes);
    if (excess <= 0) continue;
    ++over;
    if (worst < 0 || excess > short_by) {
      worst = d;
      short_by = excess;
    }
  }
  if (worst < 0) return "";
  const Device& dev = cm.cluster().devices[worst];
  return "the fastest program needs " + std::to_string(static_cast<int64_t>(need[worst])) +
         " bytes on device " + std::to_string(worst) + " (" + dev.name + ", " + dev.type +
         "), short by " + std::to_string(static_cast<int64_t>(std::ceil(short_by))) +
         " bytes of its " + std::to_string(dev.memory_bytes) +
         (over > 1 ? " (" + std::to_string(over) + " devices are short)" : std::string()) +
         "; every other program ran out of memory too";
}

[[noreturn]] void no_program(const CostModel& cm, const Expander& ex,
                             const std::vector<std::vector<double>>& ratios,
                             const std::vector<int>& node_segment, const SearchSpace& space) {
  if (ex.worst_device() >= 0) {
    const std::string why =
        space.explain_out_of_memory ? memory_shortfall(cm, ratios, node_segment, space) : "";
    if (!why.empty())
      HAP_CHECK(false, "no program fits in memory: ", why,
                " (use more devices, a smaller batch or model)");
    const Device& d = cm.cluster().devices[ex.worst_device()];
    HAP_CHECK(false, "no program fits in memory: every program runs out, device ",
              ex.worst_device(), " (", d.name, ", ", d.type, ") first, with ", d.memory_bytes,
              " bytes (use more devices, a smaller batch or model)");
  }
  HAP_CHECK(false, "no program exists for this graph under the chosen strategy");
}

void check_ratios(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                  const std::vector<int>& node_segment) {
  HAP_CHECK(node_segment.size() == cm.graph().nodes.size(), "search: ", node_segment.size(),
            " node segments for ", cm.graph().nodes.size(), " nodes");
  for (int s : node_segment)
    HAP_CHECK(s >= 0 && s < static_cast<int>(ratios.size()), "search: segment ", s,
              " has no ratio vector (", ratios.size(), " given)");
  for (size_t s = 0; s < ratios.size(); ++s) {
    HAP_CHECK(static_cast<int>(ratios[s].size()) == cm.num_devices(), "ratios of segment ", s,
              " have ", ratios[s].size(), " entries for ", cm.num_devices(), " devices");
    double sum = 0;
    for (double x : ratios[s]) {
      HAP_CHECK(x >= 0 && std::isfinite(x), "ratios of segment ", s, " contain ", x);
      sum += x;
    }
    HAP_CHECK(std::abs(sum - 1.0) < 1e-6, "ratios of segment ", s, " sum to ", sum, ", expected 1");
  }
}

}  // namespace

std::vector<double> program_memory(const CostModel& cm, const std::vector<Instruction>& instrs,
                                   const std::vector<Prop>& storage,
                                   const std::vector<std::vector<double>>& ratios,
                                   bool every_reshard_moves) {
  const Graph& g = cm.graph();
  int D = cm.num_devices();
  std::vector<double> mem(D, 0.0);
  auto add = [&](int t, const Prop& p, int seg, double factor) {
    for (int d = 0; d < D; ++d) mem[d] += factor * cm.held_bytes(t, p, ratios[seg][d]);
  };
  // What a run of one recomputed segment's instructions holds again while its backward runs
  // (the executor recomputes each run on its own, parallel::Executor::plan_recomputation: a
  // segment whose instructions are interleaved with another's counts from where it resumes, as
  // the search counts it); the largest run is added.
  std::vector<double> again(D, 0.0), largest(D, 0.0);
  int again_segment = -1;
  auto held = [&](int t, const Prop& p, int seg) {
    if (cm.kept_for_backward(t)) {
      add(t, p, seg, 1.0);
    } else if (const int s = cm.recomputed_segment(t); s >= 0) {
      if (s != again_segment) {
        again_segment = s;
        std::fill(again.begin(), again.end(), 0.0);
      }
      for (int d = 0; d < D; ++d) {
        again[d] += cm.held_bytes(t, p, ratios[seg][d]);
        largest[d] = std::max(largest[d], again[d]);
      }
    }
  };
  // The largest parameter copy gathered for use and not kept (gathered again in backward): held
  // while its readers run, forward and backward, on top of what is kept.
  std::vector<double> transient(D, 0.0);
  std::vector<bool> seen(g.tensors.size(), false);
  for (const Instruction& in : instrs) {
    if (in.regather) {
      for (int d = 0; d < D; ++d)
        transient[d] =
            std::max(transient[d], cm.held_bytes(in.tensor, in.to, ratios[in.segment][d]));
    } else if (in.kind == InstrKind::Compute) {
      const GraphNode& n = g.nodes[in.node];
      for (int t : n.inputs) {
        if (t < 0 || seen[t] || g.tensors[t].producer >= 0) continue;
        seen[t] = true;
        add(t, storage[t], in.segment,
            g.tensors[t].role == TensorRole::Parameter ? cm.param_state_factor() : 1.0);
      }
      for (size_t o = 0; o < n.outputs.size(); ++o)
        held(n.outputs[o], cm.output_prop(n.id, in.signature, o), in.segment);
    } else if (in.kind != InstrKind::GradAllReduce && in.kind != InstrKind::Update &&
               in.kind != InstrKind::FactorBroadcast &&
               !(in.kind == InstrKind::Reshard && in.cost_s == 0 && !every_reshard_moves)) {
      held(in.tensor, in.to, in.segment);
    }
  }
  for (int d = 0; d < D; ++d) mem[d] += largest[d] + transient[d];
  return mem;
}

namespace {

// One best-first pass. memo_labels = 1: each memo key keeps its cheapest state only (memory is
// ignored when comparing paths). memo_labels > 1: a key also keeps up to memo_labels - 1 dearer
// states that use less memory on some device (see Expander::covers), so that a path that stays
// within memory is not dropped for a cheaper one that later runs out. Returns false when no
// program reaches the loss (the expander then knows the closest shortfall; out->states_expanded
// says how many states it took to find out).
bool search_pass(const CostModel& cm, const Expander& ex,
                 const std::vector<std::vector<double>>& ratios, const SearchSpace& space,
                 size_t memo_labels, double bound, SearchResult* out) {
  std::vector<State> arena;
  arena.push_back(ex.initial());
  // Per key: in the fast pass the cheapest state (g inline: no visit to the arena); in the
  // memory-aware pass the list of states kept (in leaner_lists).
  struct MemoEntry {
    double g = kInf;
    int index = -1;
    int leaner = -1;
  };
  std::vector<std::vector<int>> leaner_lists;
  FlatMap<std::pair<uint64_t, uint64_t>, MemoEntry> memo;  // grows as it fills
  memo[Expander::key(arena[0])] = {0.0, 0, memo_labels == 1 ? -1 : 0};
  if (memo_labels > 1) leaner_lists.push_back({0});
  std::vector<char> dropped(1, 0);  // covered by a later state: not expanded
  FlatMap<uint64_t, Group> groups;  // group_key -> recent arena indices
  int64_t dominated = 0;
  using Entry = std::pair<double, int64_t>;  // (f, -sequence) for deterministic ties
  std::priority_queue<std::pair<Entry, int>, std::vector<std::pair<Entry, int>>, std::greater<>>
      open;
  int64_t seq = 0;
  open.push({{ex.heuristic(arena[0]), seq++}, 0});
  int64_t expanded = 0;
  // The children of the state expanded (reused: their vectors keep their capacity), with their
  // signatures, heuristics and memo keys. All are made first and their memo slots prefetched,
  // then each is judged in signature order as if made one at a time (a child's making reads
  // only its parent).
  std::vector<State> children;
  struct Child {
    int sig;
    double h;
    std::pair<uint64_t, uint64_t> key;
    uint64_t group;  // group_key, where dominance pruning is on
  };
  std::vector<Child> made;
  while (!open.empty()) {
    int si = open.top().second;
    open.pop();
    if (dropped[si]) continue;  // a better path reached this state
    const State& s = arena[si];
    if (s.next == ex.num_nodes()) {
      *out = finish(cm, ex, arena, si, ratios);
      out->states_expanded = expanded;
      out->states_dominated = dominated;
      return true;
    }
    if (++expanded > space.max_states)
      throw SearchBudgetError("search: expanded more than " + std::to_string(space.max_states) +
                              " states without reaching the loss (raise the search budget)");
    const int nsig = ex.num_signatures(s.next);
    made.clear();
    for (int sig = -1; sig < nsig; ++sig) {
      if (children.size() <= made.size()) children.emplace_back();
      State& child = children[made.size()];
      if (!ex.step(s, sig, child)) continue;
      const double h = ex.heuristic(child);
      if (child.g + h >= bound) continue;  // cannot beat a known program
      made.push_back({sig, h, Expander::key(child), 0});
      memo.prefetch(made.back().key);
      if (space.dominance_pruning) {
        made.back().group = group_key(child);
        groups.prefetch(made.back().group);
      }
    }
    for (size_t k = 0; k < made.size(); ++k) {
      State& child = children[k];
      const int sig = made[k].sig;
      const double h = made[k].h;
      Group* group = space.dominance_pruning ? &groups[made[k].group] : nullptr;
      if (group) {
        const uint32_t n = std::min<uint32_t>(group->count, kDominanceWindow);
        bool covered = false;
        for (uint32_t i = 0; i < n && !covered; ++i)
          covered = dominates(arena[group->index[i]], child);
        if (covered) {
          ++dominated;
          continue;
        }
      }
      MemoEntry& e = memo[made[k].key];
      const int index = static_cast<int>(arena.size());
      if (memo_labels == 1) {
        if (child.g >= e.g) continue;
        if (e.index >= 0) dropped[e.index] = 1;
        e.g = child.g;
        e.index = index;
      } else {
        if (e.leaner < 0) {
          e.leaner = static_cast<int>(leaner_lists.size());
          leaner_lists.emplace_back();
        }
        std::vector<int>& kept = leaner_lists[e.leaner];  // every state kept for this key
        if (std::any_of(kept.begin(), kept.end(),
                        [&](int other) { return ex.covers(arena[other], child); }))
          continue;
        kept.erase(std::remove_if(kept.begin(), kept.end(),
                                  [&](int other) {
                                    if (!ex.covers(child, arena[other])) return false;
                                    dropped[other] = 1;
                                    return true;
                                  }),
                   kept.end());
        if (kept.size() >= memo_labels) {
          // Full: a child cheaper than every kept state replaces the dearest (the cheapest path
          // is always kept, as with one label); a dearer one is dropped.
          auto by_g = [&](int x, int y) { return arena[x].g < arena[y].g; };
          if (child.g >= arena[*std::min_element(kept.begin(), kept.end(), by_g)].g) continue;
          auto dearest = std::max_element(kept.begin(), kept.end(), by_g);
          dropped[*dearest] = 1;
          kept.erase(dearest);
        }
        kept.push_back(index);
      }
      child.parent = si;
      child.signature = sig;
      arena.push_back(child);
      dropped.push_back(0);
      if (group) group->index[group->count++ % kDominanceWindow] = index;
      open.push({{child.g + h, seq++}, index});
    }
  }
  out->states_expanded = expanded;
  return false;
}

// States kept per memo key in the memory-aware pass.
constexpr size_t kMemoryMemoLabels = 8;  // the cheapest + 7 leaner

}  // namespace

SearchResult search_program(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                            const std::vector<int>& node_segment, const SearchSpace& space) {
  check_ratios(cm, ratios, node_segment);
  Expander ex(cm, ratios, node_segment, space);
  const std::string overflow = ex.replicated_leaves_overflow();
  HAP_CHECK(overflow.empty(), "no program fits in memory: ", overflow,
            " (use more devices, a smaller batch or model, or a strategy that shards them)");
  ex.prepare_heuristic();
  // First the fast pass. Its program is optimal unless a state that ran out of memory could have
  // led to a cheaper one: a program cheaper than the one found, dropped because the memo kept a
  // cheaper path to one of its states that then ran out, passes through a state that ran out
  // with f = g + h (h admissible) below that program's cost. So memory only matters when some
  // state ran out with f below the cost found (or none was found).
  SearchResult fast, lean;
  bool found = false;
  try {
    found = search_pass(cm, ex, ratios, space, 1, kInf, &fast);
  } catch (const SearchBudgetError& e) {
    // Out of budget with states that ran out of memory: say what memory does as well, or the
    // budget would hide a program that cannot fit.
    if (ex.worst_device() < 0) throw;
    const std::string why =
        space.explain_out_of_memory ? memory_shortfall(cm, ratios, node_segment, space) : "";
    throw SearchBudgetError(std::string(e.what()) + "; memory binds too" +
                            (why.empty() ? "" : ": " + why));
  }
  if (found) fast.memory_may_matter = ex.worst_device() >= 0 && ex.min_overflow_f() < fast.cost_s;
  if (found && (!fast.memory_may_matter || !space.memory_exact)) return fast;
  if (ex.worst_device() < 0) no_program(cm, ex, ratios, node_segment, space);
  HAP_CHECK(!space.quick_out_of_memory,
            "no program fits in memory (the fast pass found none; not searched further)");
  // Memory binds somewhere: search again keeping leaner paths beside the cheapest ones, so that
  // a program that fits is not lost to a cheaper path that later overflows. The better program
  // of the two passes is returned (a memory-aware pass over budget leaves the fast one).
  bool found_lean = false;
  try {
    found_lean =
        search_pass(cm, ex, ratios, space, kMemoryMemoLabels, found ? fast.cost_s : kInf, &lean);
  } catch (const Error&) {
    if (!found) throw;
  }
  if (found_lean && (!found || lean.cost_s < fast.cost_s)) {
    lean.states_expanded += fast.states_expanded;
    return lean;
  }
  if (found) return fast;
  no_program(cm, ex, ratios, node_segment, space);
}

bool search_leaner_program(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                           const std::vector<int>& node_segment, const SearchSpace& space,
                           double bound, SearchResult* out) {
  check_ratios(cm, ratios, node_segment);
  Expander ex(cm, ratios, node_segment, space);
  ex.prepare_heuristic();
  try {
    return search_pass(cm, ex, ratios, space, kMemoryMemoLabels, bound, out);
  } catch (const SearchBudgetError&) {
    out->states_expanded = space.max_states;
    return false;
  }
}

double search_lower_bound(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                          const std::vector<int>& node_segment, const SearchSpace& space) {
  check_ratios(cm, ratios, node_segment);
  Expander ex(cm, ratios, node_segment, space);
  ex.prepare_heuristic();
  return ex.heuristic(ex.initial());
}

SearchResult exhaustive_search(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                               const std::vector<int>& node_segment, const SearchSpace& space) {
  check_ratios(cm, ratios, node_segment);
  Expander ex(cm, ratios, node_segment, space);
  std::vector<State> arena;
  double best = kInf;
  int best_state = -1;
  int64_t visited = 0;
  // Depth-first; every path is kept in the arena so the best one can be rebuilt.
  std::vector<int> stack = {0};
  arena.push_back(ex.initial());
  while (!stack.empty()) {
    int si = stack.back();
    stack.pop_back();
    ++visited;
    if (arena[si].next == ex.num_nodes()) {
      if (arena[si].g < best) {
        best = arena[si].g;
        best_state = si;
      }
      continue;
    }
    for (int sig = ex.num_signatures(arena[si].next) - 1; sig >= -1; --sig) {
      State child;
      if (!ex.step(arena[si], sig, child)) continue;
      child.parent = si;
      child.signature = sig;
      arena.push_back(std::move(child));
      stack.push_back(static_cast<int>(arena.size()) - 1);
    }
  }
  if (best_state < 0) no_program(cm, ex, ratios, node_segment, space);
  SearchResult res = finish(cm, ex, arena, best_state, ratios);
  res.states_expanded = visited;
  return res;
}

}  // namespace hap::synth
