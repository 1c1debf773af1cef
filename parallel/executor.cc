#include "parallel/executor.h"

#include <cmath>
#include <numeric>
#include <tuple>

#include "autograd/grad_mode.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "parallel/autograd_collectives.h"
#include "parallel/shard.h"

namespace hap::parallel {

using synth::InstrKind;
using synth::Instruction;

namespace {

std::vector<ops::ShardSignature> signatures_of(const synth::Graph& g, const synth::GraphNode& n) {
  const ops::OpDef& def = ops::op_def(n.kind);
  if (!def.shard) return {};
  ops::Metas in, out;
  for (int t : n.inputs)
    in.push_back(t < 0 ? ops::TensorMeta{{}, DType::F32, false}
                       : ops::TensorMeta{g.tensors[t].shape, g.tensors[t].dtype, true});
  for (int t : n.outputs) out.push_back({g.tensors[t].shape, g.tensors[t].dtype, true});
  return def.shard(in, out, n.attrs);
}

}  // namespace

Executor::Executor(const synth::Graph& graph, const synth::DistributedProgram& program,
                   Communicator comm)
    : graph_(graph), program_(program), comm_(std::move(comm)) {
  HAP_CHECK(!program.ratios.empty(), "executor: the program has no ratios");
  HAP_CHECK(static_cast<int>(program.ratios[0].size()) == comm_.size(),
            "executor: the plan is for ", program.ratios[0].size(), " devices but the world has ",
            comm_.size(), " ranks (launch with mpirun -np ", program.ratios[0].size(), ")");
  for (const synth::GraphTensor& t : graph.tensors)
    if (t.role == synth::TensorRole::Parameter) param_tensor_[t.name] = t.id;
  compute_granules();
  for (const Instruction& in : program.instructions) {
    if (in.kind != InstrKind::Compute) continue;
    for (int t : graph.nodes[in.node].inputs)
      if (t >= 0 && graph.tensors[t].role == synth::TensorRole::Parameter)
        param_segment_.try_emplace(t, in.segment);
  }
}

// Shard lengths must agree wherever shards meet: all Sharded operands of one computation split the
// same logical range, and a dim merged by a reshape ([B, T] -> [B * T], heads x head size) is split
// in whole granules of the inner size. Each (tensor, dim) gets a granule; a computation's sharded
// operands share one (their least common multiple), and a reshape scales it by the merged size.
// Iterated to a fixed point over the program's chosen signatures.
void Executor::compute_granules() {
  granule_.resize(graph_.tensors.size());
  for (const synth::GraphTensor& t : graph_.tensors) granule_[t.id].assign(t.shape.size(), 1);
  struct Dim {
    int tensor;
    int64_t dim;
  };
  std::vector<std::vector<Dim>> groups;               // operands that must split alike
  std::vector<std::tuple<Dim, Dim, int64_t>> merges;  // out = in x factor (reshape)
  for (const Instruction& in : program_.instructions) {
    if (in.kind != InstrKind::Compute || in.signature < 0) continue;
    const synth::GraphNode& n = graph_.nodes[in.node];
    const ops::ShardSignature sig = signatures_of(graph_, n)[in.signature];
    std::vector<Dim> group;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] >= 0 && sig.inputs[k].kind == ops::PropKind::Sharded)
        group.push_back({n.inputs[k], sig.inputs[k].dim});
    std::vector<Dim> outs;
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (sig.outputs[o].kind == ops::PropKind::Sharded)
        outs.push_back({n.outputs[o], sig.outputs[o].dim});
    if (n.kind == ops::OpKind::Reshape && !group.empty() && !outs.empty()) {
      int64_t a = graph_.tensors[group[0].tensor].shape[group[0].dim];
      int64_t b = graph_.tensors[outs[0].tensor].shape[outs[0].dim];
      if (a > 0 && b % a == 0) merges.push_back({group[0], outs[0], b / a});
      continue;
    }
    group.insert(group.end(), outs.begin(), outs.end());
    if (group.size() > 1) groups.push_back(group);
  }
  auto& g = granule_;
  for (bool changed = true; changed;) {
    changed = false;
    auto raise = [&](const Dim& d, int64_t v) {
      int64_t n = graph_.tensors[d.tensor].shape[d.dim];
      int64_t cur = g[d.tensor][d.dim];
      int64_t want = std::lcm(cur, v);
      if (want != cur && n % want == 0) {
        g[d.tensor][d.dim] = want;
        changed = true;
      }
    };
    for (const auto& group : groups) {
      int64_t l = 1;
      for (const Dim& d : group) l = std::lcm(l, g[d.tensor][d.dim]);
      for (const Dim& d : group) raise(d, l);
    }
    for (const auto& [in, out, factor] : merges) {
      raise(out, g[in.tensor][in.dim] * factor);
      if (g[out.tensor][out.dim] % factor == 0) raise(in, g[out.tensor][out.dim] / factor);
    }
  }
}

