#include "models/optim.h"

#include <cmath>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "ops/dispatch.h"

namespace hap::optim {

namespace {

std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(
    const std::vector<std::pair<std::string, Tensor>>& named_params, double weight_decay) {
  HAP_CHECK(weight_decay >= 0, "weight_decay_groups: weight_decay must be >= 0, got ",
            weight_decay);
  ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  decay.name = "decay";
  no_decay.weight_decay = 0.0;
  no_decay.name = "no_decay";
  for (const auto& [name, t] : named_params) {
    if (!t.requires_grad()) continue;
    // Matrices (and larger) decay, vectors do not; a bias never does, whatever its shape (the
    // stacked q, k, v biases are [3, C]).
    const bool is_bias = name == "bias" || (name.size() > 5 && name.ends_with(".bias"));
    (t.dim() >= 2 && !is_bias ? decay : no_decay).params.push_back(t);
  }
  return {decay, no_decay};
}

// ---- Optimizer ----
Optimizer::Optimizer(std::vector<ParamGroup> groups, double default_lr, double default_weight_decay,
                     std::vector<std::string> slot_names, const char* optimizer_name)
    : groups_(std::move(groups)), slot_names_(std::move(slot_names)), name_(optimizer_name) {
  HAP_CHECK(!groups_.empty(), name_, ": no parameter groups given");
  std::unordered_set<const TensorImpl*> seen;
  states_.resize(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& g = groups_[gi];
    if (g.name.empty()) g.name = "group " + std::to_string(gi);
    if (!g.lr) g.lr = default_lr;
    if (!g.weight_decay) g.weight_decay = default_weight_decay;
    HAP_CHECK(*g.lr >= 0, name_, ": learning rate of ", g.name, " must be >= 0, got ", *g.lr);
    HAP_CHECK(*g.weight_decay >= 0, name_, ": weight_decay of ", g.name, " must be >= 0, got ",
              *g.weight_decay);
    for (size_t pi = 0; pi < g.params.size(); ++pi) {
      const Tensor& p = g.params[pi];
      HAP_CHECK(p.defined(), name_, ": parameter ", pi, " of ", g.name, " is undefined");
      HAP_CHECK(p.dtype() == DType::F32 || p.dtype() == DType::F64, name_, ": parameter ", pi,
                " of ", g.name, " is ", p.str(), "; only f32 and f64 parameters are supported");
      HAP_CHECK(p.is_leaf(), name_, ": parameter ", pi, " of ", g.name,
                " is not a leaf tensor (it has autograd history)");
      HAP_CHECK(seen.insert(p.impl()).second, name_, ": parameter ", pi, " of ", g.name, " (",
                p.str(), ") appears more than once in the parameter groups");
      ParamState st;
      for (size_t s = 0; s < slot_names_.size(); ++s)
        st.slots.push_back(Tensor::zeros(
            p.shape(), TensorOptions{}.with_dtype(p.dtype()).with_device(p.device())));
      states_[gi].push_back(std::move(st));
    }
  }
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  HAP_CHECK(lr >= 0 && std::isfinite(lr), name_, ": learning rate must be finite and >= 0, got ",
            lr);
  for (auto& g : groups_) g.lr = lr;
}

Optimizer::ParamState* Optimizer::state(const Tensor& param) {
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t pi = 0; pi < groups_[gi].params.size(); ++pi)
      if (groups_[gi].params[pi].same(param)) return &states_[gi][pi];
  return nullptr;
}

const Optimizer::ParamState* Optimizer::state(const Tensor& param) const {
  return const_cast<Optimizer*>(this)->state(param);
}

void Optimizer::step(double grad_scale) { step_where(nullptr, grad_scale); }

void Optimizer::step(const std::vector<Tensor>& params, double grad_scale) {
  std::unordered_set<const TensorImpl*> wanted;
  for (const Tensor& p : params) {
    HAP_CHECK(state(p) != nullptr, name_, ": step() of a parameter (", p.str(),
              ") it does not hold");
    wanted.insert(p.impl());
  }
  step_where(&wanted, grad_scale);
}

void Optimizer::step_where(const std::unordered_set<const TensorImpl*>* only, double grad_scale) {
  std::vector<Update> updates;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& group = groups_[gi];
    for (size_t pi = 0; pi < group.params.size(); ++pi) {
      const Tensor& p = group.params[pi];
      if (only && !only->count(p.impl())) continue;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      check_update(group, pi, p, g);
      ParamState& st = states_[gi][pi];
      for (Tensor& s : st.slots)
        if (s.dtype() != p.dtype()) s = s.to(p.dtype());
      updates.push_back({&group, p, g.contiguous(), &st});
    }
  }
  if (updates.empty()) return;
  NoGradGuard no_grad;
  apply(updates, grad_scale);
}

