#include "models/clip.h"

#include <cmath>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "ops/functional.h"

namespace hap::nn {

namespace {

std::vector<Tensor> distinct_with_grad(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : params) {
    HAP_CHECK(p.defined(), "clip_grad_norm_: an undefined tensor in the parameter list");
    if (p.grad().defined() && seen.insert(p.impl()).second) out.push_back(p);
  }
  return out;
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) grads.push_back(p.grad());
  return grads;
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  return std::sqrt(sum_of_squares(grads_of(distinct_with_grad(params))));
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  HAP_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be > 0, got ", max_norm);
  NoGradGuard no_grad;
  const std::vector<Tensor> with_grad = distinct_with_grad(params);
  const double norm = std::sqrt(sum_of_squares(grads_of(with_grad)));
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& p : with_grad) p.set_grad(mul(p.grad(), coef));
  return norm;
}

}  // namespace hap::nn