std::vector<int64_t> Executor::lengths(int tensor, const Prop& p, int segment) const {
  HAP_ASSERT(p.kind == ops::PropKind::Sharded);
  int64_t n = graph_.tensors[tensor].shape[p.dim];
  int64_t g = granule_[tensor][p.dim];
  if (g <= 0 || n % g != 0) g = 1;
  std::vector<int64_t> l = shard_lengths(n / g, program_.ratios[segment]);
  for (int64_t& x : l) x *= g;
  return l;
}

Prop Executor::storage(const std::string& name) const {
  auto it = param_tensor_.find(name);
  HAP_CHECK(it != param_tensor_.end(), "executor: no parameter named '", name, "'");
  return program_.storage[it->second];
}

void Executor::materialize_parameters(const TensorSource& source) {
  params_.clear();
  param_local_.clear();
  for (const auto& [name, t] : param_tensor_) {
    (void)name;
    const synth::GraphTensor& gt = graph_.tensors[t];
    Prop p = program_.storage[t];
    Tensor local;
    if (p.kind == ops::PropKind::Sharded) {
      int seg = param_segment_.count(t) ? param_segment_.at(t) : 0;
      ShardSpec spec(p.dim, lengths(t, p, seg));
      local = source(gt.name, spec.local_shape(gt.shape, comm_.rank()),
                     spec.logical_slice(gt.shape, comm_.rank()));
    } else {
      local = source(gt.name, gt.shape, LogicalSlice{});
    }
    local = local.detach();
    local.set_requires_grad(true);
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
    Prop s = program_.storage[t];
    HAP_ASSERT(s == p, "parameter ", gt.name, " stored ", s.str(), " but read as ", p.str());
    const Tensor& leaf = param_local_.at(t);
    // A Replicated parameter's replicas are one tensor: its Partial gradient is all-reduced in
    // backward(), bucketed with the others.
    return leaf;
  }
  HAP_CHECK(gt.role == synth::TensorRole::Input, "executor: tensor %", t, " (", gt.name,
            ") is a constant made during tracing; the executor cannot recreate its data yet");
  if (p.kind == ops::PropKind::Sharded) {
    ShardSpec spec(p.dim, lengths(t, p, segment));
    return (*inputs)(gt.name, spec.local_shape(gt.shape, comm_.rank()),
                     spec.logical_slice(gt.shape, comm_.rank()));
  }
  return (*inputs)(gt.name, gt.shape, LogicalSlice{});
}

