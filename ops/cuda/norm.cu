// CUDA kernels of layer_norm and rms_norm over the last dim with their backward, and of gelu (tanh
// approximation or erf) with its backward, for f32 and f64, mirroring the CPU kernels
// (ops/defs/nn.cc, ops/defs/elementwise.cc) expression by expression. A norm runs one block per
// row, operands strided as they come; the row statistics are sums in double reduced in the block
// in a fixed order, as are the parameter gradients (a fixed partition of the rows, the partial sums
// added in order): no atomics, so runs are bitwise-reproducible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/rows.cuh"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// ---------------- layer_norm / rms_norm ----------------
// layer_norm: y = (x - mean) rstd w + b; rms_norm: y = x rstd w; rstd = 1 / sqrt(var + eps) with
// the biased variance (rms_norm: mean(x^2)). An omitted weight is ones, an omitted bias zeros.

// The block's sums of two values per thread (blockDim.x == kThreads), a fixed tree; every thread
// gets both. scratch: 2 * kThreads.
__device__ void block_sum2(double& a, double& b, double* scratch) {
  double* sa = scratch;
  double* sb = scratch + kThreads;
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sa[threadIdx.x] += sa[threadIdx.x + s];
      sb[threadIdx.x] += sb[threadIdx.x + s];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
  __syncthreads();  // scratch is reused by the next reduction
}

// A [C] parameter: its data and stride, or null for an omitted one.
template <typename T>
struct Param {
  const T* data = nullptr;
  int64_t step = 0;
  __device__ T at(int64_t j, T fill) const { return data ? data[j * step] : fill; }
};

template <typename T>
Param<T> param_of(const Tensor& p) {
  if (!p.defined()) return {};
  return {ptr<T>(p), p.strides()[0]};
}

// mean (0 for rms_norm) and rstd of the row xs[j * step], j < n, as the CPU's norm_stats: sums of x
// and x^2 in double, var = max(E[x^2] - mean^2, 0), both rounded to T at the end.
template <typename T, bool kRms>
__device__ void row_stats(const T* xs, int64_t step, int64_t n, double eps, double* scratch,
                          T& mean_out, T& rstd_out) {
  double s = 0, ss = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double v = static_cast<double>(xs[j * step]);
    if constexpr (!kRms) s += v;
    ss += v * v;
  }
  block_sum2(s, ss, scratch);
  const double inv_n = 1.0 / static_cast<double>(n);
  const double mean = s * inv_n;
  const double d = ss * inv_n - mean * mean;
  const double var = d < 0.0 ? 0.0 : d;  // std::max(d, 0.0): a NaN stays NaN
  mean_out = static_cast<T>(mean);
  rstd_out = static_cast<T>(1.0 / sqrt(var + eps));
}

// y: [rows, n] contiguous.
template <typename T, bool kRms>
__global__ void norm_kernel(T* y, const T* x, Rows xr, Param<T> w, Param<T> b, int64_t rows,
                            int64_t n, double eps) {
  __shared__ double scratch[2 * kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xs = x + offset_of(xr.start, row);
    T* ys = y + row * n;
    T mean, rstd;
    row_stats<T, kRms>(xs, xr.step, n, eps, scratch, mean, rstd);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      if constexpr (kRms)
        ys[j] = xs[j * xr.step] * rstd * w.at(j, T(1));
      else
        ys[j] = (xs[j * xr.step] - mean) * rstd * w.at(j, T(1)) + b.at(j, T(0));
    }
  }
}

// dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) (rms_norm: without the mean(g w) term), with
// xhat = (x - mean) rstd; the row's mean and rstd are kept for the parameter gradients.
// dx: [rows, n] contiguous; mean_out, rstd_out: [rows].
template <typename T, bool kRms>
__global__ void norm_backward_kernel(T* dx, T* mean_out, T* rstd_out, const T* g, Rows gr,
                                     const T* x, Rows xr, Param<T> w, int64_t rows, int64_t n,
                                     double eps) {
  __shared__ double scratch[2 * kThreads];
  const T inv_n = T(1) / static_cast<T>(n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xs = x + offset_of(xr.start, row);
    const T* gs = g + offset_of(gr.start, row);
    T* dxs = dx + row * n;
    T mean, rstd;
    row_stats<T, kRms>(xs, xr.step, n, eps, scratch, mean, rstd);
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    // The CPU sums these in T; double here (more exact, within the tests' tolerance of it).
    double sum_gw = 0, sum_gwx = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = (xs[j * xr.step] - mean) * rstd;
      const T gw = gs[j * gr.step] * w.at(j, T(1));
      sum_gw += static_cast<double>(gw);
      sum_gwx += static_cast<double>(gw * xh);
    }
    block_sum2(sum_gw, sum_gwx, scratch);
    const T a = kRms ? T(0) : static_cast<T>(sum_gw) * inv_n;
    const T bx = static_cast<T>(sum_gwx) * inv_n;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T xh = (xs[j * xr.step] - mean) * rstd;
      dxs[j] = rstd * (gs[j * gr.step] * w.at(j, T(1)) - a - xh * bx);
    }
  }
}

// The parameter gradients dweight = sum over rows of g xhat, dbias = sum over rows of g, in two
// steps: a block per (32 columns, chunk of rows) sums its chunk in double into
// partial[chunk][param][column], then one thread per column adds the chunks in order. The chunks
// are a fixed partition of the rows (from the shape alone), so the order of every sum is fixed.
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;
constexpr int64_t kMaxRowChunks = 128;
constexpr int64_t kRowsPerChunk = 16;  // at least, below kMaxRowChunks chunks

template <typename T, bool kRms>
__global__ void norm_param_grad_partial_kernel(double* partial, const T* g, Rows gr, const T* x,
                                               Rows xr, const T* mean, const T* rstd, int64_t rows,
                                               int64_t n, int64_t chunks) {
  constexpr int64_t kParams = kRms ? 1 : 2;
  __shared__ double part[kParams][kTileRows][kTileCols];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kTileCols) + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows / chunks, r1 = (chunk + 1) * rows / chunks;
  double dw = 0, db = 0;
  if (j < n) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows) {
      const T gv = g[offset_of(gr.start, r) + j * gr.step];
      const T xh = (x[offset_of(xr.start, r) + j * xr.step] - mean[r]) * rstd[r];
      dw += static_cast<double>(gv * xh);
      if constexpr (!kRms) db += static_cast<double>(gv);
    }
  }
  part[0][threadIdx.y][threadIdx.x] = dw;
  if constexpr (!kRms) part[1][threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y != 0 || j >= n) return;
  for (int64_t p = 0; p < kParams; ++p) {
    double s = 0;
    for (int k = 0; k < kTileRows; ++k) s += part[p][k][threadIdx.x];
    partial[(chunk * kParams + p) * n + j] = s;
  }
}

// db is unused (may be null) for rms_norm; no chunks (no rows) give zeros.
template <typename T, bool kRms>
__global__ void norm_param_grad_final_kernel(T* dw, T* db, const double* partial, int64_t chunks,
                                             int64_t n) {
  constexpr int64_t kParams = kRms ? 1 : 2;
  HAP_GRID_STRIDE_LOOP(j, n) {
    double sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += partial[c * kParams * n + j];
      if constexpr (!kRms) sb += partial[(c * kParams + 1) * n + j];
    }
    dw[j] = static_cast<T>(sw);
    if constexpr (!kRms) db[j] = static_cast<T>(sb);
  }
}

const char* norm_op(bool rms, bool backward) {
  if (rms) return backward ? "rms_norm_backward" : "rms_norm";
  return backward ? "layer_norm_backward" : "layer_norm";
}

