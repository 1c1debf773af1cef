#include "autograd/engine.h"

#include <atomic>
#include <queue>
#include <unordered_map>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "ops/dispatch.h"

namespace hap::autograd {

namespace {

thread_local bool t_grad_enabled = true;
thread_local BackwardObserver* t_observer = nullptr;
std::atomic<uint64_t> g_sequence{0};

std::shared_ptr<Node> edge_for(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return nullptr;
  if (t.grad_fn()) return t.grad_fn();
  auto acc = std::make_shared<Node>();
  acc->is_accumulate = true;
  acc->leaf = t.impl_ptr();
  acc->output_meta = {{t.shape(), t.dtype()}};
  acc->sequence = g_sequence++;
  return acc;
}

// How a node keeps its inputs for backward.
enum class Save { None, Data, Metas };
void link_inputs(Node& node, const std::vector<Tensor>& inputs, Save save);
void attach_outputs(const std::shared_ptr<Node>& node, std::vector<Tensor>& outputs);

// How to make `t` again, detached, where it is a leaf needing a gradient (itself) or a view of
// one made by view ops only (AutogradMeta::view_source); null otherwise.
std::shared_ptr<const std::function<Tensor()>> view_source_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad() || !t.has_storage()) return nullptr;
  if (!t.grad_fn()) {
    const Tensor leaf = t.detach();
    return std::make_shared<const std::function<Tensor()>>([leaf] { return leaf; });
  }
  return t.impl()->autograd->view_source;
}

// Installed as ops' record hook: attaches a Node to the outputs of a call that needs a gradient.
void record(ops::OpKind kind, const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs,
            const ops::Attrs& attrs) {
  if (!t_grad_enabled || ops::in_route_scope()) return;  // a routed op records as itself
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  const ops::OpDef& def = ops::op_def(kind);
  if (!def.backward) return;  // not differentiable: outputs carry no history
  auto node = std::make_shared<Node>();
  node->kind = kind;
  node->attrs = attrs;
  link_inputs(*node, inputs,
              !def.saves_inputs      ? Save::None
              : def.input_metas_only ? Save::Metas
                                     : Save::Data);
  if (ops::recording_routed_call()) {
    node->widen = true;
    for (const Tensor& t : inputs) node->input_dtypes.push_back(t.defined() ? t.dtype() : DType{});
  }
  if (def.saves_outputs) {
    const std::vector<Tensor>& saved =
        ops::recording_routed_call() ? ops::routed_f32_outputs() : outputs;
    node->saved_outputs.reserve(saved.size());
    for (const Tensor& t : saved) node->saved_outputs.push_back(t.detach());
  }
  attach_outputs(node, outputs);
  if (ops::autocast_dtype() != DType::BF16) return;
  // Mixed precision's bf16 copy of a leaf (a parameter, cast for a product) or of a view of one
  // (a slice of a stacked weight): the ops saving it for backward cast it again there instead of
  // keeping the copy through the step, so that bf16 training does not hold a second, bf16 set of
  // weights (the cast is exact and cheap).
  if (kind == ops::OpKind::Cast && outputs[0].dtype() == DType::BF16) {
    if (auto source = view_source_of(inputs[0]))
      outputs[0].impl()->autograd->remake =
          std::make_shared<const std::function<Tensor()>>([source] {
            return ops::call1(ops::OpKind::Cast, {(*source)()}, ops::CastAttrs{DType::BF16});
          });
    return;
  }
  // A view of a leaf or of such a view (every output shares the first input's storage, no other
  // input needs a gradient): remember how to make it again from the leaf.
  if (!inputs[0].defined() || !inputs[0].has_storage()) return;
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) return;
  for (const Tensor& out : outputs)
    if (!out.has_storage() || out.impl()->storage != inputs[0].impl()->storage ||
        !out.impl()->autograd)
      return;
  auto source = view_source_of(inputs[0]);  // made only for a view: ops on leaves are many
  if (!source) return;
  std::vector<Tensor> others(inputs.size());
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i].defined()) others[i] = inputs[i].detach();
  for (size_t i = 0; i < outputs.size(); ++i)
    outputs[i].impl()->autograd->view_source =
        std::make_shared<const std::function<Tensor()>>([source, others, kind, attrs, i] {
          std::vector<Tensor> in = others;
          in[0] = (*source)();
          return ops::call(kind, std::move(in), attrs)[i];
        });
}

