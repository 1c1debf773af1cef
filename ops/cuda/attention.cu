// CUDA kernels of scaled dot-product attention and its backward, the own-kernel path: the scores
// of every (batch, head) are materialised ([B H, T, T]) by cuBLAS batched GEMMs, a kernel takes
// each row's masked softmax (causal mask, key padding mask, Philox dropout drawn at the logical
// index of the CPU's mask, so a GPU drops exactly the CPU's elements), and GEMMs apply it. The
// backward recomputes P from the saved row log-sum-exp, as the CPU kernel (ops/defs/attention.cc)
// does, with the same formulas: dV = Pd^T dO, dS = P (dPd m - rowsum(dO O) + dlse),
// dQ = scale dS K, dK = scale dS^T Q. Memory: two [B H, T, T] buffers in the backward.
#include <cmath>
#include <cstdint>

#include "core/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/rows.cuh"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// Where rows are, what they may attend to, and the dropout draw of element (b, h, i, j): its
// index in the logical probabilities [B, H, T, T] (a shard's slice placed by offset).
struct RowInfo {
  int64_t heads = 1, t = 0;
  bool causal = true;
  const uint8_t* keys = nullptr;  // [B, T] or null
  bool dropout = false;
  uint64_t seed = 0, stream = 0;
  double keep = 1;
  double inv_keep = 1;
  int64_t offset[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 1};
};

RowInfo row_info(const AttentionAttrs& a, const Shape& q, const Tensor& keys) {
  RowInfo r;
  r.heads = q[1];
  r.t = q[2];
  r.causal = a.causal;
  r.keys = keys.defined() ? static_cast<const uint8_t*>(keys.raw_data()) : nullptr;
  const RandomAttrs& d = a.dropout;
  r.dropout = d.p > 0;
  r.seed = d.seed;
  r.stream = d.stream;
  r.keep = 1.0 - d.p;
  r.inv_keep = 1.0 / r.keep;
  Shape logical = {q[0], q[1], q[2], q[2]};
  if (!d.slice.logical_shape.empty() || !d.slice.offset.empty()) {
    HAP_CHECK(d.slice.logical_shape.size() == 4 && d.slice.offset.size() == 4,
              "attention: dropout slice must be 4-d (of the probabilities [B, H, T, T]), got ",
              "logical shape ", shape_str(d.slice.logical_shape), " and offset ",
              shape_str(d.slice.offset));
    const Shape local = logical;
    logical = d.slice.logical_shape;
    for (size_t k = 0; k < 4; ++k) {
      HAP_CHECK(d.slice.offset[k] >= 0 && d.slice.offset[k] + local[k] <= logical[k],
                "attention: probabilities ", shape_str(local), " at offset ",
                shape_str(d.slice.offset), " do not fit the logical shape ", shape_str(logical));
      r.offset[k] = d.slice.offset[k];
    }
  }
  const Strides ls = contiguous_strides(logical);
  for (size_t k = 0; k < 4; ++k) r.stride[k] = ls[k];
  return r;
}

// The dropout factor of element j of row (b, h, i): 1 / (1 - p) when kept, else 0 (as the CPU).
template <typename T>
__device__ __forceinline__ T drop(const RowInfo& r, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t index =
      static_cast<uint64_t>((b + r.offset[0]) * r.stride[0] + (h + r.offset[1]) * r.stride[1] +
                            (i + r.offset[2]) * r.stride[2] + (j + r.offset[3]) * r.stride[3]);
  return static_cast<double>(philox_uniform(r.seed, r.stream, index)) < r.keep
             ? static_cast<T>(r.inv_keep)
             : T(0);
}

__device__ __forceinline__ bool key_kept(const RowInfo& r, int64_t b, int64_t j) {
  return r.keys == nullptr || r.keys[b * r.t + j] != 0;
}

// Row (b, h, i) of the scaled scores s becomes the dropped probabilities Pd; lse gets the row's
// log-sum-exp (-inf, and a zero row, when the key mask leaves no key to attend to). As the CPU:
// the maximum skips NaN scores, and a NaN score makes its row NaN rather than being dropped.
template <typename T>
__global__ void softmax_rows_kernel(T* s, T* lse, RowInfo r, int64_t rows) {
  __shared__ T scratch[kThreads];
  __shared__ int kept_scratch[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % r.t, bh = row / r.t, h = bh % r.heads, b = bh / r.heads;
    T* x = s + row * r.t;
    const int64_t n = r.causal ? i + 1 : r.t;
    T mx = neg_inf(T{});
    int kept = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      if (!key_kept(r, b, j)) continue;
      mx = Max{}(mx, x[j]);
      kept = 1;
    }
    mx = block_reduce(mx, scratch, Max{});
    kept = block_reduce(kept, kept_scratch, Plus{});
    if (kept == 0) {  // every key masked: zeros, as the CPU
      for (int64_t j = threadIdx.x; j < r.t; j += blockDim.x) x[j] = T(0);
      if (threadIdx.x == 0) lse[row] = neg_inf(T{});
      continue;
    }
    T sum = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const T e = key_kept(r, b, j) && x[j] != neg_inf(T{}) ? exp(x[j] - mx) : T(0);
      x[j] = e;
      sum += e;
    }
    sum = block_reduce(sum, scratch, Plus{});
    if (threadIdx.x == 0) lse[row] = mx + log(sum);
    const T inv = T(1) / sum;
    for (int64_t j = threadIdx.x; j < r.t; j += blockDim.x) {
      if (j >= n)
        x[j] = T(0);
      else
        x[j] = r.dropout ? x[j] * (inv * drop<T>(r, b, h, i, j)) : x[j] * inv;
    }
  }
}