// Inputs (x [..., C], weight [C] or undefined[, bias [C] or undefined]); output y like x.
template <bool kRms>
std::vector<Tensor> norm(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const char* op = norm_op(kRms, false);
  const Tensor& x = c.inputs[0];
  const int64_t n = x.size(x.dim() - 1), rows = x.numel() / n;
  const double eps = attr<NormAttrs>(c.attrs).eps;
  const Rows xr = rows_of(x, x.dim() - 1, op);
  on_float(out, op, [&](auto tag) {
    using T = decltype(tag);
    const Param<T> w = param_of<T>(c.inputs[1]);
    const Param<T> b = kRms ? Param<T>{} : param_of<T>(c.inputs[2]);
    norm_kernel<T, kRms>
        <<<row_blocks(rows), kThreads>>>(ptr<T>(out), ptr<T>(x), xr, w, b, rows, n, eps);
  });
  return {out};
}

// Inputs (grad of y, x, weight or undefined); outputs dx, dweight[, dbias].
template <bool kRms>
std::vector<Tensor> norm_backward(const KernelContext& c) {
  std::vector<Tensor> outs;
  for (size_t i = 0; i < c.out_meta.size(); ++i) outs.push_back(c.alloc(i));
  const char* op = norm_op(kRms, true);
  const Tensor &g = c.inputs[0], &x = c.inputs[1];
  const int64_t n = x.size(x.dim() - 1), rows = x.numel() / n;
  const double eps = attr<NormAttrs>(c.attrs).eps;
  const Rows gr = rows_of(g, g.dim() - 1, op), xr = rows_of(x, x.dim() - 1, op);
  const int64_t chunks = std::min((rows + kRowsPerChunk - 1) / kRowsPerChunk, kMaxRowChunks);
  const int64_t params = kRms ? 1 : 2;
  const TensorOptions on_device = TensorOptions{}.with_device(x.device());
  const Tensor stats =
      Tensor::empty({2, rows}, TensorOptions(on_device).with_dtype(x.dtype()));  // mean, rstd
  const Tensor partial =
      Tensor::empty({chunks * params * n}, TensorOptions(on_device).with_dtype(DType::F64));
  on_float(outs[0], op, [&](auto tag) {
    using T = decltype(tag);
    T* dw = ptr<T>(outs[1]);
    T* db = kRms ? nullptr : ptr<T>(outs[2]);
    const double* part = nullptr;
    if (rows > 0) {
      T* mean = ptr<T>(stats);
      T* rstd = mean + rows;
      norm_backward_kernel<T, kRms>
          <<<row_blocks(rows), kThreads>>>(ptr<T>(outs[0]), mean, rstd, ptr<T>(g), gr, ptr<T>(x),
                                           xr, param_of<T>(c.inputs[2]), rows, n, eps);
      check_launch(op);
      const dim3 grid(static_cast<unsigned>((n + kTileCols - 1) / kTileCols),
                      static_cast<unsigned>(chunks));
      norm_param_grad_partial_kernel<T, kRms><<<grid, dim3(kTileCols, kTileRows)>>>(
          ptr<double>(partial), ptr<T>(g), gr, ptr<T>(x), xr, mean, rstd, rows, n, chunks);
      check_launch(op);
      part = ptr<double>(partial);
    }
    norm_param_grad_final_kernel<T, kRms><<<blocks_for(n), kThreads>>>(dw, db, part, chunks, n);
  });
  return outs;
}

// ---------------- gelu ----------------
// The CPU's formulas (ops/defs/elementwise.cc) in the same order of operations; tanh, erf and exp
// are the device library's (the CPU's f32 tanh is a Cephes polynomial: they differ by a few ulp).

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;
constexpr double kSqrt1Over2 = 0.70710678118654752440;  // M_SQRT1_2
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <typename T>
__device__ T gelu_tanh(T x) {
  const T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCoeff) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + tanh(u));
}
template <typename T>
__device__ T gelu_tanh_grad(T x) {
  const T x2 = x * x;
  const T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCoeff) * x2 * x);
  const T th = tanh(u);
  const T du =
      static_cast<T>(kSqrt2OverPi) * (static_cast<T>(1) + static_cast<T>(3 * kGeluCoeff) * x2);
  return static_cast<T>(0.5) * (static_cast<T>(1) + th) +
         static_cast<T>(0.5) * x * (static_cast<T>(1) - th * th) * du;
}
template <typename T>
__device__ T gelu_erf(T x) {
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + erf(x * static_cast<T>(kSqrt1Over2)));
}
template <typename T>
__device__ T gelu_erf_grad(T x) {
  const T cdf = static_cast<T>(0.5) * (static_cast<T>(1) + erf(x * static_cast<T>(kSqrt1Over2)));
  const T pdf = exp(static_cast<T>(-0.5) * x * x) * static_cast<T>(kInvSqrt2Pi);
  return cdf + x * pdf;
}

