#include "parallel/executor.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/timeline.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "parallel/autograd_collectives.h"
#include "parallel/hierarchical.h"
#include "parallel/shard.h"
#include "synth/cost_model.h"

namespace hap::parallel {

using synth::InstrKind;
using synth::Instruction;

namespace {

// A small key per property, for the values of a tensor (R, P, S(0), S(1), ...).
// Replicated 0, Partial 1, Sharded(d) 2 + d.
int prop_key(const Prop& p) {
  if (p.kind == ops::PropKind::Sharded) return 2 + static_cast<int>(p.dim);
  return p.kind == ops::PropKind::Partial ? 1 : 0;
}

Prop prop_of_key(int key) {
  return key >= 2 ? Prop::sharded(key - 2) : key == 1 ? Prop::partial() : Prop::replicated();
}

}  // namespace

// What an op's local hook (ops/local.h) sees of the node it runs: the graph's shapes, the chosen
// signature, the program's shard lengths, the forward's randomness, and the collectives.
class Executor::NodeContext : public ops::ShardContext {
 public:
  NodeContext(const Executor& ex, const synth::GraphNode& node, const Instruction& in,
              const ForwardOptions& options)
      : ex_(ex), node_(node), in_(in), options_(options) {}

  int rank() const override { return ex_.comm_.rank(); }
  int world_size() const override { return ex_.comm_.size(); }
  const Shape& input_shape(size_t i) const override { return tensor(node_.inputs[i]).shape; }
  const Shape& output_shape(size_t o) const override { return tensor(node_.outputs[o]).shape; }
  Prop input_prop(size_t i) const override {
    return in_.signature < 0 ? Prop::replicated()
                             : ex_.sigs_[node_.id][static_cast<size_t>(in_.signature)].inputs[i];
  }
  Prop output_prop(size_t o) const override {
    return in_.signature < 0 ? Prop::replicated()
                             : ex_.sigs_[node_.id][static_cast<size_t>(in_.signature)].outputs[o];
  }
  std::vector<int64_t> input_lengths(size_t i) const override {
    return ex_.lengths(node_.inputs[i], input_prop(i), in_.segment);
  }
  std::vector<int64_t> output_lengths(size_t o) const override {
    return ex_.lengths(node_.outputs[o], output_prop(o), in_.segment);
  }
  uint64_t random_offset() const override { return options_.random_offset; }
  std::optional<uint64_t> random_seed() const override { return options_.random_seed; }
  bool training() const override { return options_.training; }
  Tensor all_gather(const Tensor& shard, int64_t dim,
                    const std::vector<int64_t>& lengths) override {
    return functional::all_gather(ex_.comm_, shard, dim, lengths, CollectiveMethod::Grouped);
  }
  // (An op's own sum of an integer over the ranks, e.g. the row-split cross-entropy's target
  // count: an all-gather of one value per rank (Communicator::allreduce), counted as one in the
  // collective statistics and shown in --trace timelines as "sum_over_ranks"; the cost model
  // prices it with the op, OpDef::own_collectives.)
  int64_t sum_over_ranks(int64_t value) override {
    std::optional<timeline::Scope> span;
    if (timeline::recording()) span.emplace("collective", "sum_over_ranks", "8 bytes");
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t sum = ex_.comm_.allreduce(value);
    add_collective_stat(
        CollectiveStat::AllGather, 1, 8.0 * ex_.comm_.size(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return sum;
  }

 private:
  const synth::GraphTensor& tensor(int t) const {
    HAP_ASSERT(t >= 0, "node ", node_.id, " has an omitted input");
    return ex_.graph_.tensors[static_cast<size_t>(t)];
  }
  const Executor& ex_;
  const synth::GraphNode& node_;
  const Instruction& in_;
  const ForwardOptions& options_;
};

Executor::Executor(const synth::Graph& graph, const synth::DistributedProgram& program,
                   Communicator comm, const ExecutorOptions& options)
    : graph_(graph),
      program_(program),
      comm_(std::move(comm)),
      options_(options),
      layout_(graph, program.instructions, program.ratios) {
  HAP_CHECK(!program.ratios.empty(), "executor: the program has no ratios");
  HAP_CHECK(options.bucket_bytes > 0, "executor: bucket_bytes must be positive, got ",
            options.bucket_bytes);
  HAP_CHECK(options.gather_bucket_bytes > 0, "executor: gather_bucket_bytes must be positive, got ",
            options.gather_bucket_bytes);
  HAP_CHECK(static_cast<int>(program.ratios[0].size()) == comm_.size(),
            "executor: the plan is for ", program.ratios[0].size(), " devices but the world has ",
            comm_.size(), " ranks (launch with mpirun -np ", program.ratios[0].size(), ")");
  for (const synth::GraphTensor& t : graph.tensors)
    if (t.role == synth::TensorRole::Parameter) param_tensor_[t.name] = t.id;
  for (const synth::GraphNode& n : graph.nodes) sigs_.push_back(synth::signatures_of(graph, n));
  for (const Instruction& in : program.instructions) {
    if (in.kind != InstrKind::Compute) continue;
    for (int t : graph.nodes[in.node].inputs)
      if (t >= 0 && graph.tensors[t].role == synth::TensorRole::Parameter)
        param_segment_.try_emplace(t, in.segment);
  }
  HAP_CHECK(program.recompute.empty() || program.recompute.size() == program.ratios.size(),
            "executor: the program marks ", program.recompute.size(),
            " segments for recomputation but has ", program.ratios.size());
  plan_recomputation();
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    HAP_CHECK(!in.regather || (in.kind == InstrKind::AllGather &&
                               graph.tensors[in.tensor].role == synth::TensorRole::Parameter),
              "executor: instruction ", i, " (", synth::instr_name(in.kind),
              ") is marked regather; only a parameter's all_gather can be");
  }
  // Every forward value leaves the value map after its last forward reader (or after its writer
  // where nothing in forward reads it): autograd holds what backward needs, and the map would
  // otherwise keep every activation of the step alive through the backward pass (in bf16, the f32
  // copies that mixed precision makes as well). Copies gathered again in backward (regather) are
  // such values. The loss and the state updates' values are read at the end of forward and stay.
  release_after_.assign(program.instructions.size(), {});
  {
    std::set<int> read_at_end = {graph.loss};
    for (const synth::StateUpdate& u : graph.state_updates) read_at_end.insert(u.value);
    std::map<Key, size_t> last;
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      for (const Key& k : writes(program.instructions[i])) last.try_emplace(k, i);
      for (const Key& k : reads(program.instructions[i])) last[k] = i;
    }
    for (const auto& [k, i] : last)
      if (!read_at_end.count(k.first)) release_after_[i].push_back(k);
  }
  // Nodes whose parameters' gradients come from broadcast factors.
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& in = program.instructions[i];
    if (in.kind != InstrKind::FactorBroadcast) continue;
    bool computed = false;
    for (size_t j = 0; j < i; ++j)
      computed = computed || (program.instructions[j].kind == InstrKind::Compute &&
                              program.instructions[j].node == in.node &&
                              program.instructions[j].signature == in.signature);
    HAP_CHECK(computed, "executor: instruction ", i,
              " (factor_broadcast) follows no compute of node ", in.node, " under signature ",
              in.signature);
    factor_method_[in.node] = in.method;
  }
  // The bucketed parameter all-gathers, in program order of each parameter's first.
  {
    std::set<int> seen;
    int64_t bytes = 0;
    for (const Instruction& in : program.instructions) {
      if (!bucketed_gather(in) || !seen.insert(in.tensor).second) continue;
      const synth::GraphTensor& gt = graph.tensors[in.tensor];
      const int64_t b = shape_numel(gt.shape) * static_cast<int64_t>(dtype_size(gt.dtype));
      const int first = gather_buckets_.empty() ? -1 : gather_buckets_.back().front();
      if (gather_buckets_.empty() || gather_methods_.back() != in.method ||
          graph.tensors[first].dtype != gt.dtype || bytes + b > options.gather_bucket_bytes) {
        gather_buckets_.emplace_back();
        gather_methods_.push_back(in.method);
        bytes = 0;
      }
      gather_bucket_of_[in.tensor] = gather_buckets_.size() - 1;
      gather_buckets_.back().push_back(in.tensor);
      bytes += b;
    }
  }
  bool hierarchical = false;
  for (const Instruction& in : program.instructions)
    hierarchical = hierarchical || in.method == CollectiveMethod::Hierarchical;
  if (hierarchical) {
    HAP_CHECK(static_cast<int>(program.nodes.size()) == comm_.size(),
              "executor: the program has hierarchical collectives but names the nodes of ",
              program.nodes.size(), " of its ", comm_.size(), " ranks");
    comm_ = comm_.with_node_groups(group_by_node(comm_, program.nodes));
  }
}