void link_inputs(Node& node, const std::vector<Tensor>& inputs, Save save) {
  node.sequence = g_sequence++;
  node.next.resize(inputs.size());
  node.needs_input_grad.resize(inputs.size());
  node.saved_inputs.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) continue;
    if (save == Save::Metas) {
      node.saved_inputs[i] = Tensor::meta(t.shape(), t.dtype(), t.device());
    } else if (save == Save::Data) {
      const AutogradMeta* meta = t.impl()->autograd.get();
      if (meta && meta->remake) {
        node.remake_inputs.resize(inputs.size());
        node.remake_inputs[i] = {meta->remake, t.shape(), t.dtype()};
      } else {
        node.saved_inputs[i] = t.detach();
      }
    }
    if (t.requires_grad()) {
      node.next[i] = {edge_for(t), t.grad_fn() ? t.impl()->autograd->output_nr : 0u};
      node.needs_input_grad[i] = true;
    }
  }
}

void attach_outputs(const std::shared_ptr<Node>& node, std::vector<Tensor>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& out = outputs[i];
    node->output_meta.push_back({out.shape(), out.dtype()});
    if (!is_floating(out.dtype())) continue;
    auto meta = std::make_unique<AutogradMeta>();
    meta->requires_grad = true;
    meta->grad_fn = node;
    meta->output_nr = static_cast<uint32_t>(i);
    out.impl()->autograd = std::move(meta);
  }
}

const bool g_hook_installed = (ops::set_record_hook(&record), true);

// The first gradient stored in a leaf's .grad, as a buffer no one else holds. Backward rules pass
// gradients through unchanged (add gives both inputs the same tensor; a leaf root gets the
// caller's grad_output), and a shared buffer would let an in-place update of one .grad (zeroing,
// clipping, an optimizer step) change another leaf's gradient or the caller's tensor. `g` is held
// here and by the node's buffer; any other handle or view means a copy.
Tensor owned_grad(const Tensor& g) {
  bool sole = g.impl_ptr().use_count() <= 2 && g.has_storage() &&
              g.impl()->storage.use_count() == 1 && g.is_contiguous();
  return sole ? g : g.clone();
}

Tensor add_grads(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return ops::call1(ops::OpKind::Add, {a, b});
}

using Buffers = std::unordered_map<Node*, std::vector<Tensor>>;

// bf16 tensors widened to f32 (Node::widen), the others as they are.
std::vector<Tensor> widened(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out = ts;
  for (Tensor& t : out)
    if (t.defined() && t.dtype() == DType::BF16)
      t = t.has_storage() ? ops::call1(ops::OpKind::Cast, {t}, ops::CastAttrs{DType::F32})
                          : Tensor::meta(t.shape(), DType::F32, t.device());  // Save::Metas
  return out;
}

// The backward of a node with gather_factors: the unmarked inputs' gradients from the local
// factors, the marked ones' from the whole factors.
std::vector<Tensor> factor_backward(const Node& node, const std::vector<Tensor>& saved_inputs,
                                    const std::vector<Tensor>& grads, const char* name) {
  const Node::GatherFactors& f = *node.factors;
  const ops::OpDef& def = ops::op_def(node.kind);
  std::vector<bool> local_needs = node.needs_input_grad, whole_needs(local_needs.size(), false);
  bool any_local = false;
  for (size_t i = 0; i < local_needs.size(); ++i) {
    whole_needs[i] = f.whole[i] && local_needs[i];
    local_needs[i] = local_needs[i] && !f.whole[i];
    any_local = any_local || local_needs[i];
  }
  std::vector<Tensor> out(node.next.size());
  if (any_local) {
    ops::BackwardContext ctx{node.kind, saved_inputs, node.saved_outputs,
                             grads,     node.attrs,   local_needs};
    out = def.backward(ctx);
  }
  std::vector<Tensor> inputs = saved_inputs, whole_grads(grads.size());
  std::vector<Node::Factor> factors;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!f.whole[i] && inputs[i].defined()) factors.push_back({false, i, inputs[i]});
  for (size_t o = 0; o < grads.size(); ++o)
    if (grads[o].defined()) factors.push_back({true, o, grads[o]});
  const std::vector<Tensor> made = f.gather(factors);
  HAP_CHECK(made.size() == factors.size(), "backward of ", name, ": the factor gather returned ",
            made.size(), " tensors for ", factors.size(), " factors");
  for (size_t k = 0; k < factors.size(); ++k) {
    const Node::Factor& x = factors[k];
    Tensor& slot = x.grad ? whole_grads[x.index] : inputs[x.index];
    HAP_CHECK(
        made[k].defined() && made[k].dtype() == x.local.dtype() && made[k].dim() == x.local.dim(),
        "backward of ", name, ": the factor gather made ",
        made[k].defined() ? made[k].str() : "an undefined tensor", " of ", x.local.str());
    slot = made[k];
  }
  ops::BackwardContext ctx{node.kind,   inputs,     node.saved_outputs,
                           whole_grads, node.attrs, whole_needs};
  std::vector<Tensor> whole = def.backward(ctx);
  HAP_ASSERT(whole.size() == out.size(), "backward of ", name, " returned ", whole.size(),
             " gradients for ", out.size(), " inputs");
  for (size_t i = 0; i < out.size(); ++i)
    if (whole_needs[i]) out[i] = whole[i];
  return out;
}