// T is the storage type; bf16 computes in f32 (widen, narrow), as the f32 route would.
template <typename T, bool kTanh>
__global__ void gelu_kernel(T* out, const T* x, Indexer ix, int64_t n) {
  HAP_GRID_STRIDE_LOOP(i, n) {
    const auto v = widen(x[offset_of(ix, i)]);
    out[i] = narrow<T>(kTanh ? gelu_tanh(v) : gelu_erf(v));
  }
}

// gx = g gelu'(x), g and x broadcast to the output's shape.
template <typename T, bool kTanh>
__global__ void gelu_backward_kernel(T* out, const T* g, Indexer ig, const T* x, Indexer ix,
                                     int64_t n) {
  HAP_GRID_STRIDE_LOOP(i, n) {
    const auto v = widen(x[offset_of(ix, i)]);
    out[i] = narrow<T>(widen(g[offset_of(ig, i)]) * (kTanh ? gelu_tanh_grad(v) : gelu_erf_grad(v)));
  }
}

std::vector<Tensor> gelu(const KernelContext& c) {
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  const bool tanh_approx = attr<GeluAttrs>(c.attrs).approx == GeluApprox::Tanh;
  const Indexer ix = indexer(c.inputs[0], out.shape(), "gelu");
  on_float_or_bf16(out, "gelu", [&](auto tag) {
    using T = decltype(tag);
    if (tanh_approx)
      gelu_kernel<T, true><<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ix, n);
    else
      gelu_kernel<T, false><<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ix, n);
  });
  return {out};
}

// Inputs (grad of the output, x).
std::vector<Tensor> gelu_backward(const KernelContext& c) {
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  if (n == 0) return {out};
  const bool tanh_approx = attr<GeluAttrs>(c.attrs).approx == GeluApprox::Tanh;
  const Indexer ig = indexer(c.inputs[0], out.shape(), "gelu_backward"),
                ix = indexer(c.inputs[1], out.shape(), "gelu_backward");
  on_float_or_bf16(out, "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = ptr<T>(c.inputs[0]);
    const T* x = ptr<T>(c.inputs[1]);
    if (tanh_approx)
      gelu_backward_kernel<T, true><<<blocks_for(n), kThreads>>>(ptr<T>(out), g, ig, x, ix, n);
    else
      gelu_backward_kernel<T, false><<<blocks_for(n), kThreads>>>(ptr<T>(out), g, ig, x, ix, n);
  });
  return {out};
}

}  // namespace

void register_norm(OpTable& t) {
  t[static_cast<size_t>(OpKind::LayerNorm)].cuda = norm<false>;
  t[static_cast<size_t>(OpKind::RmsNorm)].cuda = norm<true>;
  t[static_cast<size_t>(OpKind::LayerNormBackward)].cuda = norm_backward<false>;
  t[static_cast<size_t>(OpKind::RmsNormBackward)].cuda = norm_backward<true>;
  t[static_cast<size_t>(OpKind::Gelu)].cuda = gelu;
  t[static_cast<size_t>(OpKind::GeluBackward)].cuda = gelu_backward;
  // gelu takes bf16 itself (f32 compute, one rounding: the route's result in one kernel).
  t[static_cast<size_t>(OpKind::Gelu)].cuda_bf16 = true;
  t[static_cast<size_t>(OpKind::GeluBackward)].cuda_bf16 = true;
}

}  // namespace hap::ops::cuda