bool Executor::bucketed_gather(const Instruction& in) const {
  // (As the cost model prices it, gathering from how the parameter is stored.)
  return options_.bucket_parameter_gathers && synth::bucketed_parameter_gather(graph_, in) &&
         program_.storage[in.tensor] == in.from;
}

const Communicator& Executor::overlap_comm() {
  if (!grad_comm_.valid()) {
    grad_comm_ = comm_.split(0, comm_.rank());
    if (comm_.node_groups())
      grad_comm_ = grad_comm_.with_node_groups(group_by_node(grad_comm_, program_.nodes));
  }
  return grad_comm_;
}

void Executor::gather_parameters() {
  whole_.clear();
  gathers_.clear();
  gathers_done_ = 0;
  gather_waited_s_ = gather_bytes_ = 0;
  if (gather_buckets_.empty()) return;
  HAP_CHECK(!param_local_.empty(), "executor: forward before materialize_parameters");
  // Nonblocking (each bucket completed where it is first needed) on a communicator of its own,
  // as backward()'s buckets; a backend without nonblocking collectives gathers them here.
  const bool nonblocking = options_.overlap_grad_comm && comm_.backend().nonblocking_all_reduce();
  const Communicator& comm = nonblocking ? overlap_comm() : comm_;
  for (size_t b = 0; b < gather_buckets_.size(); ++b) {
    std::vector<Tensor> locals;
    std::vector<ShardOf> shards;
    for (int t : gather_buckets_[b]) {
      const Prop p = program_.storage[t];
      locals.push_back(param_local_.at(t).detach());
      shards.push_back({p.dim, lengths(t, p, param_segment_.count(t) ? param_segment_.at(t) : 0)});
    }
    NoGradGuard no_grad;
    auto g = std::make_unique<GatherInFlight>();
    if (!nonblocking) {
      std::vector<Tensor> wholes = all_gather_many(comm, locals, shards, gather_methods_[b]);
      for (size_t k = 0; k < wholes.size(); ++k) {
        wholes[k].set_requires_grad(param_local_.at(gather_buckets_[b][k]).requires_grad());
        whole_[gather_buckets_[b][k]] = wholes[k];
      }
      gathers_.push_back(std::move(g));
      ++gathers_done_;
      continue;
    }
    g->buffers = pack_all_gather_many(comm, locals, shards, gather_methods_[b]);
    gather_bytes_ += g->buffers.bytes;
    const auto t0 = std::chrono::steady_clock::now();
    g->op = start_all_gather(comm, gather_methods_[b], g->buffers.send, g->buffers.recv,
                             g->buffers.layout);
    gather_waited_s_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gathers_.push_back(std::move(g));
  }
}

