// CUDA kernels of the losses of ops/defs/loss.cc (cross_entropy and its backward, target_logit and
// its backward, count_targets) and of the row searches of ops/defs/reduce.cc (logsumexp, max,
// argmax, topk, and index_backward, the scatter their backward rules use).
//
// Row reductions run one block per row (rows strided as they come) and reduce in the block in a
// fixed tree order; target_logit and its backward take one thread per element, index_backward one
// per column it scatters into. No float atomics: runs are bitwise-reproducible. Where the CPU
// kernel accumulates in double these do too; the sums of exponentials that the CPU's cross-entropy
// keeps in the input's type are kept in double here as well, so f32 results agree with the CPU's to
// rounding, not bit for bit.
//
// Targets out of range: a kernel cannot throw, so cross_entropy and its backward first scan the
// targets in one block (count, and the first position whose target is not a class index), copy
// that back (the host waits for the device) and raise the CPU kernel's error, word for word,
// before any kernel reads a logit at a target. index_backward likewise raises the CPU's internal
// error when an index falls outside its dim (a device flag, copied back after the kernel).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/cuda/backend.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/rows.cuh"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// The row's largest number (NaNs skipped, as the CPU's std::max does), -inf when it has none.
template <typename T>
__device__ T row_max(const T* x, int64_t step, int64_t n, T* scratch) {
  T mx = neg_inf(T{});
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = Max{}(mx, x[j * step]);
  return block_reduce(mx, scratch, Max{});
}

// sum_j exp(x_j - mx), each exponential in T (as the CPU's exp_fast), summed in double.
template <typename T>
__device__ double row_exp_sum(const T* x, int64_t step, int64_t n, T mx, double* scratch) {
  double sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    sum += static_cast<double>(exp(x[j * step] - mx));
  return block_reduce(sum, scratch, Plus{});
}

// ---- targets ----

// One block over the targets (any shape, strided): how many differ from `ignore` into *count;
// with `bad` given, also the first flat position whose counted target is not in [0, v) into
// bad[0] (n when none) and that target into bad[1].
__global__ void scan_targets_kernel(const int64_t* targets, Indexer ix, int64_t n, int64_t v,
                                    int64_t ignore, int64_t* count, int64_t* bad) {
  __shared__ int64_t scratch[kThreads];
  int64_t counted = 0, first = n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = targets[offset_of(ix, i)];
    if (t == ignore) continue;
    ++counted;
    if (bad != nullptr && (t < 0 || t >= v) && i < first) first = i;
  }
  counted = block_reduce(counted, scratch, Plus{});
  if (threadIdx.x == 0) *count = counted;
  if (bad == nullptr) return;
  first = block_reduce(first, scratch, Min{});
  if (threadIdx.x == 0) {
    bad[0] = first;
    bad[1] = first < n ? targets[offset_of(ix, first)] : 0;
  }
}

// The CPU's counted_targets: how many targets count, each of them a class index in [0, v), else
// its error. Waits for the device.
int64_t counted_targets(const Tensor& targets, int64_t v, int64_t ignore) {
  const int64_t n = targets.numel();
  Tensor scan =
      Tensor::empty({3}, TensorOptions{}.with_dtype(DType::I64).with_device(targets.device()));
  int64_t* s = ptr<int64_t>(scan);
  scan_targets_kernel<<<1, kThreads>>>(ptr<int64_t>(targets),
                                       indexer(targets, targets.shape(), "cross_entropy"), n, v,
                                       ignore, s, s + 1);
  check_launch("cross_entropy");
  int64_t h[3] = {};
  HAP_CUDA_CHECK(cudaMemcpy(h, s, sizeof h, cudaMemcpyDeviceToHost));
  HAP_CHECK(h[1] == n, "cross_entropy: target ", h[2], " at position ", h[1],
            " is out of range for ", v, " classes (expected 0 <= target < ", v,
            ", or ignore_index ", ignore, ")");
  return h[0];
}

// ---- cross_entropy ----

