// CUDA kernels of scaled dot-product attention and its backward, the own-kernel path: the scores
// of each (batch, head) pair are materialised ([T, T]) by cuBLAS batched GEMMs, a kernel takes
// each row's masked softmax (causal mask, key padding mask, Philox dropout drawn at the logical
// index of the CPU's mask, so a GPU drops exactly the CPU's elements), and GEMMs apply it. The
// backward recomputes P from the saved row log-sum-exp, as the CPU kernel (ops/defs/attention.cc)
// does, with the same formulas: dV = Pd^T dO, dS = P (dPd m - rowsum(dO O) + dlse),
// dQ = scale dS K, dK = scale dS^T Q. Memory: the (batch, head) pairs run in chunks whose score
// buffers ([n, T, T], one in the forward, two in the backward) stay within a scratch budget:
// 256 MiB per buffer, or HAP_ATTENTION_SCRATCH_BYTES (at least one pair per chunk). GPT-2 at
// T = 1024 and batch 8 would otherwise hold 2 x 384 MiB in the backward.
//
// bf16 q, k and v with head sizes up to 128 take the flash kernels instead
// (ops/cuda/flash_attention.cuh: tiles on the tensor cores, no [T, T] buffer); other bf16 calls
// go through the f32 route (ops/dispatch.cc), as does every call with HAP_FLASH_ATTENTION=0.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/flash_attention.cuh"
#include "ops/cuda/kernels.h"
#include "ops/cuda/rows.cuh"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

