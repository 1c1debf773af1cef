// What CUDA kernels share for strided operands: an operand's sizes and strides over an output's
// shape (broadcast dims have stride 0), the offset of a flat index, launch sizes and checks.
// Used by the core's device tensor operations (core/cuda/tensor_ops.cu) and the op kernels
// (ops/cuda/).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/cuda/check.h"
#include "core/error.h"
#include "core/tensor.h"

namespace hap::cuda {

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

// `t` read over the shape `out` (t's dims aligned to the right, size-1 dims broadcast); `what`
// names the caller in the error for too many dims.
inline Indexer indexer(const Tensor& t, const Shape& out, const char* what) {
  HAP_CHECK(out.size() <= kMaxDims, what, " on cuda: at most ", kMaxDims, " dimensions, got ",
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

inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define HAP_GRID_STRIDE_LOOP(i, n)                                                       \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// After a launch: a launch error names `what` and the runtime's words.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  HAP_CHECK(e == cudaSuccess, what, " on cuda: kernel launch failed: ", cudaGetErrorName(e), ": ",
            cudaGetErrorString(e));
}

// bf16 in kernels: its bits, converted as the host's hap::bf16 does (round to nearest even, a NaN
// stays a quiet NaN).
struct Bf16 {
  uint16_t bits;
};
__device__ __forceinline__ float bf16_to_f32(Bf16 b) {
  return __uint_as_float(static_cast<uint32_t>(b.bits) << 16);
}
__device__ __forceinline__ Bf16 f32_to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  return Bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
// f64 -> f32 toward zero with the last bit set when inexact, as core/strided_copy.h.
__device__ __forceinline__ float f32_round_to_odd(double v) {
  const float f = __double2float_rn(v);
  if (static_cast<double>(f) == v || !isfinite(f)) return f;
  uint32_t u = __float_as_uint(f);
  if (fabs(static_cast<double>(f)) > fabs(v)) --u;
  return __uint_as_float(u | 1u);
}

// An integer type's limits as constants a kernel may read (numeric_limits' functions are host
// code).
template <typename To>
struct IntLimits {
  static constexpr To kLowest = std::numeric_limits<To>::lowest();
  static constexpr To kMax = std::numeric_limits<To>::max();
};

// The host's saturating_int (core/strided_copy.h): toward zero, saturated, NaN to 0.
template <typename To, typename From>
__device__ __forceinline__ To saturating_int(From v) {
  const double d = static_cast<double>(v);
  if (d != d) return To(0);
  if (d <= static_cast<double>(IntLimits<To>::kLowest)) return IntLimits<To>::kLowest;
  if (d >= static_cast<double>(IntLimits<To>::kMax)) return IntLimits<To>::kMax;
  return static_cast<To>(v);
}

// The host's convert<To>(From) (core/strided_copy.h) in a kernel.
template <typename To, typename From>
__device__ __forceinline__ To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, Bf16> && std::is_same_v<From, double>) {
    return f32_to_bf16(f32_round_to_odd(v));
  } else if constexpr (std::is_same_v<To, Bf16>) {
    return f32_to_bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, Bf16>) {
    return convert<To>(bf16_to_f32(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return saturating_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Calls f(T{}) with T the kernel type of `dtype` (Bf16 for bf16).
template <typename F>
void on_any_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    case DType::BF16:
      return f(Bf16{});
    case DType::I64:
      return f(int64_t{});
    case DType::U8:
      return f(uint8_t{});
  }
  HAP_ASSERT(false, "unknown dtype");
}

}  // namespace hap::cuda