void Executor::complete_gathers(size_t through) {
  for (; gathers_done_ < gathers_.size() && gathers_done_ <= through; ++gathers_done_) {
    GatherInFlight& g = *gathers_[gathers_done_];
    {
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<timeline::Scope> span;  // in --trace timelines
      if (timeline::recording())
        span.emplace("collective", "AllGather",
                     std::to_string(static_cast<int64_t>(g.buffers.bytes)) + " bytes");
      g.op->wait();
      gather_waited_s_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    NoGradGuard no_grad;
    std::vector<Tensor> wholes = unpack_all_gather_many(g.buffers);
    const std::vector<int>& bucket = gather_buckets_[gathers_done_];
    for (size_t k = 0; k < wholes.size(); ++k) {
      wholes[k].set_requires_grad(param_local_.at(bucket[k]).requires_grad());
      whole_[bucket[k]] = wholes[k];
    }
    g = GatherInFlight{};
  }
  if (gathers_done_ == gathers_.size() && gather_bytes_ > 0) {
    // hap-train --profile: the time this rank waited on them.
    add_collective_stat(CollectiveStat::AllGather, gathers_.size(), gather_bytes_,
                        gather_waited_s_);
    gather_bytes_ = 0;
  }
}

void Executor::advance_gathers() {
  while (gathers_done_ < gathers_.size() && gathers_[gathers_done_]->op->test())
    complete_gathers(gathers_done_);
}

std::vector<int64_t> Executor::lengths(int tensor, const Prop& p, int segment) const {
  HAP_ASSERT(p.kind == ops::PropKind::Sharded);
  return layout_.lengths(tensor, p.dim, segment);
}

int Executor::param_tensor(const std::string& name) const {
  auto it = param_tensor_.find(name);
  HAP_CHECK(it != param_tensor_.end(), "executor: no parameter named '", name, "'");
  return it->second;
}

Prop Executor::storage(const std::string& name) const {
  return program_.storage[param_tensor(name)];
}

void Executor::materialize_parameters(const TensorSource& source) {
  params_.clear();
  param_local_.clear();
  device_ = Device::cpu();
  for (const auto& [name, t] : param_tensor_) {
    const synth::GraphTensor& gt = graph_.tensors[t];
    Tensor local;
    if (const Prop p = program_.storage[t]; p.kind == ops::PropKind::Sharded) {
      const int seg = param_segment_.count(t) ? param_segment_.at(t) : 0;
      ShardSpec spec(p.dim, lengths(t, p, seg));
      local = source(gt.name, spec.local_shape(gt.shape, comm_.rank()),
                     spec.logical_slice(gt.shape, comm_.rank()));
    } else {
      local = source(gt.name, gt.shape, LogicalSlice{});
    }
    local = local.detach();
    local.set_requires_grad(true);
    if (param_local_.empty()) device_ = local.device();  // the rank's device: the parameters'
    param_local_[t] = local;
  }
  // In graph order, so that every rank lists them alike.
  for (const synth::GraphTensor& t : graph_.tensors)
    if (t.role == synth::TensorRole::Parameter) params_.push_back({t.name, param_local_.at(t.id)});
}

Tensor Executor::leaf_value(int t, const Prop& p, int segment, const TensorSource* inputs) {
  const synth::GraphTensor& gt = graph_.tensors[t];
  if (gt.role == synth::TensorRole::Parameter) {
    HAP_CHECK(!param_local_.empty(), "executor: forward before materialize_parameters");
    // The whole copy of a parameter stored Sharded that this forward gathers in a bucket.
    if (auto b = gather_bucket_of_.find(t);
        b != gather_bucket_of_.end() && p.kind == ops::PropKind::Replicated) {
      complete_gathers(b->second);
      if (auto w = whole_.find(t); w != whole_.end()) return w->second;
    }
    HAP_ASSERT(program_.storage[t] == p, "parameter ", gt.name, " stored ",
               program_.storage[t].str(), " but read as ", p.str());
    // A Replicated parameter's replicas are one tensor: its Partial gradient is all-reduced by
    // the program's grad_all_reduce in backward().
    return param_local_.at(t);
  }
  ShardSpec spec;
  LogicalSlice slice;
  Shape local = gt.shape;
  if (p.kind == ops::PropKind::Sharded) {
    spec = ShardSpec(p.dim, lengths(t, p, segment));
    local = spec.local_shape(gt.shape, comm_.rank());
    slice = spec.logical_slice(gt.shape, comm_.rank());
  }
  if (gt.role == synth::TensorRole::State) {
    auto it = state_value_.find(t);
    HAP_CHECK(it != state_value_.end(), "executor: buffer '", gt.name,
              "' has no value (set_states before forward)");
    // A copy: the update after the forward must not change what this forward read.
    return box_of(it->second, local, slice).contiguous().clone();
  }
  if (gt.role == synth::TensorRole::Constant) {
    // A tensor the forward made itself (a mask, positions): its data was captured by the tracer.
    HAP_CHECK(gt.value.defined() && gt.value.has_storage(), "executor: tensor %", t, " (", gt.name,
              ") is a constant traced without data (made under a MetaGuard inside forward); "
              "create it from values, or pass it as an input");
    // Traced on the host; it goes where this rank computes (its parameters' device).
    return box_of(gt.value, local, slice).contiguous().to(device_);
  }
  HAP_CHECK(gt.role == synth::TensorRole::Input, "executor: tensor %", t, " (", gt.name,
            ") is read before it is computed");
  return (*inputs)(gt.name, local, slice);
}

void Executor::set_states(const std::vector<std::pair<std::string, Tensor>>& states) {
  std::map<std::string, Tensor> by_name(states.begin(), states.end());
  states_.clear();
  state_value_.clear();
  for (const synth::GraphTensor& t : graph_.tensors) {
    if (t.role != synth::TensorRole::State) continue;
    auto it = by_name.find(t.name);
    HAP_CHECK(it != by_name.end(), "executor: no value given for buffer '", t.name, "'");
    const Tensor& v = it->second;
    HAP_CHECK(v.defined() && v.has_storage() && v.shape() == t.shape && v.dtype() == t.dtype,
              "executor: buffer '", t.name, "' must be ", dtype_name(t.dtype), shape_str(t.shape),
              " with data, got ", v.defined() ? v.str() : "undefined");
    states_.emplace_back(t.name, v);
    state_value_[t.id] = v;
  }
}

size_t Executor::values_held() const {
  size_t n = 0;
  for (const std::map<int, Tensor>& v : values_) n += v.size();
  return n;
}

Tensor Executor::full_value(int t) const {
  const std::map<int, Tensor>& v = values_[t];
  if (auto it = v.find(prop_key(Prop::replicated())); it != v.end()) return it->second.detach();
  if (auto it = v.find(prop_key(Prop::partial())); it != v.end())
    return all_reduce(comm_, it->second.detach().contiguous(), CollectiveMethod::Grouped);
  // Every rank runs the same program: the same properties are present on every rank.
  HAP_ASSERT(!v.empty(), "tensor %", t, " has no value in this forward");
  const auto& [key, local] = *v.begin();
  const Prop p = prop_of_key(key);
  return all_gather(comm_, local.detach().contiguous(), p.dim,
                    lengths(t, p, value_segment_[t].at(key)), CollectiveMethod::Grouped);
}

void Executor::apply_state_updates() {
  NoGradGuard no_grad;
  for (const synth::StateUpdate& u : graph_.state_updates) {
    const Tensor& state = state_value_.at(u.state);
    const Tensor value = hap::reshape(full_value(u.value), state.shape());
    state.copy_from(state * u.keep + value * u.take);
  }
}

namespace {
// Instructions that forward() skips: backward's (run by backward()) and the optimizer's.
bool forward_instruction(const Instruction& in) {
  return in.kind != InstrKind::GradAllReduce && in.kind != InstrKind::Update &&
         in.kind != InstrKind::FactorBroadcast;
}
}  // namespace

std::vector<Executor::Key> Executor::reads(const Instruction& in) const {
  std::vector<Key> keys;
  if (in.kind == InstrKind::Compute) {
    const synth::GraphNode& n = graph_.nodes[in.node];
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] >= 0)
        keys.push_back(
            {n.inputs[k], prop_key(in.signature < 0 ? Prop::replicated()
                                                    : sigs_[n.id][in.signature].inputs[k])});
  } else if (bucketed_gather(in)) {
    // Its whole copy, gathered at the start of forward(), is a leaf (a recomputed run's input).
    keys.push_back({in.tensor, prop_key(Prop::replicated())});
  } else if (forward_instruction(in)) {
    keys.push_back({in.tensor, prop_key(in.from)});
  }
  return keys;
}