// Row i's loss: logsumexp(x_i) - (1 - e) x_i[t_i] - e mean_j x_i[j], 0 for an ignored row; into
// out_rows[i] (as T) when given, else row_loss[i]. x: [N, V] with strides (xs0, xs1).
template <typename T>
__global__ void cross_entropy_kernel(const T* x, int64_t xs0, int64_t xs1, const int64_t* targets,
                                     int64_t ts, int64_t n, int64_t v, int64_t ignore, double e,
                                     T* out_rows, double* row_loss) {
  __shared__ T tscratch[kThreads];
  __shared__ double dscratch[kThreads];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const int64_t t = targets[row * ts];
    double loss = 0;
    if (t != ignore) {  // the same for every thread of the block
      const T* xr = x + row * xs0;
      const T mx = row_max(xr, xs1, v, tscratch);
      const double sum = row_exp_sum(xr, xs1, v, mx, dscratch);
      double smooth = 0;
      if (e != 0) {
        double part = 0;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
          part += static_cast<double>(xr[j * xs1]);
        smooth = e * block_reduce(part, dscratch, Plus{}) / static_cast<double>(v);
      }
      loss = static_cast<double>(mx) + log(sum) - (1.0 - e) * static_cast<double>(xr[t * xs1]) -
             smooth;
    }
    if (threadIdx.x == 0) {
      if (out_rows != nullptr)
        out_rows[row] = static_cast<T>(loss);
      else
        row_loss[row] = loss;
    }
  }
}

// One block: the sum of the row losses, over `count` for a mean (0 when none counts).
template <typename T>
__global__ void reduce_losses_kernel(T* out, const double* row_loss, int64_t n, bool mean,
                                     int64_t count) {
  __shared__ double scratch[kThreads];
  double part = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) part += row_loss[i];
  double total = block_reduce(part, scratch, Plus{});
  if (mean) total = count == 0 ? 0.0 : total / static_cast<double>(count);
  if (threadIdx.x == 0) out[0] = static_cast<T>(total);
}

std::vector<Tensor> cross_entropy(const KernelContext& c) {
  const Tensor &x = c.inputs[0], &targets = c.inputs[1];
  const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = x.size(0), v = x.size(1);
  const bool per_row = a.reduction == Reduction::None;
  on_float(out, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const int64_t count = counted_targets(targets, v, a.ignore_index);
    Tensor row_loss;
    if (!per_row)
      row_loss = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::F64).with_device(x.device()));
    if (n > 0) {
      cross_entropy_kernel<T><<<row_blocks(n), kThreads>>>(
          ptr<T>(x), x.strides()[0], x.strides()[1], ptr<int64_t>(targets), targets.strides()[0], n,
          v, a.ignore_index, a.label_smoothing, per_row ? ptr<T>(out) : nullptr,
          per_row ? nullptr : ptr<double>(row_loss));
    }
    if (!per_row) {
      reduce_losses_kernel<T><<<1, kThreads>>>(ptr<T>(out), ptr<double>(row_loss), n,
                                               a.reduction == Reduction::Mean, count);
    }
  });
  return {out};
}

// d x_i = (softmax(x_i) - (1 - e) onehot(t_i) - e / V) g_i for counted rows, 0 for ignored rows,
// g_i as the CPU kernel takes it: g[0] / count (mean), g[0] (sum) or g[i] (none). y: [N, V]
// contiguous; the exponentials are recomputed rather than stored and reread.
template <typename T>
__global__ void cross_entropy_backward_kernel(T* y, const T* g, int64_t gs, const T* x, int64_t xs0,
                                              int64_t xs1, const int64_t* targets, int64_t ts,
                                              int64_t n, int64_t v, int64_t ignore, T e,
                                              Reduction reduction, int64_t count) {
  __shared__ T tscratch[kThreads];
  __shared__ double dscratch[kThreads];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    T* yr = y + row * v;
    const int64_t t = targets[row * ts];
    if (t == ignore) {  // the same for every thread of the block
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) yr[j] = T(0);
      continue;
    }
    const T* xr = x + row * xs0;
    const T mx = row_max(xr, xs1, v, tscratch);
    const T sum = static_cast<T>(row_exp_sum(xr, xs1, v, mx, dscratch));
    const T scale =
        reduction == Reduction::None ? g[row * gs]
        : reduction == Reduction::Sum
            ? g[0]
            : (count == 0 ? T(0)
                          : static_cast<T>(static_cast<double>(g[0]) / static_cast<double>(count)));
    const T f = scale / sum, uniform = scale * e / static_cast<T>(v);
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      T d = exp(xr[j * xs1] - mx) * f - uniform;
      if (j == t) d -= scale * (T(1) - e);
      yr[j] = d;
    }
  }
}

