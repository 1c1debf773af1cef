// The optimizer's arithmetic as ops: the fused, multi-tensor SGD and AdamW updates (one call
// updates every parameter, in place: parameters and state slots are inputs the kernel writes,
// and the op returns nothing), and the sum of squares behind global-norm clipping. Being
// registry ops, they get a kernel per device like every other op.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/cpu/multiversion.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

// Below this many elements a parameter's update runs on one thread.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// Checks `group`-sized runs of inputs (parameter, gradient, state...): same shape, f32 or f64,
// one run per entry of the attributes.
void check_update_inputs(const Metas& in, const OptimizerAttrs& a, size_t group, const char* op) {
  HAP_CHECK(in.size() % group == 0 && in.size() / group == a.lr.size() &&
                a.weight_decay.size() == a.lr.size() && a.step.size() == a.lr.size(),
            op, ": expected ", group,
            " inputs per parameter and one lr, weight_decay and step each, got ", in.size(),
            " inputs for ", a.lr.size(), " parameters");
  for (size_t k = 0; k < in.size(); ++k) {
    const TensorMeta& p = in[k - k % group];
    HAP_CHECK(in[k].dtype == p.dtype && in[k].shape == p.shape, op, ": input ", k, " (",
              dtype_name(in[k].dtype), shape_str(in[k].shape), ") does not match its parameter (",
              dtype_name(p.dtype), shape_str(p.shape), ")");
    HAP_CHECK(p.dtype == DType::F32 || p.dtype == DType::F64, op,
              ": parameters must be f32 or f64, got ", dtype_name(p.dtype));
  }
}

template <typename T>
T* writable(const Tensor& t, const char* op) {
  HAP_CHECK(t.is_contiguous(), op, ": ", t.str(), " must be contiguous (it is updated in place)");
  return t.data<T>();
}

// torch.optim.SGD with dampening 0 (grad: the gradient times grad_scale): g = grad + wd p; buf =
// momentum buf + g (g at the first step); g = nesterov ? g + momentum buf : buf; p -= lr g.
template <typename T>
HAP_MULTIVERSION void sgd_kernel_clones(const KernelContext& c) {
  const OptimizerAttrs& a = attr<OptimizerAttrs>(c.attrs);
  const size_t group = a.momentum != 0 ? 3 : 2;
  const T mom = static_cast<T>(a.momentum);
  const T scale = static_cast<T>(a.grad_scale);
  for (size_t k = 0; k < a.lr.size(); ++k) {
    T* p = writable<T>(c.inputs[group * k], "sgd_update");
    const Tensor g_c = c.inputs[group * k + 1].contiguous();
    const T* g = g_c.data<T>();
    T* buf = group == 3 ? writable<T>(c.inputs[group * k + 2], "sgd_update") : nullptr;
    const T lr = static_cast<T>(a.lr[k]), wd = static_cast<T>(a.weight_decay[k]);
    const bool first = a.step[k] == 0, nesterov = a.nesterov;
    const int64_t n = c.inputs[group * k].numel();
#pragma omp parallel for if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) {
      T d = g[i] * scale;  // x * 1 is x, bit for bit
      if (wd != T(0)) d += wd * p[i];
      if (buf) {
        T b = first ? d : mom * buf[i] + d;
        buf[i] = b;
        d = nesterov ? d + mom * b : b;
      }
      p[i] -= lr * d;
    }
  }
}

template <typename T>
void sgd_kernel(const KernelContext& c) {
  ::hap::cpu::clone_call (&sgd_kernel_clones<T>)(c);
}

// torch.optim.AdamW at step t (g: the gradient times grad_scale): p *= 1 - lr wd; m = b1 m + (1 -
// b1) g; v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// Scalars in double, as torch computes them in Python; the update itself in T.
template <typename T>
HAP_MULTIVERSION void adamw_kernel_clones(const KernelContext& c) {
  const OptimizerAttrs& a = attr<OptimizerAttrs>(c.attrs);
  const T scale = static_cast<T>(a.grad_scale);
  for (size_t k = 0; k < a.lr.size(); ++k) {
    T* p = writable<T>(c.inputs[4 * k], "adamw_update");
    const Tensor g_c = c.inputs[4 * k + 1].contiguous();
    const T* g = g_c.data<T>();
    T* m = writable<T>(c.inputs[4 * k + 2], "adamw_update");
    T* v = writable<T>(c.inputs[4 * k + 3], "adamw_update");
    const double lr = a.lr[k], t = static_cast<double>(a.step[k]);
    const double bias_correction1 = 1.0 - std::pow(a.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(a.beta2, t);
    const T decay = static_cast<T>(1.0 - lr * a.weight_decay[k]);
    const T b1 = static_cast<T>(a.beta1), one_minus_b1 = static_cast<T>(1.0 - a.beta1);
    const T b2 = static_cast<T>(a.beta2), one_minus_b2 = static_cast<T>(1.0 - a.beta2);
    const T step_size = static_cast<T>(lr / bias_correction1);
    const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    const T eps = static_cast<T>(a.eps);
    const int64_t n = c.inputs[4 * k].numel();
#pragma omp parallel for if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) {
      const T gi = g[i] * scale;
      const T mi = m[i] * b1 + gi * one_minus_b1;
      const T vi = v[i] * b2 + gi * gi * one_minus_b2;
      m[i] = mi;
      v[i] = vi;
      const T denom = std::sqrt(vi) / bc2_sqrt + eps;
      p[i] = p[i] * decay - step_size * (mi / denom);
    }
  }
}