std::vector<Executor::Key> Executor::writes(const Instruction& in) const {
  std::vector<Key> keys;
  if (in.kind == InstrKind::Compute) {
    const synth::GraphNode& n = graph_.nodes[in.node];
    for (size_t o = 0; o < n.outputs.size(); ++o)
      keys.push_back(
          {n.outputs[o],
           prop_key(in.signature < 0 ? Prop::replicated() : sigs_[n.id][in.signature].outputs[o])});
  } else if (forward_instruction(in)) {
    keys.push_back({in.tensor, prop_key(in.to)});
  }
  return keys;
}

void Executor::plan_recomputation() {
  const std::vector<Instruction>& instrs = program_.instructions;
  const size_t n = instrs.size();
  auto recomputed = [&](const Instruction& in) {
    return forward_instruction(in) && in.segment < static_cast<int>(program_.recompute.size()) &&
           program_.recompute[static_cast<size_t>(in.segment)];
  };
  // Tensors read after the forward's instructions: the loss and what the state updates take.
  std::set<int> read_at_end = {graph_.loss};
  for (const synth::StateUpdate& u : graph_.state_updates) read_at_end.insert(u.value);
  for (size_t i = 0; i < n;) {
    if (!recomputed(instrs[i])) {
      ++i;
      continue;
    }
    // A run of one recomputed segment's instructions (backward's and the optimizer's between
    // them belong to no run).
    Region r;
    r.first = i;
    const int segment = instrs[i].segment;
    size_t end = i;
    for (size_t j = i; j < n; ++j) {
      if (!forward_instruction(instrs[j])) continue;
      if (instrs[j].segment != segment) break;
      end = j + 1;
    }
    r.end = end;
    std::set<Key> made;
    for (size_t j = r.first; j < r.end; ++j) {
      for (const Key& k : reads(instrs[j]))
        if (!made.count(k) && std::find(r.inputs.begin(), r.inputs.end(), k) == r.inputs.end()) {
          r.inputs.push_back(k);
          r.input_segment.push_back(instrs[j].segment);
        }
      for (const Key& k : writes(instrs[j])) made.insert(k);
    }
    std::set<Key> later;
    for (size_t j = r.end; j < n; ++j)
      for (const Key& k : reads(instrs[j])) later.insert(k);
    for (const Key& k : made)
      if (later.count(k) || read_at_end.count(k.first)) r.outputs.push_back(k);
    regions_.push_back(std::move(r));
    i = end;
  }
}

