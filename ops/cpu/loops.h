// Elementwise loop templates for the CPU kernels: flat loops over contiguous data, broadcast
// loops over rows of the output, parallelised with OpenMP over both cores.
#pragma once
#include <cstdint>
#include <vector>

#include "core/strided_copy.h"
#include "core/tensor.h"
#include "ops/cpu/multiversion.h"

namespace hap::cpu {

// Work below this many elements runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelGrain = 1 << 15;

// Strides that read `t` as if broadcast to `shape` (0 along broadcast dims).
inline Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  size_t n = shape.size(), k = t.shape().size();
  Strides s(n, 0);
  for (size_t i = 0; i < k; ++i) {
    size_t o = n - k + i;
    s[o] = t.shape()[i] == 1 && shape[o] != 1 ? 0 : t.strides()[i];
  }
  return s;
}

// out[i] = f(a[i]) over a contiguous out; `a` of the same shape, any layout.
template <typename T, typename F>
HAP_MULTIVERSION void unary_map_clones(const Tensor& out, const Tensor& a_in, F f) {
  Tensor a = a_in.contiguous();
  const T* x = a.data<T>();
  T* y = out.data<T>();
  int64_t n = out.numel();
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

template <typename T, typename F>
void unary_map(const Tensor& out, const Tensor& a_in, F f) {
  ::hap::cpu::clone_call (&unary_map_clones<T, F>)(out, a_in, f);
}

// out[i] = f(a[i], b[i]) with NumPy broadcasting of a and b to out's shape.
template <typename T, typename F>
HAP_MULTIVERSION void binary_map_clones(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  const Shape& shape = out.shape();
  int64_t n = out.numel();
  if (n == 0) return;
  T* y = out.data<T>();
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  bool a_full = a.shape() == shape && a.is_contiguous();
  bool b_full = b.shape() == shape && b.is_contiguous();
  if (a_full && b_full) {
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = f(pa[i], pb[i]);
    return;
  }
  if (a_full && b.numel() == 1) {
    T s = pb[0];
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = f(pa[i], s);
    return;
  }
  if (b_full && a.numel() == 1) {
    T s = pa[0];
#pragma omp parallel for simd if (parallel : n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) y[i] = f(s, pb[i]);
    return;
  }
  int64_t nd = static_cast<int64_t>(shape.size());
  Strides sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  int64_t inner = shape[nd - 1];
  int64_t ia = sa[nd - 1], ib = sb[nd - 1];
  int64_t rows = n / inner;
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, oa = 0, ob = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      int64_t c = rem % shape[d];
      rem /= shape[d];
      oa += c * sa[d];
      ob += c * sb[d];
    }
    T* yr = y + r * inner;
    const T* ar = pa + oa;
    const T* br = pb + ob;
    if (ia == 1 && ib == 1) {
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j) yr[j] = f(ar[j], br[j]);
    } else if (ia == 1 && ib == 0) {
      T s = br[0];
#pragma omp simd
      for (int64_t j = 0; j < inner; ++j) yr[j] = f(ar[j], s);
    } else {
      for (int64_t j = 0; j < inner; ++j) yr[j] = f(ar[j * ia], br[j * ib]);
    }
  }
}

template <typename T, typename F>
void binary_map(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  ::hap::cpu::clone_call (&binary_map_clones<T, F>)(out, a, b, f);
}

// Views a tensor as [outer, size(dim), inner] (contiguous input) for ops over one dim.
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
inline DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim)
      s.outer *= shape[d];
    else if (d == dim)
      s.n = shape[d];
    else
      s.inner *= shape[d];
  }
  return s;
}

}  // namespace hap::cpu
