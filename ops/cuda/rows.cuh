// What the row kernels share (softmax, the losses and row searches, norms, attention): -inf,
// the reduction operators with the CPU's semantics (Max is std::max: a NaN never replaces a
// number), a block-wide reduction in a fixed tree order, and row operands (where each row of a
// strided tensor starts, and its stride along the row's dim).
#pragma once
#include "ops/cuda/common.cuh"

namespace hap::ops::cuda {

__device__ __forceinline__ float neg_inf(float) { return __int_as_float(0xff800000u); }
__device__ __forceinline__ double neg_inf(double) {
  return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
}

// As std::max(a, b) on the CPU: b only when a < b, so a NaN never replaces a number.
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Plus {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// The block's reduction of one value per thread (blockDim.x == kThreads, a power of two) in a
// fixed tree order; every thread gets it. Every thread of the block must call it.
template <typename T, typename Op>
__device__ T block_reduce(T v, T* scratch, Op op) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) scratch[threadIdx.x] = op(scratch[threadIdx.x], scratch[threadIdx.x + s]);
    __syncthreads();
  }
  const T r = scratch[0];
  __syncthreads();
  return r;
}

// A row operand: where each row starts (over the other dims, in order) and the stride along the
// row's dim.
struct Rows {
  Indexer start;
  int64_t step = 0;
};

inline Rows rows_of(const Tensor& t, int64_t dim, const char* op) {
  HAP_CHECK(t.dim() <= kMaxDims, "op ", op, " on cuda: at most ", kMaxDims, " dimensions, got ",
            t.str());
  Rows r;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d == dim) {
      r.step = t.strides()[static_cast<size_t>(d)];
      continue;
    }
    r.start.sizes[r.start.ndim] = t.size(d);
    r.start.strides[r.start.ndim] = t.strides()[static_cast<size_t>(d)];
    ++r.start.ndim;
  }
  return r;
}

// Blocks for a kernel of one block per row (a grid-stride loop takes the rest).
inline int row_blocks(int64_t rows) { return static_cast<int>(rows < 65536 ? rows : 65536); }

}  // namespace hap::ops::cuda