void Executor::run_instruction(const Instruction& in, Values& values, Segments& segments,
                               const TensorSource* inputs, const ForwardOptions& options) {
  // A leaf read for the first time (a parameter, this rank's rows of an input, a constant).
  auto value = [&](int t, const Prop& q, int segment) -> const Tensor& {
    auto it = values[t].find(prop_key(q));
    if (it == values[t].end()) {
      HAP_ASSERT(graph_.tensors[t].producer < 0, "tensor %", t, " has no ", q.str(), " value");
      HAP_ASSERT(inputs != nullptr, "tensor %", t, " (", q.str(),
                 ") is read inside a recomputed run but is not among its inputs");
      it = values[t].emplace(prop_key(q), leaf_value(t, q, segment, inputs)).first;
      segments[t][prop_key(q)] = segment;
    }
    return it->second;
  };
  if (in.kind == InstrKind::Compute) {
    const synth::GraphNode& n = graph_.nodes[in.node];
    NodeContext ctx(*this, n, in, options);
    std::vector<Tensor> args;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (t < 0) {
        args.emplace_back();
        continue;
      }
      args.push_back(value(t, ctx.input_prop(k), in.segment));
    }
    ops::ScopeGuard scope(n.module, ops::ScopeGuard::kAbsolute);
    const ops::OpDef& def = ops::op_def(n.kind);
    std::vector<Tensor> outs =
        def.local ? def.local(ctx, args, n.attrs) : ops::call(n.kind, args, n.attrs);
    HAP_ASSERT(outs.size() == n.outputs.size(), "op ", def.name, "'s local run returned ",
               outs.size(), " outputs, expected ", n.outputs.size());
    if (auto f = factor_method_.find(n.id); f != factor_method_.end())
      factors(n, ctx, args, outs, f->second);
    for (size_t o = 0; o < outs.size(); ++o) {
      values[n.outputs[o]][prop_key(ctx.output_prop(o))] = outs[o];
      segments[n.outputs[o]][prop_key(ctx.output_prop(o))] = in.segment;
    }
    return;
  }
  if (!forward_instruction(in)) return;
  const int t = in.tensor;
  if (bucketed_gather(in)) {  // gathered at the start of forward()
    values[t][prop_key(in.to)] = value(t, in.to, in.segment);
    segments[t][prop_key(in.to)] = in.segment;
    return;
  }
  Tensor x = value(t, in.from, in.segment), y;
  const CollectiveMethod m = in.method;
  switch (in.kind) {
    case InstrKind::AllGather:
      y = in.regather ? functional::all_gather_regathered(comm_, x, in.from.dim,
                                                          lengths(t, in.from, in.from_segment), m)
                      : functional::all_gather(comm_, x, in.from.dim,
                                               lengths(t, in.from, in.from_segment), m);
      break;
    case InstrKind::ReduceScatter:
      y = functional::reduce_scatter(comm_, x, in.to.dim, lengths(t, in.to, in.segment), m);
      break;
    case InstrKind::AllReduce:
      y = functional::all_reduce(comm_, x, m);
      break;
    case InstrKind::AllToAll:
      y = functional::all_to_all(comm_, x, in.to.dim, in.from.dim, lengths(t, in.to, in.segment),
                                 lengths(t, in.from, in.from_segment), m);
      break;
    case InstrKind::Slice:
      y = functional::shard_slice(comm_, x, in.to.dim, lengths(t, in.to, in.segment));
      break;
    case InstrKind::ToPartial:
      y = functional::to_partial(comm_, x);
      break;
    case InstrKind::Reshard: {
      // From one segment's shard lengths to another's: gather, then take the new slice
      // (differentiable both ways; a point-to-point exchange would move less). The program
      // priced it with these lengths (synth::recost): it moves exactly when they differ.
      const std::vector<int64_t> from = lengths(t, in.from, in.from_segment),
                                 to = lengths(t, in.to, in.segment);
      y = from == to
              ? x
              : functional::shard_slice(
                    comm_, functional::all_gather(comm_, x, in.from.dim, from, m), in.to.dim, to);
      break;
    }
    default:
      HAP_ASSERT(false, "unexpected instruction ", synth::instr_name(in.kind));
  }
  values[t][prop_key(in.to)] = y;
  segments[t][prop_key(in.to)] = in.segment;
}

void Executor::factors(const synth::GraphNode& n, const NodeContext& ctx,
                       const std::vector<Tensor>& args, const std::vector<Tensor>& outs,
                       CollectiveMethod method) {
  if (outs.empty() || !outs[0].defined() || !outs[0].grad_fn()) return;  // no backward
  HAP_CHECK(!outs[0].grad_fn()->custom && outs[0].grad_fn()->kind == n.kind, "executor: node ",
            n.id, " (", ops::op_name(n.kind),
            ") broadcasts factors but its output is not its op's own (a cast after it?)");
  std::vector<bool> whole(n.inputs.size(), false);
  bool any = false;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int t = n.inputs[k];
    whole[k] =
        t >= 0 && graph_.tensors[t].role == synth::TensorRole::Parameter && args[k].requires_grad();
    any = any || whole[k];
  }
  if (!any) return;
  // How each input and output is held here (a Sharded one is gathered whole).
  struct Held {
    Prop prop;
    std::vector<int64_t> lengths;
  };
  std::vector<Held> in_held, out_held;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const Prop p = ctx.input_prop(k);
    in_held.push_back({p, n.inputs[k] >= 0 && p.kind == ops::PropKind::Sharded
                              ? ctx.input_lengths(k)
                              : std::vector<int64_t>{}});
  }
  for (size_t o = 0; o < n.outputs.size(); ++o) {
    const Prop p = ctx.output_prop(o);
    out_held.push_back(
        {p, p.kind == ops::PropKind::Sharded ? ctx.output_lengths(o) : std::vector<int64_t>{}});
  }
  autograd::gather_factors(
      outs[0], std::move(whole),
      [this, in_held, out_held, method](const std::vector<autograd::Node::Factor>& factors) {
        auto held = [&](size_t k) -> const Held& {
          return factors[k].grad ? out_held.at(factors[k].index) : in_held.at(factors[k].index);
        };
        std::vector<Tensor> made(factors.size());
        std::vector<size_t> sharded;
        for (size_t k = 0; k < factors.size(); ++k) {
          if (held(k).prop.kind == ops::PropKind::Sharded)
            sharded.push_back(k);
          else
            made[k] = factors[k].local;
        }
        if (sharded.empty()) return made;
        // Shards of one length per rank and one dtype travel in one all-gather: each moved to
        // [rows, rest] (its sharded dim first), side by side, split again after.
        bool together = sharded.size() > 1;
        for (size_t k : sharded)
          together = together && held(k).lengths == held(sharded[0]).lengths &&
                     factors[k].local.dtype() == factors[sharded[0]].local.dtype();
        if (!together) {
          for (size_t k : sharded)
            made[k] = all_gather(comm_, factors[k].local.contiguous(), held(k).prop.dim,
                                 held(k).lengths, method);
          return made;
        }
        std::vector<Tensor> packed;
        for (size_t k : sharded) {
          const Tensor& t = factors[k].local;
          const int64_t dim = held(k).prop.dim;
          std::vector<int64_t> perm = {dim};
          int64_t rest = 1;
          for (int64_t d = 0; d < t.dim(); ++d)
            if (d != dim) {
              perm.push_back(d);
              rest *= t.shape()[static_cast<size_t>(d)];
            }
          packed.push_back(reshape(permute(t, perm), {t.shape()[static_cast<size_t>(dim)], rest}));
        }
        const Tensor whole =
            all_gather(comm_, concat(packed, 1).contiguous(), 0, held(sharded[0]).lengths, method);
        int64_t at = 0;
        for (size_t j = 0; j < sharded.size(); ++j) {
          const Tensor& local = factors[sharded[j]].local;
          const int64_t dim = held(sharded[j]).prop.dim, width = packed[j].shape()[1];
          // Back to the local tensor's layout with the whole length in its sharded dim.
          Shape moved = {whole.shape()[0]};
          std::vector<int64_t> inverse(static_cast<size_t>(local.dim()));
          for (int64_t d = 0, i = 1; d < local.dim(); ++d)
            if (d != dim) {
              moved.push_back(local.shape()[static_cast<size_t>(d)]);
              inverse[static_cast<size_t>(d)] = i++;
            }
          made[sharded[j]] =
              contiguous(permute(reshape(slice(whole, 1, at, at + width), moved), inverse));
          at += width;
        }
        return made;
      });
}