std::atomic<int64_t> g_flash_calls{0};

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
// A chunk's rows: s holds rows row0 .. row0 + rows - 1 of [B H T] (lse is indexed whole).
template <typename T>
__global__ void softmax_rows_kernel(T* s, T* lse, RowInfo r, int64_t rows, int64_t row0) {
  __shared__ T scratch[kThreads];
  __shared__ int kept_scratch[kThreads];
  for (int64_t local = blockIdx.x; local < rows; local += gridDim.x) {
    const int64_t row = row0 + local;
    const int64_t i = row % r.t, bh = row / r.t, h = bh % r.heads, b = bh / r.heads;
    T* x = s + local * r.t;
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
// becomes dS, as ops/defs/attention.cc computes them. A chunk's rows: p and dp hold rows row0 ..
// row0 + rows - 1 (lse, glse, go and o are indexed whole).
template <typename T>
__global__ void backward_rows_kernel(T* p, T* dp, const T* lse, const T* glse, const T* go,
                                     const T* o, int64_t dv, RowInfo r, int64_t rows,
                                     int64_t row0) {
  __shared__ T scratch[kThreads];
  for (int64_t local = blockIdx.x; local < rows; local += gridDim.x) {
    const int64_t row = row0 + local;
    const int64_t i = row % r.t, bh = row / r.t, h = bh % r.heads, b = bh / r.heads;
    T* pr = p + local * r.t;
    T* dpr = dp + local * r.t;
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

// (batch, head) pairs per chunk: as many [T, T] score matrices as the scratch budget holds.
int64_t pairs_per_chunk(int64_t bh, int64_t t, const Tensor& like) {
  double budget = 256.0 * (1 << 20);
  if (const char* e = std::getenv("HAP_ATTENTION_SCRATCH_BYTES")) {
    char* end = nullptr;
    const double v = std::strtod(e, &end);
    HAP_CHECK(end != e && *end == '\0' && v > 0, "HAP_ATTENTION_SCRATCH_BYTES: expected a ",
              "positive number of bytes, got '", e, "'");
    budget = v;
  }
  const double one = static_cast<double>(t) * static_cast<double>(t) *
                     static_cast<double>(dtype_size(like.dtype()));
  const double fit = std::floor(budget / one);
  return fit >= static_cast<double>(bh) ? bh : std::max<int64_t>(1, static_cast<int64_t>(fit));
}

// Pairs c0 .. c0 + n - 1 of a dense [B H, rows, cols] tensor.
Tensor pairs(const Tensor& x, int64_t c0, int64_t n, int64_t rows, int64_t cols) {
  return x.as_strided({n, rows, cols}, {rows * cols, cols, 1}, x.offset() + c0 * rows * cols);
}

// The backward's operands, dense: q, k, v, o, lse, dO (zeros where undefined), dlse and the key
// mask (undefined where not given).
struct BackwardInputs {
  Tensor q, k, v, o, lse, go, glse, keys;
};
BackwardInputs backward_inputs(const KernelContext& c) {
  BackwardInputs in;
  in.q = dense(c.inputs[0]);
  in.k = dense(c.inputs[1]);
  in.v = dense(c.inputs[2]);
  in.o = dense(c.inputs[3]);
  in.lse = dense(c.inputs[4]);
  in.go = c.inputs[5].defined()
              ? dense(c.inputs[5])
              : Tensor::zeros(in.o.shape(),
                              TensorOptions{}.with_dtype(in.o.dtype()).with_device(in.o.device()));
  in.glse = c.inputs[6].defined() ? dense(c.inputs[6]) : Tensor();
  in.keys = c.inputs.size() > 7 && c.inputs[7].defined() ? dense(c.inputs[7]) : Tensor();
  return in;
}

// The flash kernels' operands: pointers, sizes, masks and the dropout draw of row_info.
flash::Params flash_params(const AttentionAttrs& a, const Shape& qs, int64_t dv,
                           const Tensor& keys) {
  const RowInfo r = row_info(a, qs, keys);
  flash::Params p;
  p.bh = qs[0] * qs[1];
  p.t = qs[2];
  p.heads = qs[1];
  p.dh = static_cast<int>(qs[3]);
  p.dhv = static_cast<int>(dv);
  p.scale = static_cast<float>(scale_of(a, qs[3]));
  p.causal = r.causal;
  p.keys = r.keys;
  p.dropout = r.dropout;
  p.seed = r.seed;
  p.stream = r.stream;
  p.keep = r.keep;
  p.inv_keep = static_cast<float>(r.inv_keep);
  for (int i = 0; i < 4; ++i) {
    p.offset[i] = r.offset[i];
    p.stride[i] = r.stride[i];
  }
  return p;
}

const flash::bf16* bf16_ptr(const Tensor& t) {
  HAP_ASSERT(t.dtype() == DType::BF16, "flash attention reads ", t.str(), " as bf16");
  return static_cast<const flash::bf16*>(t.raw_data());
}
flash::bf16* bf16_out(const Tensor& t) { return const_cast<flash::bf16*>(bf16_ptr(t)); }

std::vector<Tensor> flash_attention(const KernelContext& c) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  Tensor out = c.alloc(0), lse = c.alloc(1);
  const Shape& qs = c.inputs[0].shape();
  if (qs[0] * qs[1] == 0 || qs[2] == 0) return {out, lse};
  const Tensor q = dense(c.inputs[0]), k = dense(c.inputs[1]), v = dense(c.inputs[2]);
  const Tensor keys = c.inputs.size() > 3 && c.inputs[3].defined() ? dense(c.inputs[3]) : Tensor();
  flash::Params p = flash_params(a, qs, v.shape()[3], keys);
  p.q = bf16_ptr(q);
  p.k = bf16_ptr(k);
  p.v = bf16_ptr(v);
  p.o = bf16_out(out);
  p.lse = ptr<float>(lse);
  hap::cuda::set_device(out.device().index);
  flash::forward(p);
  check_launch("attention (flash kernels)");
  ++g_flash_calls;
  return {out, lse};
}

std::vector<Tensor> flash_attention_backward(const KernelContext& c) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  std::vector<Tensor> outs{c.alloc(0), c.alloc(1), c.alloc(2)};
  const Shape& qs = c.inputs[0].shape();
  if (qs[0] * qs[1] == 0 || qs[2] == 0) return outs;
  const BackwardInputs in = backward_inputs(c);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &o = in.o, &lse = in.lse, &go = in.go,
               &glse = in.glse, &keys = in.keys;
  const Tensor delta = Tensor::empty(
      {qs[0] * qs[1] * qs[2]}, TensorOptions{}.with_dtype(DType::F32).with_device(q.device()));
  flash::Params p = flash_params(a, qs, v.shape()[3], keys);
  p.q = bf16_ptr(q);
  p.k = bf16_ptr(k);
  p.v = bf16_ptr(v);
  p.lse = const_cast<float*>(ptr<float>(lse));
  p.go = bf16_ptr(go);
  p.delta = ptr<float>(delta);
  p.gq = bf16_out(outs[0]);
  p.gk = bf16_out(outs[1]);
  p.gv = bf16_out(outs[2]);
  hap::cuda::set_device(q.device().index);
  flash::backward(p, bf16_ptr(o), glse.defined() ? ptr<float>(glse) : nullptr, ptr<float>(delta));
  check_launch("attention_backward (flash kernels)");
  ++g_flash_calls;
  return outs;
}

// Whether the flash kernels take these bf16 inputs (else the f32 route runs the kernels below):
// q, k, v (and the backward's o and dO) bf16, head sizes up to 128, at most 65535 tiles of
// queries, a GPU of compute capability 8.0 or later, and its shared memory per block enough for
// the tiles.
bool flash_accepts(const std::vector<Tensor>& in, const Attrs&) {
  // Read at every call, so that a process may compare both paths (bench/kernels).
  const char* off = std::getenv("HAP_FLASH_ATTENTION");
  if ((off != nullptr && std::string(off) == "0") || in.size() < 3) return false;
  for (size_t i = 0; i < 3; ++i)
    if (!in[i].defined() || in[i].dtype() != DType::BF16) return false;
  if (in.size() == 8)  // the backward: o and dO (when given) bf16 too
    for (size_t i : {size_t{3}, size_t{5}})
      if (in[i].defined() && in[i].dtype() != DType::BF16) return false;
  const Shape& qs = in[0].shape();
  const Shape& vs = in[2].shape();
  if (qs.size() != 4 || vs.size() != 4) return false;
  const int tile = flash::tile_head(static_cast<int>(std::min<int64_t>(qs[3], 1 << 20)),
                                    static_cast<int>(std::min<int64_t>(vs[3], 1 << 20)));
  if (tile == 0 || qs[2] > flash::kMaxTiles * flash::kTile) return false;
  static std::atomic<int> optin[64] = {};  // per device, 0 until asked
  const int dev = in[0].device().index;
  HAP_CHECK(dev >= 0 && dev < 64, "attention on cuda: device index ", dev, " out of range");
  if (optin[dev].load() == 0) {  // bf16 WMMA needs compute capability 8.0 or later
    int bytes = 0, major = 0;
    HAP_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    HAP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    optin[dev].store(bytes > 0 && major >= 8 ? bytes : -1);
  }
  return flash::shared_bytes(tile) <= static_cast<size_t>(std::max(optin[dev].load(), 0));
}

std::vector<Tensor> attention(const KernelContext& c) {
  // bf16 reaches this kernel only where flash_accepts took it (ops/dispatch.cc).
  if (c.inputs[0].dtype() == DType::BF16) return flash_attention(c);
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  Tensor out = c.alloc(0), lse = c.alloc(1);
  const Shape& qs = c.inputs[0].shape();
  const int64_t bh = qs[0] * qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  if (bh == 0 || t == 0) return {out, lse};
  const Tensor q = dense(c.inputs[0]), k = dense(c.inputs[1]), v = dense(c.inputs[2]);
  const Tensor keys = c.inputs.size() > 3 && c.inputs[3].defined() ? dense(c.inputs[3]) : Tensor();
  const RowInfo r = row_info(a, qs, keys);
  const int64_t chunk = pairs_per_chunk(bh, t, out);
  Tensor scratch = scratch_like(out, chunk, t);
  for (int64_t c0 = 0; c0 < bh; c0 += chunk) {
    const int64_t n = std::min(chunk, bh - c0);
    const Tensor s = pairs(scratch, 0, n, t, t);
    gemm(s, pairs(q, c0, n, t, d), false, pairs(k, c0, n, t, d), true, n, t, t, d, "attention",
         scale_of(a, d));
    on_float(out, "attention", [&](auto tag) {
      using T = decltype(tag);
      softmax_rows_kernel<<<row_blocks(n * t), kThreads>>>(ptr<T>(s), ptr<T>(lse), r, n * t,
                                                           c0 * t);
    });
    gemm(pairs(out, c0, n, t, dv), s, false, pairs(v, c0, n, t, dv), false, n, t, dv, t,
         "attention");
  }
  return {out, lse};
}

std::vector<Tensor> attention_backward(const KernelContext& c) {
  if (c.inputs[0].dtype() == DType::BF16) return flash_attention_backward(c);
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  std::vector<Tensor> outs{c.alloc(0), c.alloc(1), c.alloc(2)};
  const Shape& qs = c.inputs[0].shape();
  const int64_t bh = qs[0] * qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  if (bh == 0 || t == 0) return outs;
  const BackwardInputs in = backward_inputs(c);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &o = in.o, &lse = in.lse, &go = in.go,
               &glse = in.glse, &keys = in.keys;
  const RowInfo r = row_info(a, qs, keys);
  const double scale = scale_of(a, d);
  const int64_t chunk = pairs_per_chunk(bh, t, q);
  Tensor p_scratch = scratch_like(q, chunk, t), dp_scratch = scratch_like(q, chunk, t);
  for (int64_t c0 = 0; c0 < bh; c0 += chunk) {
    const int64_t n = std::min(chunk, bh - c0);
    const Tensor p = pairs(p_scratch, 0, n, t, t), dp = pairs(dp_scratch, 0, n, t, t);
    const Tensor qc = pairs(q, c0, n, t, d), kc = pairs(k, c0, n, t, d);
    const Tensor vc = pairs(v, c0, n, t, dv), goc = pairs(go, c0, n, t, dv);
    gemm(p, qc, false, kc, true, n, t, t, d, "attention_backward", scale);
    gemm(dp, goc, false, vc, true, n, t, t, dv, "attention_backward");
    on_float(q, "attention_backward", [&](auto tag) {
      using T = decltype(tag);
      backward_rows_kernel<<<row_blocks(n * t), kThreads>>>(
          ptr<T>(p), ptr<T>(dp), ptr<T>(lse), glse.defined() ? ptr<T>(glse) : nullptr, ptr<T>(go),
          ptr<T>(o), dv, r, n * t, c0 * t);
    });
    gemm(pairs(outs[2], c0, n, t, dv), p, true, goc, false, n, t, dv, t, "attention_backward");
    gemm(pairs(outs[0], c0, n, t, d), dp, false, kc, false, n, t, d, t, "attention_backward",
         scale);
    gemm(pairs(outs[1], c0, n, t, d), dp, true, qc, false, n, t, d, t, "attention_backward", scale);
  }
  return outs;
}

}  // namespace

int64_t flash_attention_calls() { return g_flash_calls.load(); }

void register_attention(OpTable& t) {
  for (OpKind k : {OpKind::Attention, OpKind::AttentionBackward}) {
    OpDef& d = t[static_cast<size_t>(k)];
    d.cuda = k == OpKind::Attention ? attention : attention_backward;
    d.cuda_bf16 = true;  // through the flash kernels, where flash_accepts
    d.cuda_bf16_accepts = flash_accepts;
  }
}

}  // namespace hap::ops::cuda