Tensor Executor::forward(const TensorSource& inputs, const ForwardOptions& options) {
  const uint64_t random_offset = options.random_offset;
  const bool training = options.training;
  values_.assign(graph_.tensors.size(), {});
  const int rank = comm_.rank();
  for (const Instruction& in : program_.instructions) {
    if (in.kind == InstrKind::Compute) {
      const synth::GraphNode& n = graph_.nodes[in.node];
      std::vector<ops::ShardSignature> sigs = signatures_of(graph_, n);
      auto in_prop = [&](size_t k) {
        return in.signature < 0 ? Prop::replicated() : sigs[in.signature].inputs[k];
      };
      auto out_prop = [&](size_t o) {
        return in.signature < 0 ? Prop::replicated() : sigs[in.signature].outputs[o];
      };
      std::vector<Tensor> args;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        int t = n.inputs[k];
        if (t < 0) {
          args.emplace_back();
          continue;
        }
        Prop q = in_prop(k);
        auto it = values_[t].find(q.str());
        if (it == values_[t].end()) {
          HAP_ASSERT(graph_.tensors[t].producer < 0, "tensor %", t, " has no ", q.str(), " value");
          it = values_[t].emplace(q.str(), leaf_value(t, q, in.segment, &inputs)).first;
        }
        args.push_back(it->second);
      }
      // Localise attributes that hold global sizes or positions.
      ops::Attrs attrs = n.attrs;
      double post_scale = 1.0;
      bool vocab_parallel = false;  // computed whole by vocab_parallel_cross_entropy
      switch (n.kind) {
        case ops::OpKind::Reshape: {
          // The sharded output dim holds whatever the local input has left after the other dims.
          Prop o = out_prop(0);
          Shape target = graph_.tensors[n.outputs[0]].shape;
          if (o.kind == ops::PropKind::Sharded) {
            int64_t rest = shape_numel(target) / target[o.dim];
            target[o.dim] = rest > 0 ? args[0].numel() / rest : 0;
          }
          attrs = ops::ShapeAttrs{target};
          break;
        }
        case ops::OpKind::Expand: {
          Prop o = out_prop(0);
          Shape target = graph_.tensors[n.outputs[0]].shape;
          if (o.kind == ops::PropKind::Sharded)
            target[o.dim] = lengths(n.outputs[0], o, in.segment)[rank];
          attrs = ops::ShapeAttrs{target};
          break;
        }
        case ops::OpKind::Mean: {
          const Shape& s = graph_.tensors[n.inputs[0]].shape;
          Prop q = in_prop(0);
          if (q.kind == ops::PropKind::Sharded) {
            auto dims = std::get<ops::ReduceAttrs>(n.attrs).dims;
            bool reduced = dims.empty();
            for (int64_t d : dims)
              reduced = reduced || (d < 0 ? d + static_cast<int64_t>(s.size()) : d) == q.dim;
            if (reduced)
              post_scale =
                  static_cast<double>(lengths(n.inputs[0], q, in.segment)[rank]) / s[q.dim];
          }
          break;
        }
        case ops::OpKind::CrossEntropy: {
          if (in_prop(0).kind == ops::PropKind::Sharded && in_prop(0).dim == 1) {
            ShardSpec spec(1, lengths(n.inputs[0], in_prop(0), in.segment));
            ops::ScopeGuard scope(n.module);
            values_[n.outputs[0]][out_prop(0).str()] = vocab_parallel_cross_entropy(
                args[0], args[1], spec.offset(rank),
                std::get<ops::CrossEntropyAttrs>(n.attrs).ignore_index);
            vocab_parallel = true;
            break;
          }
          if (out_prop(0).kind == ops::PropKind::Partial) {
            int64_t ignore = std::get<ops::CrossEntropyAttrs>(n.attrs).ignore_index;
            int64_t local = 0;
            Tensor tg = args[1].contiguous();
            const int64_t* p = tg.data<int64_t>();
            for (int64_t i = 0; i < tg.numel(); ++i) local += p[i] != ignore;
            int64_t global = comm_.allreduce(local);
            post_scale =
                global > 0 ? static_cast<double>(local) / static_cast<double>(global) : 0.0;
          }
          break;
        }
        case ops::OpKind::Dropout: {
          Prop q = in_prop(0);
          auto& r = std::get<ops::RandomAttrs>(attrs);
          r.stream += random_offset;
          if (options.random_seed) r.seed = *options.random_seed;
          if (!training) r.p = 0;
          if (q.kind == ops::PropKind::Sharded) {
            const Shape& s = graph_.tensors[n.inputs[0]].shape;
            ShardSpec spec(q.dim, lengths(n.inputs[0], q, in.segment));
            r.slice = spec.logical_slice(s, rank);
          }
          break;
        }
        case ops::OpKind::Attention: {
          Prop q = in_prop(0);
          auto& a = std::get<ops::AttentionAttrs>(attrs);
          a.dropout.stream += random_offset;
          if (options.random_seed) a.dropout.seed = *options.random_seed;
          if (!training) a.dropout.p = 0;
          if (q.kind == ops::PropKind::Sharded && a.dropout.p > 0) {
            const Shape& s = graph_.tensors[n.inputs[0]].shape;  // [B, H, T, D]
            Shape probs = {s[0], s[1], s[2], graph_.tensors[n.inputs[1]].shape[2]};
            ShardSpec spec(q.dim, lengths(n.inputs[0], q, in.segment));
            a.dropout.slice = spec.logical_slice(probs, rank);
          }
          break;
        }
        case ops::OpKind::Embedding: {
          Prop w = in_prop(0);
          if (w.kind == ops::PropKind::Sharded) {
            HAP_CHECK(w.dim == 0 || out_prop(0).kind == ops::PropKind::Sharded,
                      "executor: embedding signature not supported");
            if (w.dim == 0) {
              ShardSpec spec(0, lengths(n.inputs[0], w, in.segment));
              attrs = ops::SliceAttrs{0, spec.offset(rank), spec.offset(rank) + spec.length(rank)};
            }
          }
          break;
        }
        default:
          break;
      }
      if (vocab_parallel) continue;
      ops::ScopeGuard scope(n.module);
      std::vector<Tensor> outs;
      if (n.kind == ops::OpKind::Dropout && std::get<ops::RandomAttrs>(attrs).p == 0)
        outs = {args[0]};
      else
        outs = ops::call(n.kind, args, attrs);
      if (post_scale != 1.0)
        outs[0] = ops::call1(ops::OpKind::MulScalar, {outs[0]}, ops::ScalarAttrs{post_scale});
      for (size_t o = 0; o < outs.size(); ++o) values_[n.outputs[o]][out_prop(o).str()] = outs[o];
      continue;
    }
    // Done elsewhere: gradient sums in backward(), updates by the optimizer.
    if (in.kind == InstrKind::GradAllReduce || in.kind == InstrKind::Update) continue;
    int t = in.tensor;
    auto it = values_[t].find(in.from.str());
    if (it == values_[t].end()) {
      HAP_ASSERT(graph_.tensors[t].producer < 0, "tensor %", t, " has no ", in.from.str(),
                 " value");
      it = values_[t].emplace(in.from.str(), leaf_value(t, in.from, in.segment, &inputs)).first;
    }
    Tensor x = it->second, y;
    const CollectiveMethod m = in.method;
    switch (in.kind) {
      case InstrKind::AllGather:
        y = functional::all_gather(comm_, x, in.from.dim, lengths(t, in.from, in.from_segment), m);
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
        // (differentiable both ways; a point-to-point exchange would move less).
        std::vector<int64_t> from = lengths(t, in.from, in.from_segment),
                             to = lengths(t, in.to, in.segment);
        // A reshard the cost model found free carries no method: it moves like any other if the
        // whole-granule lengths differ after all.
        const CollectiveMethod gather = m == CollectiveMethod::None ? CollectiveMethod::Grouped : m;
        y = from == to ? x
                       : functional::shard_slice(
                             comm_, functional::all_gather(comm_, x, in.from.dim, from, gather),
                             in.to.dim, to);
        break;
      }
      default:
        HAP_ASSERT(false, "unexpected instruction");
    }
    values_[t][in.to.str()] = y;
  }
  const auto& lv = values_[graph_.loss];
  if (auto it = lv.find(Prop::partial().str()); it != lv.end()) return it->second;
  auto it = lv.find(Prop::replicated().str());
  HAP_CHECK(it != lv.end(), "executor: the loss is neither Partial nor Replicated in this program");
  return functional::to_partial(comm_, it->second);
}