void Executor::run_recomputed(const Region& r, const TensorSource& inputs,
                              const ForwardOptions& options) {
  // Its inputs first (leaves read for the first time included), so that they are the
  // checkpoint's inputs and get their gradients through it.
  std::vector<Tensor> args;
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const auto [t, key] = r.inputs[k];
    auto it = values_[t].find(key);
    if (it == values_[t].end()) {
      const Prop q = prop_of_key(key);
      HAP_ASSERT(graph_.tensors[t].producer < 0, "tensor %", t, " has no ", q.str(), " value");
      it = values_[t].emplace(key, leaf_value(t, q, r.input_segment[k], &inputs)).first;
      value_segment_[t][key] = r.input_segment[k];
    }
    args.push_back(it->second);
  }
  // Runs the region on `in` alone; called again by the backward pass (the executor outlives it).
  auto made = std::make_shared<Segments>();
  auto run = [this, &r, options, made](const std::vector<Tensor>& in) {
    Values values(graph_.tensors.size());
    Segments segments(graph_.tensors.size());
    for (size_t k = 0; k < in.size(); ++k) values[r.inputs[k].first][r.inputs[k].second] = in[k];
    for (size_t j = r.first; j < r.end; ++j)
      run_instruction(program_.instructions[j], values, segments, nullptr, options);
    std::vector<Tensor> out;
    for (const auto& [t, key] : r.outputs) out.push_back(values[t].at(key));
    *made = std::move(segments);
    return out;
  };
  const std::vector<Tensor> outs = autograd::checkpoint(run, args);
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const auto [t, key] = r.outputs[k];
    values_[t][key] = outs[k];
    value_segment_[t][key] = (*made)[t].at(key);
  }
}

Tensor Executor::forward(const TensorSource& inputs, const ForwardOptions& options) {
  values_.assign(graph_.tensors.size(), {});
  value_segment_.assign(graph_.tensors.size(), {});
  gather_parameters();
  // Values are dropped after their last forward reader (release_after_).
  auto release = [&](size_t first, size_t end) {
    for (size_t j = first; j < end; ++j)
      for (const auto& [t, key] : release_after_[j]) values_[t].erase(key);
  };
  size_t next_region = 0;
  for (size_t i = 0; i < program_.instructions.size();) {
    if (next_region < regions_.size() && regions_[next_region].first == i) {
      run_recomputed(regions_[next_region], inputs, options);
      i = regions_[next_region++].end;
      release(regions_[next_region - 1].first, i);
      continue;
    }
    run_instruction(program_.instructions[i], values_, value_segment_, &inputs, options);
    release(i, i + 1);
    advance_gathers();
    ++i;
  }
  complete_gathers(gathers_.size());  // (a parameter no instruction read)
  if (options.training) apply_state_updates();
  const auto& lv = values_[graph_.loss];
  if (auto it = lv.find(prop_key(Prop::partial())); it != lv.end()) return it->second;
  auto it = lv.find(prop_key(Prop::replicated()));
  HAP_CHECK(it != lv.end(), "executor: the loss is neither Partial nor Replicated in this program");
  return functional::to_partial(comm_, it->second);
}

void Executor::plan_buckets() {
  // Reverse program order: the backward pass completes the last layers' gradients first. A
  // bucket holds one collective (all-reduces of Replicated parameters' gradients, or
  // reduce-scatters of those of parameters gathered in buckets, each at its first gather), one
  // method and one dtype (a gradient has its parameter's dtype). The two collectives fill
  // buckets of their own side by side (interleaved parameters do not split each other's), which
  // run in the order the backward pass completes them (synth::step_time prices them so).
  buckets_.clear();
  bucket_methods_.clear();
  bucket_scatters_.clear();
  std::map<int, size_t> first_gather;
  for (size_t i = program_.instructions.size(); i-- > 0;)
    if (bucketed_gather(program_.instructions[i]))
      first_gather[program_.instructions[i].tensor] = i;
  struct Filling {
    std::vector<int> tensors;
    CollectiveMethod method = CollectiveMethod::Grouped;
    DType dtype = DType::F32;
    int64_t bytes = 0;
    size_t ready = 0;  // the instruction whose backward completes it (its earliest member)
    bool scatter = false;
  };
  std::vector<Filling> done;
  std::optional<Filling> open[2];  // all-reduce, reduce-scatter
  for (size_t i = program_.instructions.size(); i-- > 0;) {
    const Instruction& in = program_.instructions[i];
    const bool gather = bucketed_gather(in) && first_gather.at(in.tensor) == i;
    if (in.kind != InstrKind::GradAllReduce && !gather) continue;
    auto p = param_local_.find(in.tensor);
    HAP_ASSERT(p != param_local_.end(), instr_name(in.kind), " of %", in.tensor,
               ", which is not a parameter");
    if (!p->second.requires_grad()) continue;
    const synth::GraphTensor& gt = graph_.tensors[in.tensor];
    const int64_t b = shape_numel(gt.shape) * static_cast<int64_t>(dtype_size(p->second.dtype()));
    std::optional<Filling>& f = open[gather ? 1 : 0];
    if (f && (p->second.dtype() != f->dtype || in.method != f->method ||
              f->bytes + b > options_.bucket_bytes)) {
      done.push_back(std::move(*f));
      f.reset();
    }
    if (!f) {
      f.emplace();
      f->scatter = gather;
      f->method = in.method;
      f->dtype = p->second.dtype();
    }
    f->tensors.push_back(in.tensor);
    f->bytes += b;
    f->ready = i;
  }
  for (auto& f : open)
    if (f) done.push_back(std::move(*f));
  std::stable_sort(done.begin(), done.end(),
                   [](const Filling& a, const Filling& b) { return a.ready > b.ready; });
  for (Filling& f : done) {
    bucket_scatters_.push_back(f.scatter);
    buckets_.push_back(std::move(f.tensors));
    bucket_methods_.push_back(f.method);
  }
  buckets_planned_ = true;
}