void Optimizer::check_update(const ParamGroup& group, size_t index, const Tensor& p,
                             const Tensor& g) const {
  HAP_CHECK(p.is_contiguous(), name_, ": parameter ", index, " of ", group.name, " (", p.str(),
            ") must be contiguous");
  HAP_CHECK(p.dtype() == DType::F32 || p.dtype() == DType::F64, name_, ": parameter ", index,
            " of ", group.name, " is ", p.str(), "; only f32 and f64 parameters are supported");
  HAP_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype(), name_, ": gradient ", g.str(),
            " does not match parameter ", index, " of ", group.name, " (", p.str(), ")");
}

// ---- SGD ----
SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay,
                options.momentum != 0.0 ? std::vector<std::string>{"momentum_buffer"}
                                        : std::vector<std::string>{},
                "SGD"),
      options_(options) {
  HAP_CHECK(options.momentum >= 0, "SGD: momentum must be >= 0, got ", options.momentum);
  HAP_CHECK(!options.nesterov || options.momentum > 0,
            "SGD: nesterov needs a momentum > 0 (got momentum ", options.momentum, ")");
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(single_group(std::move(params)), options) {}

void SGD::apply(const std::vector<Update>& updates, double grad_scale) {
  ops::OptimizerAttrs a;
  a.grad_scale = grad_scale;
  a.momentum = options_.momentum;
  a.nesterov = options_.nesterov;
  std::vector<Tensor> inputs;
  for (const Update& u : updates) {
    a.lr.push_back(*u.group->lr);
    a.weight_decay.push_back(*u.group->weight_decay);
    a.step.push_back(u.state->step);
    inputs.push_back(u.param);
    inputs.push_back(u.grad);
    if (a.momentum != 0.0) inputs.push_back(u.state->slots[0]);
  }
  ops::call(ops::OpKind::SgdUpdate, inputs, a);
  for (const Update& u : updates) ++u.state->step;
}

// ---- AdamW ----
AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer(std::move(groups), options.lr, options.weight_decay, {"exp_avg", "exp_avg_sq"},
                "AdamW"),
      options_(options) {
  auto [b1, b2] = options.betas;
  HAP_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, "AdamW: betas must be in [0, 1), got (", b1,
            ", ", b2, ")");
  HAP_CHECK(options.eps >= 0, "AdamW: eps must be >= 0, got ", options.eps);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW(single_group(std::move(params)), options) {}

void AdamW::apply(const std::vector<Update>& updates, double grad_scale) {
  ops::OptimizerAttrs a;
  a.grad_scale = grad_scale;
  a.beta1 = options_.betas.first;
  a.beta2 = options_.betas.second;
  a.eps = options_.eps;
  std::vector<Tensor> inputs;
  for (const Update& u : updates) {
    a.lr.push_back(*u.group->lr);
    a.weight_decay.push_back(*u.group->weight_decay);
    a.step.push_back(++u.state->step);
    inputs.insert(inputs.end(), {u.param, u.grad, u.state->slots[0], u.state->slots[1]});
  }
  ops::call(ops::OpKind::AdamWUpdate, inputs, a);
}

}  // namespace hap::optim
