// What the CUDA kernel files share: strided indexing of operands, typed device pointers, launch
// sizes and checks, and dispatch over the float dtypes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/check.h"
#include "core/tensor.h"

namespace hap::ops::cuda {

constexpr int kMaxDims = 8;
constexpr int kThreads = 256;

// An operand's strides (in elements) over the output's sizes; a broadcast dim has stride 0.
struct Indexer {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

__device__ __forceinline__ int64_t offset_of(const Indexer& ix, int64_t i) {
  int64_t off = 0;
  for (int d = ix.ndim - 1; d >= 0; --d) {
    const int64_t s = ix.sizes[d];
    off += (i % s) * ix.strides[d];
    i /= s;
  }
  return off;
}

inline Indexer indexer(const Tensor& t, const Shape& out, const char* op) {
  HAP_CHECK(out.size() <= kMaxDims, "op ", op, " on cuda: at most ", kMaxDims, " dimensions, got ",
            shape_str(out));
  Indexer ix;
  ix.ndim = static_cast<int>(out.size());
  const int64_t lead = static_cast<int64_t>(out.size()) - t.dim();
  for (int64_t d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = out[static_cast<size_t>(d)];
    const int64_t td = d - lead;
    ix.strides[d] =
        td < 0 || (t.size(td) == 1 && ix.sizes[d] != 1) ? 0 : t.strides()[static_cast<size_t>(td)];
  }
  return ix;
}

// A kernel's pointer to element 0 of a device tensor of dtype T.
template <typename T>
T* ptr(const Tensor& t) {
  HAP_ASSERT(dtype_of<T>::value == t.dtype(), "cuda kernel reads ", t.str(), " as ",
             dtype_name(dtype_of<T>::value));
  return static_cast<T*>(t.raw_data());
}

inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define HAP_GRID_STRIDE_LOOP(i, n)                                                       \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

inline void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  HAP_CHECK(e == cudaSuccess, "op ", op, " on cuda: kernel launch failed: ", cudaGetErrorName(e),
            ": ", cudaGetErrorString(e));
}

// Runs f on the float dtype of `out` (f32 or f64); other dtypes have no CUDA kernel yet.
template <typename Fn>
void on_float(const Tensor& out, const char* op, Fn fn) {
  HAP_CUDA_CHECK(cudaSetDevice(out.device().index));
  if (out.dtype() == DType::F32) {
    fn(float{});
  } else if (out.dtype() == DType::F64) {
    fn(double{});
  } else {
    HAP_CHECK(false, "op ", op, " on cuda: dtype ", dtype_name(out.dtype()),
              " has no CUDA kernel yet (f32 and f64 have)");
  }
  check_launch(op);
}

// A contiguous copy of any view of a device tensor, any dtype (ops/cuda/elementwise.cu).
Tensor contiguous_copy(const Tensor& x);

// x itself when contiguous, else contiguous_copy(x).
inline Tensor dense(const Tensor& x) { return x.is_contiguous() ? x : contiguous_copy(x); }

}  // namespace hap::ops::cuda