// One backward's gradient buckets: each all-reduced (one at a time, in bucket order) once every
// gradient in it is complete, or at finish().
class Executor::GradBuckets final : public autograd::BackwardObserver {
 public:
  GradBuckets(Executor& ex, const Communicator& comm) : ex_(ex), comm_(comm) {
    remaining_.reserve(ex.buckets_.size());
    for (size_t b = 0; b < ex.buckets_.size(); ++b) {
      remaining_.push_back(static_cast<int>(ex.buckets_[b].size()));
      for (int t : ex.buckets_[b]) {
        // A reduce-scatter's leaf is the whole copy forward() gathered (none: it was not read).
        const Tensor* leaf = &ex.param_local_.at(t);
        if (ex.bucket_scatters_[b]) {
          auto w = ex.whole_.find(t);
          if (w == ex.whole_.end()) continue;
          leaf = &w->second;
        }
        bucket_of_[leaf->impl()] = b;
      }
    }
  }

  void leaf_done(const Tensor& leaf) override {
    auto it = bucket_of_.find(leaf.impl());
    if (it == bucket_of_.end()) return;
    --remaining_[it->second];
    advance(/*during_backward=*/true);
  }

  void node_done() override {
    if (inflight_) advance(/*during_backward=*/true);
  }

  // After the backward pass: the rest, in order (a gradient that never came is left out).
  void finish() {
    while (next_ < ex_.buckets_.size() || inflight_) {
      if (inflight_) {
        const auto t0 = std::chrono::steady_clock::now();
        {
          std::optional<timeline::Scope> span;  // in --trace timelines
          if (timeline::recording())
            span.emplace("collective", scatter_ ? "ReduceScatter" : "AllReduce",
                         std::to_string(in_bytes()) + " bytes");
          inflight_->wait();
        }
        waited_[scatter_ ? 1 : 0] += since(t0);
        unpack();
      }
      if (next_ < ex_.buckets_.size()) launch(/*during_backward=*/false);
    }
    // hap-train --profile: the time this rank waited on its gradient all-reduces (and
    // reduce-scatters).
    add_collective_stat(CollectiveStat::AllReduce,
                        static_cast<uint64_t>(stats.buckets - stats.scatter_buckets), bytes_[0],
                        waited_[0]);
    if (stats.scatter_buckets > 0)
      add_collective_stat(CollectiveStat::ReduceScatter,
                          static_cast<uint64_t>(stats.scatter_buckets), bytes_[1], waited_[1]);
    NoGradGuard no_grad;
    for (const auto& [shard, part] : scattered_) {
      const Tensor g = shard.grad();
      shard.set_grad(g.defined() ? hap::add(g, part) : part);
    }
    scattered_.clear();
  }

  BackwardStats stats;

 private:
  // Completes the bucket in flight if it has finished; starts the next one that is ready.
  void advance(bool during_backward) {
    for (;;) {
      if (inflight_) {
        const auto t0 = std::chrono::steady_clock::now();
        const bool done = inflight_->test();
        waited_[scatter_ ? 1 : 0] += since(t0);
        if (!done) return;
        unpack();
      }
      if (next_ == ex_.buckets_.size() || remaining_[next_] > 0) return;
      launch(during_backward);
    }
  }

  void launch(bool during_backward) {
    const size_t b = next_++;
    const std::vector<int>& bucket = ex_.buckets_[b];
    members_.clear();
    scatter_ = ex_.bucket_scatters_[b];
    if (scatter_) {
      // The whole copies' Partial gradients, each reduce-scattered to how its parameter is
      // stored: one collective for the bucket.
      std::vector<Tensor> partials;
      std::vector<ShardOf> shards;
      for (int t : bucket) {
        auto w = ex_.whole_.find(t);
        if (w == ex_.whole_.end() || !w->second.grad().defined()) continue;
        const Prop p = ex_.program_.storage[t];
        const int seg = ex_.param_segment_.count(t) ? ex_.param_segment_.at(t) : 0;
        members_.push_back({ex_.param_local_.at(t), Shape{}});
        partials.push_back(w->second.grad().contiguous());
        shards.push_back({p.dim, ex_.lengths(t, p, seg)});
        w->second.zero_grad();
      }
      if (partials.empty()) return;
      NoGradGuard no_grad;
      scatter_buffers_ = pack_reduce_scatter_many(comm_, partials, shards, ex_.bucket_methods_[b]);
      in_ = scatter_buffers_.send;
      bytes_[1] += static_cast<double>(in_bytes());
      const auto t0 = std::chrono::steady_clock::now();
      inflight_ = start_reduce_scatter(comm_, ex_.bucket_methods_[b], scatter_buffers_.send,
                                       scatter_buffers_.layout, scatter_buffers_.recv);
      waited_[1] += since(t0);
      ++stats.buckets;
      ++stats.scatter_buckets;
      if (during_backward) ++stats.started_during_backward;
      return;
    }
    std::vector<Tensor> flat;
    for (int t : bucket) {
      const Tensor& param = ex_.param_local_.at(t);
      Tensor g = param.grad();
      if (!g.defined()) continue;
      members_.push_back({param, g.shape()});
      flat.push_back(hap::reshape(g.contiguous(), {g.numel()}));
    }
    if (flat.empty()) return;
    NoGradGuard no_grad;
    in_ = flat.size() == 1 ? flat[0].contiguous() : hap::concat(flat, 0);
    out_ = Tensor::empty(in_.shape(),
                         TensorOptions{}.with_dtype(in_.dtype()).with_device(in_.device()));
    bytes_[0] += static_cast<double>(in_bytes());
    const auto t0 = std::chrono::steady_clock::now();
    inflight_ = ex_.bucket_methods_[b] == CollectiveMethod::Hierarchical
                    ? start_hierarchical_all_reduce(comm_.node_groups(), in_, out_)
                    : comm_.backend().start_all_reduce(in_, out_);
    waited_[0] += since(t0);
    ++stats.buckets;
    if (during_backward) ++stats.started_during_backward;
  }

