// CUDA kernels of the elementwise ops: unary, binary with broadcasting, scalar, relu_backward, for
// f32, f64 and bf16 (computed in f32 and rounded once: the f32 route's result in one kernel
// instead of three; contiguous and cast serve every device through core/tensor.h's copies).
// Inputs may be any strided view: each thread maps its output index to every input's offset
// (broadcast dims have stride 0), so no operand is copied first. Outputs are contiguous, as on the
// CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// T is the storage type; bf16 computes in f32 (widen, narrow), as the f32 route would.
template <typename T, typename F>
__global__ void unary_kernel(T* out, const T* x, Indexer ix, int64_t n, F f) {
  HAP_GRID_STRIDE_LOOP(i, n) { out[i] = narrow<T>(f(widen(x[offset_of(ix, i)]))); }
}

template <typename T, typename F>
__global__ void binary_kernel(T* out, const T* a, Indexer ia, const T* b, Indexer ib, int64_t n,
                              F f) {
  HAP_GRID_STRIDE_LOOP(i, n) {
    out[i] = narrow<T>(f(widen(a[offset_of(ia, i)]), widen(b[offset_of(ib, i)])));
  }
}

// masked_fill: the value where the (broadcast) u8 mask is set, else x.
template <typename T>
__global__ void masked_fill_kernel(T* out, const T* x, Indexer ix, const uint8_t* mask, Indexer im,
                                   int64_t n, T value) {
  HAP_GRID_STRIDE_LOOP(i, n) { out[i] = mask[offset_of(im, i)] ? value : x[offset_of(ix, i)]; }
}

// ---- the functors (a scalar attribute travels in the functor) ----
struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Sub {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a - b;
  }
};
struct Mul {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a * b;
  }
};
struct Div {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a / b;
  }
};
struct ReluGrad {
  template <typename T>
  __device__ T operator()(T g, T y) const {
    return y > T(0) ? g : T(0);
  }
};
struct Neg {
  template <typename T>
  __device__ T operator()(T x) const {
    return -x;
  }
};
struct Exp {
  template <typename T>
  __device__ T operator()(T x) const {
    return exp(x);
  }
};
struct Log {
  template <typename T>
  __device__ T operator()(T x) const {
    return log(x);
  }
};
struct Sqrt {
  template <typename T>
  __device__ T operator()(T x) const {
    return sqrt(x);
  }
};
struct Rsqrt {
  template <typename T>
  __device__ T operator()(T x) const {
    return T(1) / sqrt(x);
  }
};
struct Tanh {
  template <typename T>
  __device__ T operator()(T x) const {
    return tanh(x);
  }
};
struct Relu {
  template <typename T>
  __device__ T operator()(T x) const {
    return x > T(0) ? x : T(0);
  }
};
struct Sigmoid {
  template <typename T>
  __device__ T operator()(T x) const {
    return T(1) / (T(1) + exp(-x));
  }
};
struct AddScalar {
  double v;
  template <typename T>
  __device__ T operator()(T x) const {
    return x + static_cast<T>(v);
  }
};
struct MulScalar {
  double v;
  template <typename T>
  __device__ T operator()(T x) const {
    return x * static_cast<T>(v);
  }
};
struct PowScalar {  // x * x for a square, as the CPU kernel
  double v;
  template <typename T>
  __device__ T operator()(T x) const {
    return v == 2.0 ? x * x : pow(x, static_cast<T>(v));
  }
};
template <typename F>
std::vector<Tensor> unary(const KernelContext& c, F f) {
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  const Indexer ix = indexer(c.inputs[0], out.shape(), op_name(c.kind));
  on_float_or_bf16(out, op_name(c.kind), [&](auto tag) {
    using T = decltype(tag);
    unary_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ix, n, f);
  });
  return {out};
}

template <typename F>
std::vector<Tensor> binary(const KernelContext& c, F f) {
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  const Indexer ia = indexer(c.inputs[0], out.shape(), op_name(c.kind)),
                ib = indexer(c.inputs[1], out.shape(), op_name(c.kind));
  on_float_or_bf16(out, op_name(c.kind), [&](auto tag) {
    using T = decltype(tag);
    binary_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ia,
                                               ptr<T>(c.inputs[1]), ib, n, f);
  });
  return {out};
}

// The kernel functions of the registry: a functor per op, a scalar attribute inside it.
template <typename F>
std::vector<Tensor> unary_op(const KernelContext& c) {
  return unary(c, F{});
}
template <typename F>
std::vector<Tensor> binary_op(const KernelContext& c) {
  return binary(c, F{});
}
template <typename F>
std::vector<Tensor> scalar_op(const KernelContext& c) {
  return unary(c, F{attr<ScalarAttrs>(c.attrs).value});
}

std::vector<Tensor> masked_fill(const KernelContext& c) {
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  const Indexer ix = indexer(c.inputs[0], out.shape(), "masked_fill"),
                im = indexer(c.inputs[1], out.shape(), "masked_fill");
  const double value = attr<ScalarAttrs>(c.attrs).value;
  on_float_or_bf16(out, "masked_fill", [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeOf<T>::type;
    masked_fill_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ix,
                                                    ptr<uint8_t>(c.inputs[1]), im, n,
                                                    host_narrow<T>(static_cast<C>(value)));
  });
  return {out};
}

}  // namespace

void register_elementwise(OpTable& t) {
  // Every one takes bf16 itself (f32 compute, one rounding: the route's result, one kernel).
  auto set = [&](OpKind k, KernelFn fn) {
    t[static_cast<size_t>(k)].cuda = fn;
    t[static_cast<size_t>(k)].cuda_bf16 = true;
  };
  set(OpKind::Add, binary_op<Add>);
  set(OpKind::Sub, binary_op<Sub>);
  set(OpKind::Mul, binary_op<Mul>);
  set(OpKind::Div, binary_op<Div>);
  set(OpKind::ReluBackward, binary_op<ReluGrad>);
  set(OpKind::Neg, unary_op<Neg>);
  set(OpKind::Exp, unary_op<Exp>);
  set(OpKind::Log, unary_op<Log>);
  set(OpKind::Sqrt, unary_op<Sqrt>);
  set(OpKind::Rsqrt, unary_op<Rsqrt>);
  set(OpKind::Tanh, unary_op<Tanh>);
  set(OpKind::Relu, unary_op<Relu>);
  set(OpKind::Sigmoid, unary_op<Sigmoid>);
  set(OpKind::AddScalar, scalar_op<AddScalar>);
  set(OpKind::MulScalar, scalar_op<MulScalar>);
  set(OpKind::PowScalar, scalar_op<PowScalar>);
  set(OpKind::MaskedFill, masked_fill);
}

}  // namespace hap::ops::cuda