// A leaf's AccumulateGrad: adds the gradient into .grad (or into `capture`).
void accumulate(const std::vector<Tensor>& grads, const std::shared_ptr<TensorImpl>& leaf_impl,
                std::unordered_map<TensorImpl*, Tensor>* capture, bool strict) {
  if (!leaf_impl || grads.empty() || !grads[0].defined()) return;
  Tensor g = grads[0];
  Tensor leaf(leaf_impl);
  HAP_ASSERT(g.shape() == leaf.shape(), "gradient shape ", shape_str(g.shape()), " for leaf ",
             leaf.str());
  if (capture) {
    auto it = capture->find(leaf_impl.get());
    HAP_CHECK(it != capture->end() || !strict, "a recomputed function (autograd::checkpoint) ",
              "reads a tensor that requires grad but is not among its inputs: ", leaf.str(),
              "; pass every parameter it uses as an input, or its gradient is lost");
    if (it != capture->end()) it->second = add_grads(it->second, g);
    return;
  }
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  Tensor old = leaf.grad();
  leaf.set_grad(old.defined() ? add_grads(old, g) : owned_grad(g));
}

// Runs the backward graph from the given roots. With `capture`, gradients reaching the leaves
// in `capture` are returned instead of accumulated into .grad.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs,
                  std::unordered_map<TensorImpl*, Tensor>* capture, bool strict = false) {
  HAP_CHECK(roots.size() == grad_outputs.size(), "backward: ", roots.size(), " roots but ",
            grad_outputs.size(), " gradients");
  NoGradGuard no_grad;
  // Backward ops take the dtypes their forward ops saw (mixed precision casts only forward).
  ops::AutocastGuard no_autocast(DType::F32);
  Buffers buffers;
  std::vector<std::shared_ptr<Node>> starts;
  for (size_t r = 0; r < roots.size(); ++r) {
    const Tensor& root = roots[r];
    HAP_CHECK(root.defined() && root.requires_grad(), "backward: tensor ",
              root.defined() ? root.str() : "undefined",
              " does not require grad and has no grad_fn (did a parameter miss requires_grad, or "
              "was it computed under no_grad?)");
    Tensor g = grad_outputs[r];
    if (!g.defined()) {
      HAP_CHECK(root.numel() == 1, "backward: implicit gradient needs a scalar output, got ",
                root.str(), "; pass a grad_output of the same shape");
      g = Tensor::ones(root.shape(),
                       TensorOptions{}.with_dtype(root.dtype()).with_device(root.device()));
    }
    HAP_CHECK(g.shape() == root.shape(), "backward: grad_output shape ", shape_str(g.shape()),
              " differs from output shape ", shape_str(root.shape()));
    HAP_CHECK(g.dtype() == root.dtype(), "backward: grad_output dtype ", dtype_name(g.dtype()),
              " differs from output dtype ", dtype_name(root.dtype()));
    std::shared_ptr<Node> node = edge_for(root);
    uint32_t nr = root.grad_fn() ? root.impl()->autograd->output_nr : 0u;
    auto& buf = buffers[node.get()];
    buf.resize(node->output_meta.size());
    buf[nr] = add_grads(buf[nr], g);
    starts.push_back(node);
  }

  // Count, for every node reachable from the roots, how many edges point at it.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& s : starts)
    if (!seen[s.get()]) {
      seen[s.get()] = true;
      stack.push_back(s.get());
    }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (!e.node) continue;
      deps[e.node.get()]++;
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }

  // Accumulations per leaf still to run (each use of a leaf has its own), for the observer.
  BackwardObserver* observer = capture ? nullptr : t_observer;
  std::unordered_map<TensorImpl*, int> leaf_pending;
  if (observer)
    for (const auto& [n, unused] : seen)
      if (n->is_accumulate)
        if (auto impl = n->leaf.lock()) ++leaf_pending[impl.get()];

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence < b->sequence;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>,
                      decltype(later_first)>
      ready(later_first);
  // A root that another root's graph reaches waits for its dependencies like any other node;
  // a root given twice is queued once (its buffer already holds both gradients).
  std::unordered_map<Node*, bool> queued;
  for (auto& s : starts)
    if (deps[s.get()] == 0 && !queued[s.get()]) {
      queued[s.get()] = true;
      ready.push(s);
    }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());

    if (node->is_accumulate) {
      auto leaf_impl = node->leaf.lock();
      accumulate(grads, leaf_impl, capture, strict);
      if (observer) {
        if (leaf_impl && --leaf_pending[leaf_impl.get()] == 0)
          observer->leaf_done(Tensor(leaf_impl));
        observer->node_done();
      }
      continue;
    }

    const char* name = node->custom ? node->custom_name : ops::op_name(node->kind);
    // Saved inputs that were not kept are made again, whether or not a gradient arrived (every
    // rank of an SPMD program runs the same nodes in the same order, and a remake may be a
    // collective), and dropped after.
    for (size_t i = 0; i < node->remake_inputs.size(); ++i)
      if (const Node::Remake& r = node->remake_inputs[i]; r.make) {
        Tensor v = (*r.make)();
        HAP_CHECK(v.defined() && v.shape() == r.shape && v.dtype() == r.dtype, "backward of ", name,
                  ": input ", i, " made again as ", v.defined() ? v.str() : "undefined",
                  ", it was ", dtype_name(r.dtype), shape_str(r.shape));
        node->saved_inputs[i] = v.detach();
      }
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> in_grads;
    if (any) {
      if (node->custom) {
        in_grads = node->custom(grads);
      } else {
        std::vector<Tensor> wide_saved, wide_grads;  // only for a routed op's node
        if (node->widen) {
          wide_saved = widened(node->saved_inputs);
          wide_grads = widened(grads);
        }
        const std::vector<Tensor>& saved = node->widen ? wide_saved : node->saved_inputs;
        const std::vector<Tensor>& g = node->widen ? wide_grads : grads;
        if (!node->factors) {
          ops::BackwardContext ctx{node->kind, saved,       node->saved_outputs,
                                   g,          node->attrs, node->needs_input_grad};
          in_grads = ops::op_def(node->kind).backward(ctx);
        } else {
          in_grads = factor_backward(*node, saved, g, name);
        }
      }
      HAP_ASSERT(in_grads.size() == node->next.size(), "backward of ", name, " returned ",
                 in_grads.size(), " gradients for ", node->next.size(), " inputs");
      if (node->widen)
        for (size_t i = 0; i < in_grads.size(); ++i)
          if (in_grads[i].defined() && in_grads[i].dtype() != node->input_dtypes[i])
            in_grads[i] =
                ops::call1(ops::OpKind::Cast, {in_grads[i]}, ops::CastAttrs{node->input_dtypes[i]});
    }
    for (size_t i = 0; i < node->remake_inputs.size(); ++i)
      if (node->remake_inputs[i].make) node->saved_inputs[i] = Tensor();
    for (size_t i = 0; i < node->next.size(); ++i) {
      const Edge& e = node->next[i];
      if (!e.node) continue;
      if (any && in_grads[i].defined()) {
        auto& buf = buffers[e.node.get()];
        buf.resize(e.node->output_meta.size());
        const ops::TensorMeta& m = e.node->output_meta[e.output_nr];
        HAP_ASSERT(in_grads[i].shape() == m.shape, "backward of ", name, ": gradient ", i,
                   " has shape ", shape_str(in_grads[i].shape()), ", expected ",
                   shape_str(m.shape));
        buf[e.output_nr] = add_grads(buf[e.output_nr], in_grads[i]);
      }
      if (--deps[e.node.get()] == 0 && !queued[e.node.get()]) {
        queued[e.node.get()] = true;
        ready.push(e.node);
      }
    }
    if (observer) observer->node_done();
  }
}

}  // namespace

