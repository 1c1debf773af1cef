#include "autograd/checkpoint.h"

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "ops/dispatch.h"

namespace hap::autograd {

namespace {

// Records history for its scope (the backward pass runs with it off).
class EnableGrad {
 public:
  EnableGrad() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(true); }
  ~EnableGrad() { GradMode::set_enabled(prev_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool prev_;
};

}  // namespace

std::vector<Tensor> checkpoint(const Function& fn, const std::vector<Tensor>& inputs) {
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!GradMode::is_enabled() || !any) return fn(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  // The inputs' values (their history stays on this node's edges) and which need a gradient.
  std::vector<Tensor> saved;
  std::vector<bool> needs;
  for (const Tensor& t : inputs) {
    saved.push_back(t.defined() ? t.detach() : Tensor());
    needs.push_back(t.defined() && t.requires_grad());
  }
  const DType autocast = ops::autocast_dtype();
  auto backward = [fn, saved, needs, autocast](const std::vector<Tensor>& grad_outputs) {
    std::vector<Tensor> leaves, wanted;
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor leaf = saved[i].defined() ? saved[i].detach() : Tensor();
      if (needs[i]) {
        leaf.set_requires_grad(true);
        wanted.push_back(leaf);
      }
      leaves.push_back(leaf);
    }
    std::vector<Tensor> outs;
    {
      EnableGrad enable;
      ops::AutocastGuard same_precision(autocast);
      outs = fn(leaves);
    }
    HAP_CHECK(outs.size() == grad_outputs.size(), "autograd::checkpoint: the recomputation ",
              "returned ", outs.size(), " outputs, the first run ", grad_outputs.size());
    std::vector<Tensor> roots, grads;
    for (size_t j = 0; j < outs.size(); ++j)
      if (grad_outputs[j].defined() && outs[j].defined() && outs[j].requires_grad()) {
        roots.push_back(outs[j]);
        grads.push_back(grad_outputs[j]);
      }
    std::vector<Tensor> in_grads(saved.size());
    if (roots.empty()) return in_grads;
    const std::vector<Tensor> g = grad(roots, wanted, grads, /*strict=*/true);
    for (size_t i = 0, k = 0; i < saved.size(); ++i)
      if (needs[i]) in_grads[i] = g[k++];
    return in_grads;
  };
  return record_custom("checkpoint", inputs, std::move(outputs), std::move(backward));
}

}  // namespace hap::autograd