std::vector<Tensor> cross_entropy_backward(const KernelContext& c) {
  const Tensor &g = c.inputs[0], &x = c.inputs[1], &targets = c.inputs[2];
  const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = x.size(0), v = x.size(1);
  on_float(out, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t count = counted_targets(targets, v, a.ignore_index);
    if (n == 0) return;
    const int64_t gs = a.reduction == Reduction::None ? g.strides()[0] : 0;
    cross_entropy_backward_kernel<T><<<row_blocks(n), kThreads>>>(
        ptr<T>(out), ptr<T>(g), gs, ptr<T>(x), x.strides()[0], x.strides()[1],
        ptr<int64_t>(targets), targets.strides()[0], n, v, a.ignore_index,
        static_cast<T>(a.label_smoothing), a.reduction, count);
  });
  return {out};
}

// ---- target_logit ----

// The column of a target in a tensor holding columns [offset, offset + v), or -1.
__device__ __forceinline__ int64_t held_column(int64_t target, int64_t offset, int64_t ignore,
                                               int64_t v) {
  if (target == ignore) return -1;
  const int64_t j = target - offset;
  return j >= 0 && j < v ? j : -1;
}

template <typename T>
__global__ void target_logit_kernel(T* out, const T* x, int64_t xs0, int64_t xs1,
                                    const int64_t* targets, int64_t ts, int64_t n, int64_t v,
                                    int64_t offset, int64_t ignore) {
  HAP_GRID_STRIDE_LOOP(i, n) {
    const int64_t j = held_column(targets[i * ts], offset, ignore, v);
    out[i] = j < 0 ? T(0) : x[i * xs0 + j * xs1];
  }
}

// out [N, V] contiguous: g[i] at [i, held column of target i], 0 elsewhere.
template <typename T>
__global__ void target_logit_backward_kernel(T* out, const T* g, int64_t gs, const int64_t* targets,
                                             int64_t ts, int64_t n, int64_t v, int64_t offset,
                                             int64_t ignore) {
  HAP_GRID_STRIDE_LOOP(k, n * v) {
    const int64_t i = k / v, j = k % v;
    out[k] = j == held_column(targets[i * ts], offset, ignore, v) ? g[i * gs] : T(0);
  }
}

std::vector<Tensor> target_logit(const KernelContext& c) {
  const Tensor &x = c.inputs[0], &targets = c.inputs[1];
  const TargetAttrs& a = attr<TargetAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = x.size(0), v = x.size(1);
  if (n == 0) return {out};
  on_float(out, "target_logit", [&](auto tag) {
    using T = decltype(tag);
    target_logit_kernel<T><<<blocks_for(n), kThreads>>>(
        ptr<T>(out), ptr<T>(x), x.strides()[0], x.strides()[1], ptr<int64_t>(targets),
        targets.strides()[0], n, v, a.offset, a.ignore_index);
  });
  return {out};
}

std::vector<Tensor> target_logit_backward(const KernelContext& c) {
  const Tensor &g = c.inputs[0], &targets = c.inputs[2];
  const TargetAttrs& a = attr<TargetAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = out.size(0), v = out.size(1);
  if (out.numel() == 0) return {out};
  on_float(out, "target_logit_backward", [&](auto tag) {
    using T = decltype(tag);
    target_logit_backward_kernel<T><<<blocks_for(n * v), kThreads>>>(
        ptr<T>(out), ptr<T>(g), g.strides()[0], ptr<int64_t>(targets), targets.strides()[0], n, v,
        a.offset, a.ignore_index);
  });
  return {out};
}

std::vector<Tensor> count_targets(const KernelContext& c) {
  const Tensor& targets = c.inputs[0];
  const int64_t ignore = attr<CrossEntropyAttrs>(c.attrs).ignore_index;
  Tensor out = c.alloc(0);
  ::hap::cuda::set_device(out.device().index);
  scan_targets_kernel<<<1, kThreads>>>(ptr<int64_t>(targets),
                                       indexer(targets, targets.shape(), "count_targets"),
                                       targets.numel(), 0, ignore, ptr<int64_t>(out), nullptr);
  check_launch("count_targets");
  return {out};
}

// ---- logsumexp ----

// out[row] = log sum_j exp(x_j) over the row, stable: the exponentials of (x_j - max) taken and
// summed in double; -inf for a row of no numbers above -inf (the log of an empty sum).
template <typename T>
__global__ void logsumexp_kernel(T* out, const T* x, Rows xr, int64_t rows, int64_t n) {
  __shared__ T tscratch[kThreads];
  __shared__ double dscratch[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xs = x + offset_of(xr.start, row);
    const T mx = row_max(xs, xr.step, n, tscratch);
    if (mx == neg_inf(T{})) {  // the same for every thread of the block
      if (threadIdx.x == 0) out[row] = mx;
      continue;
    }
    double sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      sum += exp(static_cast<double>(xs[j * xr.step] - mx));
    sum = block_reduce(sum, dscratch, Plus{});
    if (threadIdx.x == 0) out[row] = static_cast<T>(static_cast<double>(mx) + log(sum));
  }
}

