#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "core/rng.h"

namespace hap::autograd {

namespace {
double dot(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt) {
  for (const Tensor& t : inputs)
    HAP_CHECK(!t.defined() || !is_floating(t.dtype()) || t.dtype() == DType::F64,
              "gradcheck: floating inputs must be f64, got ", t.str());
  GradcheckResult res;
  Tensor out = f(inputs);
  HAP_CHECK(out.dtype() == DType::F64, "gradcheck: output must be f64, got ", out.str());
  Tensor r = randn(out.shape(), opt.seed, 0, TensorOptions{}.with_dtype(DType::F64));

  std::vector<Tensor> wrt;
  std::vector<size_t> wrt_index;  // position in `inputs`, for the message
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      wrt.push_back(inputs[i]);
      wrt_index.push_back(i);
    }
  HAP_CHECK(!wrt.empty(), "gradcheck: no input requires grad");
  std::vector<Tensor> analytic = grad(out, wrt, r);

  NoGradGuard no_grad;
  for (size_t w = 0; w < wrt.size(); ++w) {
    Tensor x = wrt[w];
    HAP_CHECK(x.is_contiguous(), "gradcheck: inputs must be contiguous");
    double* p = x.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      double orig = p[i];
      p[i] = orig + opt.eps;
      double lp = dot(f(inputs), r);
      p[i] = orig - opt.eps;
      double lm = dot(f(inputs), r);
      p[i] = orig;
      double numeric = (lp - lm) / (2 * opt.eps);
      double a = analytic[w].defined() ? analytic[w].item_at(i) : 0.0;
      double err = std::abs(a - numeric);
      // NaN compares false both ways: written so that a NaN gradient fails the check and sticks.
      if (std::isnan(err) || err > res.max_abs_error) res.max_abs_error = err;
      if (res.ok && !(err <= opt.atol + opt.rtol * std::abs(numeric))) {
        res.ok = false;
        std::ostringstream os;
        os << "input " << wrt_index[w] << " " << x.str() << " element " << i << ": analytic " << a
           << " vs numeric " << numeric;
        res.message = os.str();
      }
    }
  }
  return res;
}

}  // namespace hap::autograd
