#include "models/optim.h"

#include <cmath>
#include <unordered_set>

#include "autograd/grad_mode.h"

namespace hap::optim {

namespace {

// Below this many elements a parameter's update runs on one thread.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

template <typename F>
void dispatch_f32_f64(DType dtype, F&& f) {
  if (dtype == DType::F32) {
    f(float{});
  } else {
    HAP_ASSERT(dtype == DType::F64, "optimizer update on dtype ", dtype_name(dtype));
    f(double{});
  }
}

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
    (t.dim() >= 2 ? decay : no_decay).params.push_back(t);
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
        st.slots.push_back(Tensor::zeros(p.shape(), TensorOptions{}.with_dtype(p.dtype())));
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

void SGD::step() {
  NoGradGuard no_grad;
  const double momentum = options_.momentum;
  const bool nesterov = options_.nesterov;
  for_each_update(
      [&](const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& st) {
        dispatch_f32_f64(param.dtype(), [&](auto tag) {
          using T = decltype(tag);
          T* p = param.data<T>();
          const T* g = grad.data<T>();
          T* buf = momentum != 0.0 ? st.slots[0].data<T>() : nullptr;
          const T lr = static_cast<T>(*group.lr), wd = static_cast<T>(*group.weight_decay);
          const T mom = static_cast<T>(momentum);
          const bool first = st.step == 0;
          const int64_t n = param.numel();
#pragma omp parallel for if (n >= kParallelMinElements)
          for (int64_t i = 0; i < n; ++i) {
            T d = g[i];
            if (wd != T(0)) d += wd * p[i];
            if (buf) {
              T b = first ? d : mom * buf[i] + d;
              buf[i] = b;
              d = nesterov ? d + mom * b : b;
            }
            p[i] -= lr * d;
          }
        });
        ++st.step;
      });
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

void AdamW::step() {
  NoGradGuard no_grad;
  // Plain locals, not a structured binding: clang < 16 cannot capture those in lambdas.
  const double beta1 = options_.betas.first, beta2 = options_.betas.second;
  for_each_update(
      [&](const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& st) {
        const int64_t t = ++st.step;
        const double lr = *group.lr, wd = *group.weight_decay;
        // Scalars in double, as torch computes them in Python; the update itself in T.
        const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(t));
        const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(t));
        dispatch_f32_f64(param.dtype(), [&](auto tag) {
          using T = decltype(tag);
          T* p = param.data<T>();
          const T* g = grad.data<T>();
          T* m = st.slots[0].data<T>();
          T* v = st.slots[1].data<T>();
          const T decay = static_cast<T>(1.0 - lr * wd);
          const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1.0 - beta1);
          const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1.0 - beta2);
          const T step_size = static_cast<T>(lr / bias_correction1);
          const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
          const T eps = static_cast<T>(options_.eps);
          const int64_t n = param.numel();
#pragma omp parallel for if (n >= kParallelMinElements)
          for (int64_t i = 0; i < n; ++i) {
            const T gi = g[i];
            const T mi = m[i] * b1 + gi * one_minus_b1;
            const T vi = v[i] * b2 + gi * gi * one_minus_b2;
            m[i] = mi;
            v[i] = vi;
            const T denom = std::sqrt(vi) / bc2_sqrt + eps;
            p[i] = p[i] * decay - step_size * (mi / denom);
          }
        });
      });
}

}  // namespace hap::optim
