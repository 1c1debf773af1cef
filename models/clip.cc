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

void scale_into(const Tensor& dst, const Tensor& src, double factor) {
  auto run = [&](auto* d, const auto* s) {
    using T = std::remove_pointer_t<decltype(d)>;
    const T f = static_cast<T>(factor);
    const int64_t n = dst.numel();
#pragma omp parallel for if (n >= (int64_t{1} << 15))
    for (int64_t i = 0; i < n; ++i) d[i] = s[i] * f;
  };
  switch (dst.dtype()) {
    case DType::F32:
      run(dst.data<float>(), src.data<float>());
      break;
    case DType::F64:
      run(dst.data<double>(), src.data<double>());
      break;
    default: {
      std::vector<double> v = src.to_vector();
      for (double& x : v) x *= factor;
      dst.copy_from(Tensor::from_vector(v, src.shape(), TensorOptions{}.with_dtype(dst.dtype())));
    }
  }
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params) {
  double total = 0;
  for (const Tensor& p : distinct_with_grad(params)) total += sum_of_squares(p.grad());
  return std::sqrt(total);
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  HAP_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be > 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> with_grad = distinct_with_grad(params);
  double total = 0;
  for (const Tensor& p : with_grad) total += sum_of_squares(p.grad());
  double norm = std::sqrt(total);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& p : with_grad) {
      Tensor g = p.grad().contiguous();
      Tensor scaled = Tensor::empty(g.shape(), TensorOptions{}.with_dtype(g.dtype()));
      scale_into(scaled, g, coef);
      p.set_grad(scaled);
    }
  }
  return norm;
}

}  // namespace hap::nn