Tensor Executor::vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                              int64_t vocab_offset, int64_t ignore_index) const {
  // logits: [N, V_r], columns [vocab_offset, vocab_offset + V_r) of the logical [N, V];
  // targets: [N], whole. Returns this rank's addend of the mean loss over counted targets:
  //   loss = sum_i valid_i * (lse_i - x_i[t_i]) / count,  lse_i = log sum_r exp(lse_r,i)
  // as to_partial(sum_i valid_i lse_i / count) - sum_i mine_i lse_r,i / count + (the local
  // cross-entropy over the targets this rank holds) * local / count, which sums over ranks to the
  // loss because each counted target is held by exactly one rank.
  const int64_t N = logits.size(0), V_r = logits.size(1);
  HAP_CHECK(V_r > 0,
            "executor: vocabulary-parallel cross_entropy on a rank with no vocabulary "
            "columns (rank ",
            comm_.rank(), "); its ratio is too small for this vocabulary");
  Tensor t = targets.contiguous();
  const int64_t* pt = t.data<int64_t>();
  std::vector<int64_t> local_targets(static_cast<size_t>(N));
  std::vector<double> valid(static_cast<size_t>(N)), mine(static_cast<size_t>(N));
  int64_t count = 0, held = 0;
  for (int64_t i = 0; i < N; ++i) {
    const bool counted = pt[i] != ignore_index;
    const bool here = counted && pt[i] >= vocab_offset && pt[i] < vocab_offset + V_r;
    count += counted;
    held += here;
    valid[i] = counted ? 1.0 : 0.0;
    mine[i] = here ? 1.0 : 0.0;
    local_targets[i] = here ? pt[i] - vocab_offset : ignore_index;
  }
  const TensorOptions f32 = TensorOptions{}.with_dtype(logits.dtype());
  Tensor zero = hap::sum(logits) * 0.0;  // keeps the graph connected when nothing counts
  if (count == 0) return zero;
  auto logsumexp = [](const Tensor& x, int64_t dim) {  // over `dim`, which is dropped
    Tensor m = hap::max(x, dim, /*keepdim=*/true).detach();
    return hap::squeeze(m, dim) + hap::log(hap::sum(hap::exp(x - m), {dim}));
  };
  Tensor lse_r = logsumexp(logits, 1);  // [N]
  std::vector<int64_t> ones(static_cast<size_t>(comm_.size()), 1);
  Tensor all = functional::all_gather(comm_, hap::reshape(lse_r, {1, N}), 0, ones,
                                      CollectiveMethod::Grouped);  // [R, N]
  Tensor lse = logsumexp(all, 0);                                  // [N], the same on every rank
  Tensor valid_t = Tensor::from_vector(valid, {N}, f32);
  Tensor mine_t = Tensor::from_vector(mine, {N}, f32);
  const double c = static_cast<double>(count);
  Tensor loss =
      functional::to_partial(comm_, hap::sum(lse * valid_t) / c) - hap::sum(lse_r * mine_t) / c;
  if (held > 0) {
    Tensor tl = Tensor::from_vector(local_targets, {N});
    loss = loss + hap::cross_entropy(logits, tl, ignore_index) * (static_cast<double>(held) / c);
  }
  return loss + zero;
}

