// CUDA kernels of softmax and log-softmax along any dim, and their backward: one block per row
// (every dim but `dim`), operands strided as they come; max, sum and dot products reduced in the
// block in a fixed order.
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/rows.cuh"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

template <typename T, bool kLog>
__global__ void softmax_kernel(T* y, Rows yr, const T* x, Rows xr, int64_t rows, int64_t n) {
  __shared__ T scratch[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xs = x + offset_of(xr.start, row);
    T* ys = y + offset_of(yr.start, row);
    T mx = neg_inf(T{});
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = Max{}(mx, xs[j * xr.step]);
    mx = block_reduce(mx, scratch, Max{});
    T sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T e = exp(xs[j * xr.step] - mx);
      if (!kLog) ys[j * yr.step] = e;
      sum += e;
    }
    sum = block_reduce(sum, scratch, Plus{});
    if (kLog) {
      const T lse = mx + log(sum);
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) ys[j * yr.step] = xs[j * xr.step] - lse;
    } else {
      const T inv = T(1) / sum;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) ys[j * yr.step] *= inv;
    }
  }
}

// softmax: gx = y (g - sum(g y)); log_softmax: gx = g - exp(y) sum(g).
template <typename T, bool kLog>
__global__ void softmax_backward_kernel(T* gx, Rows gxr, const T* g, Rows gr, const T* y, Rows yr,
                                        int64_t rows, int64_t n) {
  __shared__ T scratch[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* gs = g + offset_of(gr.start, row);
    const T* ys = y + offset_of(yr.start, row);
    T* out = gx + offset_of(gxr.start, row);
    T dot = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      dot += kLog ? gs[j * gr.step] : gs[j * gr.step] * ys[j * yr.step];
    dot = block_reduce(dot, scratch, Plus{});
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T gj = gs[j * gr.step], yj = ys[j * yr.step];
      out[j * gxr.step] = kLog ? gj - exp(yj) * dot : yj * (gj - dot);
    }
  }
}

int64_t softmax_dim(const KernelContext& c, const Tensor& out) {
  const int64_t d = attr<DimAttrs>(c.attrs).dim;
  return d < 0 ? d + out.dim() : d;
}

template <bool kLog>
std::vector<Tensor> softmax(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const int64_t dim = softmax_dim(c, out), n = out.size(dim), rows = out.numel() / n;
  const char* op = op_name(c.kind);
  const Rows yr = rows_of(out, dim, op), xr = rows_of(c.inputs[0], dim, op);
  const int blocks = row_blocks(rows);
  on_float(out, op, [&](auto tag) {
    using T = decltype(tag);
    softmax_kernel<T, kLog>
        <<<blocks, kThreads>>>(ptr<T>(out), yr, ptr<T>(c.inputs[0]), xr, rows, n);
  });
  return {out};
}

template <bool kLog>
std::vector<Tensor> softmax_backward(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const int64_t dim = softmax_dim(c, out), n = out.size(dim), rows = out.numel() / n;
  const char* op = op_name(c.kind);
  const Rows gxr = rows_of(out, dim, op), gr = rows_of(c.inputs[0], dim, op),
             yr = rows_of(c.inputs[1], dim, op);
  const int blocks = row_blocks(rows);
  on_float(out, op, [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T, kLog><<<blocks, kThreads>>>(ptr<T>(out), gxr, ptr<T>(c.inputs[0]),
                                                           gr, ptr<T>(c.inputs[1]), yr, rows, n);
  });
  return {out};
}

}  // namespace

void register_softmax(OpTable& t) {
  t[static_cast<size_t>(OpKind::Softmax)].cuda = softmax<false>;
  t[static_cast<size_t>(OpKind::LogSoftmax)].cuda = softmax<true>;
  t[static_cast<size_t>(OpKind::SoftmaxBackward)].cuda = softmax_backward<false>;
  t[static_cast<size_t>(OpKind::LogSoftmaxBackward)].cuda = softmax_backward<true>;
}

}  // namespace hap::ops::cuda