ObserveBackward::ObserveBackward(BackwardObserver* observer) : prev_(t_observer) {
  t_observer = observer;
}
ObserveBackward::~ObserveBackward() { t_observer = prev_; }

bool GradMode::is_enabled() { return t_grad_enabled; }
void GradMode::set_enabled(bool enabled) {
  (void)g_hook_installed;
  t_grad_enabled = enabled;
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs) {
  run_backward(roots, grad_outputs, nullptr);
}

std::vector<Tensor> record_custom(const char* name, const std::vector<Tensor>& inputs,
                                  std::vector<Tensor> outputs, CustomBackward backward) {
  if (!t_grad_enabled) return outputs;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return outputs;
  for (Tensor& out : outputs)
    for (const Tensor& in : inputs)
      if (out.same(in)) out = out.detach();
  auto node = std::make_shared<Node>();
  node->custom = std::move(backward);
  node->custom_name = name;
  link_inputs(*node, inputs, Save::None);
  attach_outputs(node, outputs);
  return outputs;
}

Tensor rematerializable(const Tensor& t, std::function<Tensor()> remake) {
  HAP_CHECK(t.defined() && t.requires_grad(),
            "autograd::rematerializable: the tensor must require grad (it has nothing to save "
            "otherwise), got ",
            t.defined() ? t.str() : "an undefined tensor");
  HAP_CHECK(static_cast<bool>(remake), "autograd::rematerializable: no function given");
  t.impl()->autograd->remake = std::make_shared<const std::function<Tensor()>>(std::move(remake));
  return t;
}