std::vector<Tensor> logsumexp(const KernelContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = c.alloc(0);
  const int64_t rows = out.numel(), dim = x.dim() - 1;
  if (rows == 0) return {out};
  const Rows xr = rows_of(x, dim, "logsumexp");
  on_float(out, "logsumexp", [&](auto tag) {
    using T = decltype(tag);
    logsumexp_kernel<T>
        <<<row_blocks(rows), kThreads>>>(ptr<T>(out), ptr<T>(x), xr, rows, x.size(dim));
  });
  return {out};
}

// ---- max, argmax, topk ----

// x above y: a NaN above every number (as in PyTorch), NaNs equal to each other.
template <typename T>
__device__ __forceinline__ bool above(T x, T y) {
  return x > y || (x != x && y == y);
}

// The CPU topk's order: by value (largest or smallest first), ties by index. A strict total order
// over a row's elements, so each pick below is unique whatever the reduction order.
template <typename T>
struct Ranking {
  bool largest;
  __device__ bool operator()(T a, int64_t ia, T b, int64_t ib) const {
    if (above(a, b)) return largest;
    if (above(b, a)) return !largest;
    return ia < ib;
  }
};

// The first k elements of each row by Ranking: k passes, each picking the first element that
// ranks after the previous pick (O(k n) per row). Pick j of row (o, i) goes to (o k + j) inner + i
// of `values` and/or `indices` (either null to skip). With k = 1, largest first, this is the CPU's
// argmax scan: the first maximum, the first NaN when there is one.
template <typename T>
__global__ void select_kernel(T* values, int64_t* indices, const T* x, Rows xr, int64_t rows,
                              int64_t n, int64_t inner, int64_t k, bool largest) {
  __shared__ T sv[kThreads];
  __shared__ int64_t si[kThreads];
  const Ranking<T> before{largest};
  const unsigned tid = threadIdx.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xs = x + offset_of(xr.start, row);
    const int64_t o = row / inner, i = row % inner;
    T last = T(0);
    int64_t last_i = -1;  // the previous pick; -1 before the first
    for (int64_t j = 0; j < k; ++j) {
      T bv = T(0);
      int64_t bi = -1;  // this thread's best candidate; -1: none
      for (int64_t col = tid; col < n; col += blockDim.x) {
        const T val = xs[col * xr.step];
        if (last_i >= 0 && !before(last, last_i, val, col)) continue;  // picked already
        if (bi < 0 || before(val, col, bv, bi)) {
          bv = val;
          bi = col;
        }
      }
      sv[tid] = bv;
      si[tid] = bi;
      __syncthreads();
      for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s && si[tid + s] >= 0 &&
            (si[tid] < 0 || before(sv[tid + s], si[tid + s], sv[tid], si[tid]))) {
          sv[tid] = sv[tid + s];
          si[tid] = si[tid + s];
        }
        __syncthreads();
      }
      last = sv[0];
      last_i = si[0];
      __syncthreads();
      if (tid == 0) {
        const int64_t at = (o * k + j) * inner + i;
        if (values != nullptr) values[at] = last;
        if (indices != nullptr) indices[at] = last_i;
      }
    }
  }
}

// Runs select_kernel over x's rows along `dim` into contiguous outputs whose `dim` holds k.
void select_rows(const Tensor& x, int64_t dim, int64_t k, bool largest, const Tensor& values,
                 const Tensor& indices, const char* op) {
  int64_t rows = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d != dim) rows *= x.size(d);
    if (d > dim) inner *= x.size(d);
  }
  if (rows == 0 || k == 0) return;
  const Rows xr = rows_of(x, dim, op);
  on_float(x, op, [&](auto tag) {
    using T = decltype(tag);
    select_kernel<T>
        <<<row_blocks(rows), kThreads>>>(values.defined() ? ptr<T>(values) : nullptr,
                                         indices.defined() ? ptr<int64_t>(indices) : nullptr,
                                         ptr<T>(x), xr, rows, x.size(dim), inner, k, largest);
  });
}

std::vector<Tensor> max_values(const KernelContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = c.alloc(0);
  select_rows(x, wrap_dim(attr<DimAttrs>(c.attrs).dim, x.dim(), "max"), 1, true, out, Tensor(),
              "max");
  return {out};
}