template <typename T>
void adamw_kernel(const KernelContext& c) {
  ::hap::cpu::clone_call (&adamw_kernel_clones<T>)(c);
}

// The sum of x^2 over every element of every input, in double, in an order fixed by the size
// alone (the same bits on any number of threads): each block of kSquaresBlock elements is summed
// in kSquaresLanes running sums (lane j takes elements j, j + kSquaresLanes, ...; independent,
// so they vectorize), added lane by lane; the blocks' sums are added in order, and the tensors in
// input order. The block's helper is inlined into each clone, so it vectorizes at its level.
constexpr int64_t kSquaresBlock = 4096;
constexpr int kSquaresLanes = 16;

template <typename T>
[[gnu::always_inline]] inline double squares_of_block(const T* p, int64_t n) {
  double lane[kSquaresLanes] = {};
  int64_t i = 0;
  for (; i + kSquaresLanes <= n; i += kSquaresLanes)
    for (int j = 0; j < kSquaresLanes; ++j) {
      const double v = static_cast<double>(p[i + j]);
      lane[j] += v * v;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = static_cast<double>(p[i]);
    lane[j] += v * v;
  }
  double total = 0;
  for (double l : lane) total += l;
  return total;
}

HAP_MULTIVERSION double sum_of_squares_of_clones(const Tensor& x_in) {
  const Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  const int64_t blocks = (n + kSquaresBlock - 1) / kSquaresBlock;
  double total = 0;
  dispatch_float(x.dtype(), "sum_of_squares", [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    if (blocks <= 1) {
      total = squares_of_block(p, n);
      return;
    }
    std::vector<double> sums(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t b = 0; b < blocks; ++b)
      sums[static_cast<size_t>(b)] =
          squares_of_block(p + b * kSquaresBlock, std::min(kSquaresBlock, n - b * kSquaresBlock));
    for (double s : sums) total += s;
  });
  return total;
}

double sum_of_squares_of(const Tensor& x_in) {
  return ::hap::cpu::clone_call(&sum_of_squares_of_clones)(x_in);
}

}  // namespace

void register_optim_ops(OpTable& t) {
  OpDef& sgd = def_of(t, OpKind::SgdUpdate);
  sgd.autocast = Autocast::Keep;
  sgd.name = "sgd_update";
  sgd.num_inputs = -1;
  sgd.infer = [](const Metas& in, const Attrs& a) {
    const OptimizerAttrs& o = attr<OptimizerAttrs>(a);
    check_update_inputs(in, o, o.momentum != 0 ? 3 : 2, "sgd_update");
    return Metas{};
  };
  sgd.cpu = [](const KernelContext& c) {
    dispatch_float(c.inputs[0].dtype(), "sgd_update",
                   [&](auto tag) { sgd_kernel<decltype(tag)>(c); });
    return std::vector<Tensor>{};
  };

  OpDef& adam = def_of(t, OpKind::AdamWUpdate);
  adam.autocast = Autocast::Keep;
  adam.name = "adamw_update";
  adam.num_inputs = -1;
  adam.infer = [](const Metas& in, const Attrs& a) {
    check_update_inputs(in, attr<OptimizerAttrs>(a), 4, "adamw_update");
    return Metas{};
  };
  adam.cpu = [](const KernelContext& c) {
    dispatch_float(c.inputs[0].dtype(), "adamw_update",
                   [&](auto tag) { adamw_kernel<decltype(tag)>(c); });
    return std::vector<Tensor>{};
  };

  OpDef& ss = def_of(t, OpKind::SumOfSquares);
  ss.autocast = Autocast::Keep;
  ss.name = "sum_of_squares";
  ss.num_inputs = -1;
  ss.infer = [](const Metas& in, const Attrs&) {
    for (size_t i = 0; i < in.size(); ++i) check_floating("sum_of_squares", in, i);
    return Metas{{Shape{}, DType::F64}};
  };
  ss.flops = [](const Metas& in, const Metas&, const Attrs&) {
    double n = 0;
    for (const TensorMeta& m : in) n += static_cast<double>(shape_numel(m.shape));
    return 2.0 * n;
  };
  ss.cpu = [](const KernelContext& c) {
    double total = 0;
    for (const Tensor& x : c.inputs) total += sum_of_squares_of(x);
    Tensor out = c.alloc(0);
    out.data<double>()[0] = total;
    return std::vector<Tensor>{out};
  };
}

}  // namespace hap::ops