void Executor::backward(const Tensor& local_loss) {
  local_loss.backward();
  constexpr int64_t kBucketBytes = int64_t{32} << 20;
  NoGradGuard no_grad;
  // Every rank runs the same program, so the same gradients are defined on every rank.
  std::vector<std::pair<Tensor, Tensor>> pending;  // (parameter, local gradient)
  int64_t pending_bytes = 0;
  auto flush = [&]() {
    if (pending.empty()) return;
    std::vector<Tensor> flat;
    std::vector<int64_t> sizes;
    for (const auto& [p, g] : pending) {
      flat.push_back(hap::reshape(g.contiguous(), {g.numel()}));
      sizes.push_back(g.numel());
    }
    Tensor sum = parallel::all_reduce(comm_, flat.size() == 1 ? flat[0] : hap::concat(flat, 0));
    std::vector<Tensor> parts = hap::split(sum, sizes, 0);
    for (size_t i = 0; i < pending.size(); ++i)
      pending[i].first.set_grad(hap::reshape(parts[i], pending[i].second.shape()).contiguous());
    pending.clear();
    pending_bytes = 0;
  };
  for (const auto& [name, p] : params_) {
    if (storage(name).kind != ops::PropKind::Replicated) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const int64_t bytes = g.numel() * static_cast<int64_t>(dtype_size(g.dtype()));
    if (!pending.empty() &&
        (pending.front().second.dtype() != g.dtype() || pending_bytes + bytes > kBucketBytes))
      flush();
    pending.push_back({p, g});
    pending_bytes += bytes;
  }
  flush();
}

