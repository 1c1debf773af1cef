// Optimizers with torch.optim semantics: SGD (momentum, optional Nesterov, L2 weight decay) and
// AdamW (decoupled weight decay). step() updates every parameter in place with one fused,
// multi-tensor registry op (ops::OpKind::SgdUpdate / AdamWUpdate: a kernel per device), without
// recording autograd history. Parameters without a gradient are skipped (their state does not
// advance), as in torch.
//
//   auto groups = hap::optim::weight_decay_groups(model->named_parameters(), 0.1);
//   hap::optim::AdamW opt(groups, {.lr = 6e-4, .betas = {0.9, 0.95}, .eps = 1e-8,
//                                  .weight_decay = 0.1});
//   opt.zero_grad(); loss.backward(); opt.set_lr(schedule(step)); opt.step();
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace hap::optim {

// A set of parameters sharing hyperparameters; unset fields take the optimizer's options.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::string name;  // for messages, e.g. "decay"
};

// nanoGPT's grouping: parameters with dim >= 2 (matrices, embeddings) decay with `weight_decay`,
// the others (vectors: biases, LayerNorm weights) do not, nor does any parameter named "bias" or
// "*.bias" whatever its shape (attention's stacked q, k, v biases are [3, C]). Returns {decay,
// no_decay}, in the given order.
std::vector<ParamGroup> weight_decay_groups(
    const std::vector<std::pair<std::string, Tensor>>& named_params, double weight_decay);

class Optimizer {
 public:
  // Per-parameter state: how many updates it got and one tensor per state slot.
  struct ParamState {
    int64_t step = 0;
    std::vector<Tensor> slots;  // in state_slots() order, same shape and dtype as the parameter
  };

  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient. Each gradient is used multiplied by
  // `grad_scale`, in its dtype: global-norm clipping's coefficient, as multiplying the gradients
  // first (torch's clip_grad_norm_ then step()) without a pass that writes them; the same bits
  // for AdamW, and for SGD up to where the compiler fuses the product into a multiply-add.
  void step(double grad_scale = 1);
  // One update of the given parameters (each one this optimizer holds) that have a gradient:
  // what a distributed program's update instructions name.
  void step(const std::vector<Tensor>& params, double grad_scale = 1);
  // Drops every parameter's gradient.
  void zero_grad();
  // Sets the learning rate of every group (what a schedule does each step).
  void set_lr(double lr);
  // The learning rate of the first group.
  double lr() const { return groups_.front().lr.value(); }

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  // ---- state, for checkpoints ----
  // The names of the per-parameter state tensors ("exp_avg", "exp_avg_sq"; "momentum_buffer").
  const std::vector<std::string>& state_slots() const { return slot_names_; }
  // "SGD", "AdamW": what checkpoints record.
  const char* name() const { return name_; }
  // The state of `param`, or null if it is not optimised here.
  ParamState* state(const Tensor& param);
  const ParamState* state(const Tensor& param) const;

 protected:
  Optimizer(std::vector<ParamGroup> groups, double default_lr, double default_weight_decay,
            std::vector<std::string> slot_names, const char* optimizer_name);
  // One update in flight: a parameter, its (contiguous) gradient, its group and state (slots in
  // the parameter's dtype).
  struct Update {
    const ParamGroup* group;
    Tensor param;
    Tensor grad;
    ParamState* state;
  };
  // Applies one update to each of `updates` (all of one call, fused; the gradients times
  // `grad_scale`) and advances their steps.
  virtual void apply(const std::vector<Update>& updates, double grad_scale) = 0;

 private:
  void step_where(const std::unordered_set<const TensorImpl*>* only, double grad_scale);
  void check_update(const ParamGroup& group, size_t index, const Tensor& p, const Tensor& g) const;

  std::vector<ParamGroup> groups_;
  std::vector<std::string> slot_names_;
  std::vector<std::vector<ParamState>> states_;  // [group][param]
  const char* name_;
};

// ---- SGD ----
struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;  // L2: added to the gradient
  bool nesterov = false;
};

// torch.optim.SGD with dampening 0:
//   g = grad + wd p;  buf = momentum buf + g (buf = g at the first step);
//   g = nesterov ? g + momentum buf : buf;  p -= lr g.   (Without momentum: p -= lr g.)
class SGD : public Optimizer {
 public:
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  SGD(std::vector<Tensor> params, SGDOptions options);
  const SGDOptions& options() const { return options_; }

 private:
  void apply(const std::vector<Update>& updates, double grad_scale) override;
  SGDOptions options_;
};

// ---- AdamW ----
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// torch.optim.AdamW: at step t (1-based) of each parameter
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  const AdamWOptions& options() const { return options_; }

 private:
  void apply(const std::vector<Update>& updates, double grad_scale) override;
  AdamWOptions options_;
};

}  // namespace hap::optim