// Row (b, h, i) of the backward: p holds the scaled scores, dp = dO V^T. p becomes Pd, dp
// becomes dS, as ops/defs/attention.cc computes them.
template <typename T>
__global__ void backward_rows_kernel(T* p, T* dp, const T* lse, const T* glse, const T* go,
                                     const T* o, int64_t dv, RowInfo r, int64_t rows) {
  __shared__ T scratch[kThreads];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % r.t, bh = row / r.t, h = bh % r.heads, b = bh / r.heads;
    T* pr = p + row * r.t;
    T* dpr = dp + row * r.t;
    T dot = 0;
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x)
      dot += go[row * dv + j] * o[row * dv + j];
    dot = block_reduce(dot, scratch, Plus{});
    const T li = lse[row];
    const T shift = dot - (glse ? glse[row] : T(0));
    const int64_t n = r.causal ? i + 1 : r.t;
    const bool empty = li == neg_inf(T{});
    for (int64_t j = threadIdx.x; j < r.t; j += blockDim.x) {
      if (empty || j >= n) {
        pr[j] = T(0);
        dpr[j] = T(0);
        continue;
      }
      const T pj = key_kept(r, b, j) && pr[j] != neg_inf(T{}) ? exp(pr[j] - li) : T(0);
      if (r.dropout) {
        const T m = drop<T>(r, b, h, i, j);
        pr[j] = pj * m;
        dpr[j] = pj * (dpr[j] * m - shift);
      } else {
        pr[j] = pj;
        dpr[j] = pj * (dpr[j] - shift);
      }
    }
  }
}

double scale_of(const AttentionAttrs& a, int64_t d) {
  return a.scale != 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

Tensor scratch_like(const Tensor& like, int64_t bh, int64_t t) {
  return Tensor::empty({bh, t, t},
                       TensorOptions{}.with_dtype(like.dtype()).with_device(like.device()));
}

std::vector<Tensor> attention(const KernelContext& c) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  Tensor out = c.alloc(0), lse = c.alloc(1);
  const Shape& qs = c.inputs[0].shape();
  const int64_t bh = qs[0] * qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  if (bh == 0 || t == 0) return {out, lse};
  const Tensor q = dense(c.inputs[0]), k = dense(c.inputs[1]), v = dense(c.inputs[2]);
  const Tensor keys = c.inputs.size() > 3 && c.inputs[3].defined() ? dense(c.inputs[3]) : Tensor();
  const RowInfo r = row_info(a, qs, keys);
  Tensor s = scratch_like(out, bh, t);
  gemm(s, q, false, k, true, bh, t, t, d, "attention", scale_of(a, d));
  on_float(out, "attention", [&](auto tag) {
    using T = decltype(tag);
    softmax_rows_kernel<<<row_blocks(bh * t), kThreads>>>(ptr<T>(s), ptr<T>(lse), r, bh * t);
  });
  gemm(out, s, false, v, false, bh, t, dv, t, "attention");
  return {out, lse};
}

std::vector<Tensor> attention_backward(const KernelContext& c) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  std::vector<Tensor> outs{c.alloc(0), c.alloc(1), c.alloc(2)};
  const Shape& qs = c.inputs[0].shape();
  const int64_t bh = qs[0] * qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  if (bh == 0 || t == 0) return outs;
  const Tensor q = dense(c.inputs[0]), k = dense(c.inputs[1]), v = dense(c.inputs[2]);
  const Tensor o = dense(c.inputs[3]), lse = dense(c.inputs[4]);
  const Tensor go =
      c.inputs[5].defined()
          ? dense(c.inputs[5])
          : Tensor::zeros(o.shape(), TensorOptions{}.with_dtype(o.dtype()).with_device(o.device()));
  const Tensor glse = c.inputs[6].defined() ? dense(c.inputs[6]) : Tensor();
  const Tensor keys = c.inputs.size() > 7 && c.inputs[7].defined() ? dense(c.inputs[7]) : Tensor();
  const RowInfo r = row_info(a, qs, keys);
  const double scale = scale_of(a, d);
  Tensor p = scratch_like(q, bh, t), dp = scratch_like(q, bh, t);
  gemm(p, q, false, k, true, bh, t, t, d, "attention_backward", scale);
  gemm(dp, go, false, v, true, bh, t, t, dv, "attention_backward");
  on_float(q, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    backward_rows_kernel<<<row_blocks(bh * t), kThreads>>>(ptr<T>(p), ptr<T>(dp), ptr<T>(lse),
                                                           glse.defined() ? ptr<T>(glse) : nullptr,
                                                           ptr<T>(go), ptr<T>(o), dv, r, bh * t);
  });
  gemm(outs[2], p, true, go, false, bh, t, dv, t, "attention_backward");
  gemm(outs[0], dp, false, k, false, bh, t, d, t, "attention_backward", scale);
  gemm(outs[1], dp, true, q, false, bh, t, d, t, "attention_backward", scale);
  return outs;
}

}  // namespace

void register_attention(OpTable& t) {
  t[static_cast<size_t>(OpKind::Attention)].cuda = attention;
  t[static_cast<size_t>(OpKind::AttentionBackward)].cuda = attention_backward;
}

}  // namespace hap::ops::cuda