double Executor::global_loss(const Tensor& local_loss) const {
  return comm_.allreduce(local_loss.item());
}

double Executor::global_grad_norm() const {
  double replicated = 0, sharded = 0;
  for (const auto& [name, p] : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const double s = hap::sum_of_squares(g);
    (storage(name).kind == ops::PropKind::Sharded ? sharded : replicated) += s;
  }
  return std::sqrt(replicated + comm_.allreduce(sharded));
}

void Executor::scale_grads(double factor) const {
  NoGradGuard no_grad;
  for (const auto& [name, p] : params_) {
    Tensor g = p.grad();
    if (g.defined()) p.set_grad(ops::call1(ops::OpKind::MulScalar, {g}, ops::ScalarAttrs{factor}));
  }
}

Tensor Executor::gather(const Tensor& local, int t, const Prop& p, int segment) const {
  if (p.kind != ops::PropKind::Sharded) return local;
  return all_gather(comm_, local.contiguous(), p.dim, lengths(t, p, segment),
                    CollectiveMethod::Grouped);
}

Tensor Executor::gathered_grad(const std::string& name) const {
  int t = param_tensor_.at(name);
  Tensor g = param_local_.at(t).grad();
  HAP_CHECK(g.defined(), "executor: parameter '", name, "' has no gradient");
  return gather(g, t, program_.storage[t], param_segment_.count(t) ? param_segment_.at(t) : 0);
}

Tensor Executor::gathered_like(const std::string& name, const Tensor& local) const {
  int t = param_tensor_.at(name);
  return gather(local.detach(), t, program_.storage[t],
                param_segment_.count(t) ? param_segment_.at(t) : 0);
}

LogicalSlice Executor::slice_of(const std::string& name) const {
  int t = param_tensor_.at(name);
  Prop p = program_.storage[t];
  if (p.kind != ops::PropKind::Sharded) return {};
  ShardSpec spec(p.dim, lengths(t, p, param_segment_.count(t) ? param_segment_.at(t) : 0));
  return spec.logical_slice(graph_.tensors[t].shape, comm_.rank());
}

Tensor Executor::gathered_value(const std::string& name) const {
  int t = param_tensor_.at(name);
  return gather(param_local_.at(t).detach(), t, program_.storage[t],
                param_segment_.count(t) ? param_segment_.at(t) : 0);
}

}  // namespace hap::parallel