  void unpack() {
    inflight_.reset();
    NoGradGuard no_grad;
    if (scatter_) {
      // Each stored shard's gradient: its rows of the sum.
      // (Added once the backward pass is over, in bucket order, to what it accumulated into
      // the shard itself, a read of the stored shard: the same order whenever the bucket ends.)
      std::vector<Tensor> parts = unpack_reduce_scatter_many(scatter_buffers_);
      for (size_t i = 0; i < members_.size(); ++i)
        scattered_.push_back({members_[i].first, parts[i]});
      scatter_buffers_ = ManyScatter{};
    } else {
      std::vector<int64_t> sizes;
      for (const auto& [param, shape] : members_) sizes.push_back(shape_numel(shape));
      std::vector<Tensor> parts = hap::split(out_, sizes, 0);
      for (size_t i = 0; i < members_.size(); ++i)
        members_[i].first.set_grad(hap::reshape(parts[i], members_[i].second).contiguous());
    }
    members_.clear();
    in_ = out_ = Tensor();
  }

  int64_t in_bytes() const { return in_.numel() * static_cast<int64_t>(dtype_size(in_.dtype())); }
  static double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  Executor& ex_;
  const Communicator& comm_;
  double bytes_[2] = {0, 0}, waited_[2] = {0, 0};  // all-reduces, reduce-scatters
  std::unordered_map<const TensorImpl*, size_t> bucket_of_;
  std::vector<int> remaining_;  // per bucket: gradients not yet complete
  size_t next_ = 0;             // the next bucket to start
  std::unique_ptr<PendingCollective> inflight_;
  std::vector<std::pair<Tensor, Shape>> members_;     // the bucket in flight's (parameter, shape)
  bool scatter_ = false;                              // it is a reduce-scatter
  ManyScatter scatter_buffers_;                       // its buffers, then
  std::vector<std::pair<Tensor, Tensor>> scattered_;  // (stored shard, its rows of the sum)
  Tensor in_, out_;
};

void Executor::backward(const Tensor& local_loss) {
  if (!buckets_planned_) plan_buckets();
  // Every rank runs the same program, so the same gradients are defined on every rank, and the
  // same buckets start in the same order. Nonblocking all-reduces get a communicator of their
  // own (their phases start as each rank finds the last one done); a backend that runs them at
  // once runs them at the same points of the backward pass on every rank, between its other
  // collectives, on the same communicator.
  const bool own_comm = options_.overlap_grad_comm && comm_.backend().nonblocking_all_reduce();
  if (own_comm && !buckets_.empty()) overlap_comm();
  GradBuckets buckets(*this, own_comm ? grad_comm_ : comm_);
  if (options_.overlap_grad_comm) {
    autograd::ObserveBackward observe(&buckets);
    local_loss.backward();
  } else {
    local_loss.backward();
  }
  buckets.finish();
  backward_stats_ = buckets.stats;
  whole_.clear();  // (the forward's values still hold them until the next forward)
}

void Executor::update(const std::function<void(const std::vector<Tensor>& params)>& step) const {
  std::vector<Tensor> params;
  for (const Instruction& in : program_.instructions) {
    if (in.kind != InstrKind::Update) continue;
    auto p = param_local_.find(in.tensor);
    HAP_ASSERT(p != param_local_.end(), "update of %", in.tensor, ", which is not a parameter");
    params.push_back(p->second);
  }
  step(params);
}

double Executor::global_loss(const Tensor& local_loss) const {
  return comm_.allreduce(local_loss.item());
}

double Executor::global_grad_norm() const {
  std::vector<Tensor> replicated, sharded;
  for (const auto& [name, p] : params_) {
    Tensor g = p.grad();
    if (g.defined())
      (storage(name).kind == ops::PropKind::Sharded ? sharded : replicated).push_back(g);
  }
  return std::sqrt(hap::sum_of_squares(replicated) + comm_.allreduce(hap::sum_of_squares(sharded)));
}

void Executor::scale_grads(double factor) const {
  NoGradGuard no_grad;
  for (const auto& [name, p] : params_) {
    Tensor g = p.grad();
    if (g.defined()) p.set_grad(ops::call1(ops::OpKind::MulScalar, {g}, ops::ScalarAttrs{factor}));
  }
}

Tensor Executor::gather(const Tensor& local, int t) const {
  const Prop p = program_.storage[t];
  if (p.kind != ops::PropKind::Sharded) return local;
  const int seg = param_segment_.count(t) ? param_segment_.at(t) : 0;
  return all_gather(comm_, local.contiguous(), p.dim, lengths(t, p, seg),
                    CollectiveMethod::Grouped);
}

Tensor Executor::gathered_grad(const std::string& name) const {
  const int t = param_tensor(name);
  Tensor g = param_local_.at(t).grad();
  HAP_CHECK(g.defined(), "executor: parameter '", name, "' has no gradient");
  return gather(g, t);
}

Tensor Executor::gathered_like(const std::string& name, const Tensor& local) const {
  return gather(local.detach(), param_tensor(name));
}

Tensor Executor::gathered_value(const std::string& name) const {
  const int t = param_tensor(name);
  return gather(param_local_.at(t).detach(), t);
}

LogicalSlice Executor::slice_of(const std::string& name) const {
  const int t = param_tensor(name);
  const Prop p = program_.storage[t];
  if (p.kind != ops::PropKind::Sharded) return {};
  const int seg = param_segment_.count(t) ? param_segment_.at(t) : 0;
  return ShardSpec(p.dim, lengths(t, p, seg)).logical_slice(graph_.tensors[t].shape, comm_.rank());
}

}  // namespace hap::parallel