Tensor gather_factors(const Tensor& output, std::vector<bool> whole, Node::GatherFn gather) {
  HAP_CHECK(output.defined() && output.grad_fn(),
            "autograd::gather_factors: the tensor must be an op output with history, got ",
            output.defined() ? output.str() : "an undefined tensor");
  HAP_CHECK(static_cast<bool>(gather), "autograd::gather_factors: no gather function given");
  Node& node = *output.grad_fn();
  HAP_CHECK(!node.custom && !node.is_accumulate,
            "autograd::gather_factors: the tensor must be the output of a registry op");
  const char* name = ops::op_name(node.kind);
  const ops::OpDef& def = ops::op_def(node.kind);
  HAP_CHECK(def.saves_inputs && !def.saves_outputs, "autograd::gather_factors: ", name,
            "'s backward reads its outputs (only ops whose backward reads their inputs can "
            "take whole factors)");
  HAP_CHECK(whole.size() == node.next.size(), "autograd::gather_factors: ", whole.size(),
            " flags for ", name, "'s ", node.next.size(), " inputs");
  HAP_CHECK(node.remake_inputs.empty(), "autograd::gather_factors: ", name,
            " has inputs made again in backward (autograd::rematerializable)");
  bool any = false;
  for (size_t i = 0; i < whole.size(); ++i) {
    HAP_CHECK(!whole[i] || node.needs_input_grad[i], "autograd::gather_factors: ", name,
              "'s input ", i, " is marked but needs no gradient");
    any = any || whole[i];
  }
  HAP_CHECK(any, "autograd::gather_factors: no input of ", name, " is marked");
  node.factors = std::make_shared<const Node::GatherFactors>(
      Node::GatherFactors{std::move(whole), std::move(gather)});
  return output;
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool strict) {
  std::unordered_map<TensorImpl*, Tensor> capture;
  for (const Tensor& t : inputs) {
    HAP_CHECK(t.defined() && t.requires_grad() && t.is_leaf(),
              "autograd::grad: inputs must be leaf tensors that require grad");
    capture[t.impl()] = Tensor();
  }
  run_backward(outputs, grad_outputs, &capture, strict);
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(capture[t.impl()]);
  return out;
}

std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output) {
  return grad(std::vector<Tensor>{output}, inputs, std::vector<Tensor>{grad_output}, false);
}

}  // namespace hap::autograd

namespace hap {
void Tensor::backward(const Tensor& grad_output) const {
  autograd::backward({*this}, {grad_output});
}
}  // namespace hap
