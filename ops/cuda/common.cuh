// What the CUDA kernel files share: strided indexing of operands, typed device pointers, launch
// sizes and checks, and dispatch over the float dtypes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"
#include "core/cuda/indexing.cuh"
#include "core/tensor.h"

namespace hap::ops::cuda {

using hap::cuda::Bf16;
using hap::cuda::blocks_for;
using hap::cuda::check_launch;
using hap::cuda::Indexer;
using hap::cuda::indexer;
using hap::cuda::kMaxDims;
using hap::cuda::kThreads;
using hap::cuda::offset_of;

// A kernel's pointer to element 0 of a device tensor of dtype T.
template <typename T>
T* ptr(const Tensor& t) {
  HAP_ASSERT(dtype_of<T>::value == t.dtype(), "cuda kernel reads ", t.str(), " as ",
             dtype_name(dtype_of<T>::value));
  return static_cast<T*>(t.raw_data());
}

// bf16 tensors' elements as kernels see them (ptr<Bf16>).
template <>
inline Bf16* ptr<Bf16>(const Tensor& t) {
  HAP_ASSERT(t.dtype() == DType::BF16, "cuda kernel reads ", t.str(), " as bf16");
  return static_cast<Bf16*>(t.raw_data());
}

// Kernels over bf16 storage compute in f32: widen on load, narrow (round to nearest even) on
// store, so that an op equals the f32 route's cast, f32 op and cast bit for bit.
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<Bf16> {
  using type = float;
};
template <typename T>
__device__ __forceinline__ typename ComputeOf<T>::type widen(T x) {
  return x;
}
template <>
__device__ __forceinline__ float widen<Bf16>(Bf16 x) {
  return hap::cuda::bf16_to_f32(x);
}
template <typename T>
__device__ __forceinline__ T narrow(typename ComputeOf<T>::type x) {
  return x;
}
template <>
__device__ __forceinline__ Bf16 narrow<Bf16>(float x) {
  return hap::cuda::f32_to_bf16(x);
}

// The same narrowing on the host (a scalar attribute handed to a kernel).
template <typename T>
inline T host_narrow(typename ComputeOf<T>::type x) {
  return x;
}
template <>
inline Bf16 host_narrow<Bf16>(float x) {
  return Bf16{hap::bf16(x).bits};
}

// Runs f on the float dtype of `out`: f32 or f64, and with kBf16 bf16 too (computed in f32
// between widen and narrow); other dtypes are an error naming the op.
template <bool kBf16, typename Fn>
void on_float_dtype(const Tensor& out, const char* op, Fn fn) {
  // (Not cudaSetDevice: that would make the primary context current and take a rank of an
  // emulated mixed cluster out of its green context.)
  hap::cuda::set_device(out.device().index);
  const DType d = out.dtype();
  if (d == DType::F32) {
    fn(float{});
  } else if (d == DType::F64) {
    fn(double{});
  } else {
    bool ran = false;
    if constexpr (kBf16) {
      if (d == DType::BF16) {
        fn(Bf16{});
        ran = true;
      }
    }
    HAP_CHECK(ran, "op ", op, " on cuda: dtype ", dtype_name(d), " has no CUDA kernel (",
              kBf16 ? "f32, f64 and bf16 have)" : "f32 and f64 have)");
  }
  check_launch(op);
}

// f32 and f64.
template <typename Fn>
void on_float(const Tensor& out, const char* op, Fn fn) {
  on_float_dtype<false>(out, op, fn);
}

// f32, f64 and bf16, for the ops whose registry entry says cuda_bf16.
template <typename Fn>
void on_float_or_bf16(const Tensor& out, const char* op, Fn fn) {
  on_float_dtype<true>(out, op, fn);
}

// Row-major C[i] (m x n) = alpha op(A[i]) (m x k) op(B[i]) (k x n) + beta C[i] for i < batch,
// through cuBLAS; A is stored [m, k] ([k, m] when a_trans), B [k, n] ([n, k] when b_trans), all
// contiguous, f32 (f32 compute, no TF32), f64, or bf16 (f32 accumulation on the tensor cores)
// (ops/cuda/matmul.cu).
void gemm(const Tensor& c, const Tensor& a, bool a_trans, const Tensor& b, bool b_trans,
          int64_t batch, int64_t m, int64_t n, int64_t k, const char* op, double alpha = 1,
          double beta = 0);

// x itself when contiguous, else a packed copy on its device.
inline Tensor dense(const Tensor& x) { return x.contiguous(); }

}  // namespace hap::ops::cuda