std::vector<Tensor> argmax_indices(const KernelContext& c) {
  const Tensor& x = c.inputs[0];
  Tensor out = c.alloc(0);
  select_rows(x, wrap_dim(attr<DimAttrs>(c.attrs).dim, x.dim(), "argmax"), 1, true, Tensor(), out,
              "argmax");
  return {out};
}

std::vector<Tensor> topk(const KernelContext& c) {
  const Tensor& x = c.inputs[0];
  const TopKAttrs& a = attr<TopKAttrs>(c.attrs);
  Tensor values = c.alloc(0), indices = c.alloc(1);
  select_rows(x, wrap_dim(a.dim, x.dim(), "topk dim"), a.k, a.largest, values, indices, "topk");
  return {values, indices};
}

// ---- index_backward ----

// A shape as [outer, n, inner] around `dim` (the CPU's cpu::split_at, whose header is OpenMP's).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim)
      s.outer *= shape[static_cast<size_t>(d)];
    else if (d == dim)
      s.n = shape[static_cast<size_t>(d)];
    else
      s.inner *= shape[static_cast<size_t>(d)];
  }
  return s;
}

// One thread per column (o, i) of g: adds g[o, j, i] at out[o, idx[o, j, i], i] for j in order, as
// the CPU does; a column's elements are only ever written by its thread. An index outside
// [0, n_out) adds nothing and sets *bad. g and idx contiguous, of the same shape.
template <typename T>
__global__ void index_backward_kernel(T* out, const T* g, const int64_t* idx, int64_t outer,
                                      int64_t inner, int64_t n_g, int64_t n_out, int64_t* bad) {
  HAP_GRID_STRIDE_LOOP(col, outer * inner) {
    const int64_t o = col / inner, i = col % inner;
    for (int64_t j = 0; j < n_g; ++j) {
      const int64_t src = (o * n_g + j) * inner + i, r = idx[src];
      if (r < 0 || r >= n_out) {
        *bad = 1;
        continue;
      }
      out[(o * n_out + r) * inner + i] += g[src];
    }
  }
}

std::vector<Tensor> index_backward(const KernelContext& c) {
  const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  out.zero_();
  const Tensor g = dense(c.inputs[0]), idx = dense(c.inputs[1]);
  if (g.numel() == 0) return {out};
  // Both shapes split at a.dim as given, as the CPU kernel splits them.
  const DimSplit so = split_at(a.shape, a.dim), sg = split_at(g.shape(), a.dim);
  HAP_ASSERT(sg.outer == so.outer && sg.inner == so.inner && idx.numel() == g.numel(),
             "index_backward: gradient ", g.str(), " and indices ", idx.str(),
             " do not fit the shape ", shape_str(a.shape), " along dim ", a.dim);
  Tensor bad = Tensor::zeros({1}, TensorOptions{}.with_dtype(DType::I64).with_device(g.device()));
  on_float(out, "index_backward", [&](auto tag) {
    using T = decltype(tag);
    index_backward_kernel<T><<<blocks_for(sg.outer * sg.inner), kThreads>>>(
        ptr<T>(out), ptr<T>(g), ptr<int64_t>(idx), sg.outer, sg.inner, sg.n, so.n,
        ptr<int64_t>(bad));
  });
  int64_t h = 0;
  HAP_CUDA_CHECK(cudaMemcpy(&h, bad.raw_data(), sizeof h, cudaMemcpyDeviceToHost));
  HAP_ASSERT(h == 0, "index out of range in index_backward");
  return {out};
}

}  // namespace

void register_loss(OpTable& t) {
  t[static_cast<size_t>(OpKind::CrossEntropy)].cuda = cross_entropy;
  t[static_cast<size_t>(OpKind::CrossEntropyBackward)].cuda = cross_entropy_backward;
  t[static_cast<size_t>(OpKind::TargetLogit)].cuda = target_logit;
  t[static_cast<size_t>(OpKind::TargetLogitBackward)].cuda = target_logit_backward;
  t[static_cast<size_t>(OpKind::CountTargets)].cuda = count_targets;
  t[static_cast<size_t>(OpKind::LogSumExp)].cuda = logsumexp;
  t[static_cast<size_t>(OpKind::Max)].cuda = max_values;
  t[static_cast<size_t>(OpKind::Argmax)].cuda = argmax_indices;
  t[static_cast<size_t>(OpKind::TopK)].cuda = topk;
  t[static_cast<size_t>(OpKind::IndexBackward)].cuda = index_backward;
}

}  // namespace hap::ops::cuda
