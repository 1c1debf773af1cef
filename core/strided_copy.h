// Type dispatch and strided element iteration shared by core and the CPU kernels.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/tensor.h"

namespace hap {

// f64 -> f32 rounding toward zero with the last bit set when inexact ("round to odd"): rounding
// that result to bf16 then equals rounding the f64 directly. Plain f32 rounding first could land
// exactly on a bf16 midpoint and tie the wrong way.
inline float f32_round_to_odd(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) == v || !std::isfinite(f)) return f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --u;  // back toward zero
  u |= 1u;
  std::memcpy(&f, &u, 4);
  return f;
}

// A float to an integer type: truncated toward zero, saturated at the type's limits, NaN to 0 (C++
// leaves the out-of-range cases undefined; every device converts this way: core/cuda).
template <typename To, typename From>
inline To saturating_int(From v) {
  constexpr To kLowest = std::numeric_limits<To>::lowest(), kMax = std::numeric_limits<To>::max();
  const double d = static_cast<double>(v);
  if (d != d) return To(0);
  if (d <= static_cast<double>(kLowest)) return kLowest;
  if (d >= static_cast<double>(kMax)) return kMax;
  return static_cast<To>(v);
}

template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bf16> && std::is_same_v<From, double>) {
    return bf16(f32_round_to_odd(v));
  } else if constexpr (std::is_same_v<To, bf16>) {
    return bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, bf16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return saturating_int<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Calls f(T{}) with T the C++ type of dtype.
template <typename F>
decltype(auto) dispatch_all_types(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    case DType::BF16:
      return f(bf16{});
    case DType::I64:
      return f(int64_t{});
    case DType::U8:
      return f(uint8_t{});
  }
  HAP_ASSERT(false, "unknown dtype");
  return f(float{});
}

// Calls f(T{}) for the compute types f32 and f64; other dtypes are an error naming `op`.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    default:
      break;
  }
  HAP_CHECK(false, op, ": expected a f32 or f64 tensor, got ", dtype_name(dtype));
  return f(float{});
}

// Calls f(offset) for every element of a strided view, in row-major logical order.
template <typename F>
void for_each_offset(const Shape& shape, const Strides& strides, F&& f) {
  int64_t nd = static_cast<int64_t>(shape.size());
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (nd == 0) {
    f(int64_t{0});
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  int64_t base = 0;
  for (int64_t done = 0; done < n; done += inner) {
    for (int64_t j = 0; j < inner; ++j) f(base + j * inner_stride);
    for (int64_t d = nd - 2; d >= 0; --d) {
      base += strides[d];
      if (++idx[d] < shape[d]) break;
      base -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

// dst[i] = convert(src[i]) elementwise over two views of the same shape.
void strided_copy(const Tensor& dst, const Tensor& src);

}  // namespace hap
