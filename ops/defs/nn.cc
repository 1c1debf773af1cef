// Normalisation and lookup ops: softmax and log_softmax over a dim, layer_norm and rms_norm over
// the last dim, embedding; and the fused kernels their backward rules are written with. Every
// kernel is one pass per row (the row stays in cache between its loops), rows in parallel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/philox.h"
#include "core/rng.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/multiversion.h"
#include "ops/cpu/vec_math.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

using cpu::exp_fast;
using cpu::max_skipping_nan;

bool parallel_for(int64_t work) { return work > cpu::kParallelGrain; }

// ---------------- softmax / log_softmax ----------------

template <bool kLog>
constexpr const char* softmax_name() {
  return kLog ? "log_softmax" : "softmax";
}

int64_t softmax_dim(const Shape& s, const Attrs& a, const char* op) {
  HAP_CHECK(!s.empty(), op, ": input must have at least 1 dim, got a scalar");
  std::string what = std::string(op) + " dim";
  return wrap_dim(attr<DimAttrs>(a).dim, static_cast<int64_t>(s.size()), what.c_str());
}

template <bool kLog>
Metas infer_softmax(const Metas& in, const Attrs& a) {
  check_floating(softmax_name<kLog>(), in, 0);
  softmax_dim(in[0].shape, a, softmax_name<kLog>());
  return {in[0]};
}

// Backward kernels: inputs (grad of the output, output), same shapes.
template <bool kLog>
Metas infer_softmax_backward(const Metas& in, const Attrs& a) {
  const char* op = kLog ? "log_softmax_backward" : "softmax_backward";
  check_floating(op, in, 0);
  check_same_dtype(op, in, 0, 1);
  HAP_CHECK(in[0].shape == in[1].shape, op, ": gradient ", shape_str(in[0].shape),
            " does not match output ", shape_str(in[1].shape));
  softmax_dim(in[1].shape, a, op);
  return {in[1]};
}

// Splitting any dim but the normalised one keeps every row whole on one rank.
std::vector<ShardSignature> shard_softmax(const Metas& in, const Metas& out, const Attrs& a) {
  int64_t dim = softmax_dim(out[0].shape, a, "softmax");
  std::vector<ShardSignature> sigs;
  for (int64_t d = 0; d < static_cast<int64_t>(out[0].shape.size()); ++d)
    if (d != dim && out[0].shape[d] > 1)
      sigs.push_back({std::vector<Prop>(in.size(), Prop::sharded(d)), {Prop::sharded(d)}});
  return sigs;
}

template <typename T, bool kLog>
inline void softmax_row(const T* x, T* y, int64_t n) {
  const T mx = max_skipping_nan(x, n);
  T sum = 0;
  if constexpr (kLog) {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) sum += exp_fast(x[j] - mx);
    T lse = mx + std::log(sum);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] - lse;
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      T e = exp_fast(x[j] - mx);
      y[j] = e;
      sum += e;
    }
    T inv = T(1) / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

// softmax: gx = y (g - sum(g y)); log_softmax: gx = g - exp(y) sum(g).
template <typename T, bool kLog>
inline void softmax_backward_row(const T* g, const T* y, T* gx, int64_t n) {
  T dot = 0;
  if constexpr (kLog) {
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) dot += g[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) gx[j] = g[j] - exp_fast(y[j]) * dot;
  } else {
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < n; ++j) dot += g[j] * y[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) gx[j] = y[j] * (g[j] - dot);
  }
}

// A view of `t` with `dim` moved last (no copy).
Tensor dim_last(const Tensor& t, int64_t dim) {
  Shape s;
  Strides st;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != dim) {
      s.push_back(t.shape()[d]);
      st.push_back(t.strides()[d]);
    }
  s.push_back(t.shape()[dim]);
  st.push_back(t.strides()[dim]);
  return t.as_strided(s, st, t.offset());
}

// Runs row(a_row, b_row, out_row, n) over the rows along `dim` of a contiguous `out`. The last
// dim is the fast path (rows in place); another dim runs on copies with that dim moved last.
template <typename T, typename F>
HAP_MULTIVERSION void map_rows_clones(const Tensor& out, const Tensor& a, const Tensor& b,
                                      int64_t dim, F row) {
  bool last = dim == out.dim() - 1;
  Tensor ac = (last ? a : dim_last(a, dim)).contiguous();
  Tensor bc = !b.defined() ? Tensor() : (last ? b : dim_last(b, dim)).contiguous();
  Tensor oc = last ? out : Tensor::empty(ac.shape(), TensorOptions{}.with_dtype(out.dtype()));
  int64_t n = out.shape()[dim];
  int64_t rows = n == 0 ? 0 : out.numel() / n;
  const T* pa = ac.data<T>();
  const T* pb = bc.defined() ? bc.data<T>() : nullptr;
  T* po = oc.data<T>();
#pragma omp parallel for if (parallel_for(out.numel()))
  for (int64_t r = 0; r < rows; ++r) row(pa + r * n, pb ? pb + r * n : nullptr, po + r * n, n);
  if (!last) strided_copy(dim_last(out, dim), oc);
}

template <typename T, typename F>
void map_rows(const Tensor& out, const Tensor& a, const Tensor& b, int64_t dim, F row) {
  ::hap::cpu::clone_call (&map_rows_clones<T, F>)(out, a, b, dim, row);
}

template <bool kLog>
std::vector<Tensor> softmax_cpu(const KernelContext& c) {
  Tensor out = c.alloc(0);
  int64_t dim = softmax_dim(out.shape(), c.attrs, softmax_name<kLog>());
  dispatch_float(out.dtype(), softmax_name<kLog>(), [&](auto tag) {
    using T = decltype(tag);
    map_rows<T>(out, c.inputs[0], Tensor(), dim,
                [](const T* x, const T*, T* y, int64_t n) { softmax_row<T, kLog>(x, y, n); });
  });
  return {out};
}

template <bool kLog>
std::vector<Tensor> softmax_backward_cpu(const KernelContext& c) {
  Tensor out = c.alloc(0);
  int64_t dim = softmax_dim(out.shape(), c.attrs, softmax_name<kLog>());
  dispatch_float(out.dtype(), softmax_name<kLog>(), [&](auto tag) {
    using T = decltype(tag);
    map_rows<T>(out, c.inputs[0], c.inputs[1], dim, [](const T* g, const T* y, T* gx, int64_t n) {
      softmax_backward_row<T, kLog>(g, y, gx, n);
    });
  });
  return {out};
}

template <bool kLog>
void def_softmax(OpTable& t) {
  OpDef& d = def_of(t, kLog ? OpKind::LogSoftmax : OpKind::Softmax);
  d.autocast = Autocast::Float;
  d.name = softmax_name<kLog>();
  d.num_inputs = 1;
  d.infer = infer_softmax<kLog>;
  d.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 5); };
  d.shard = shard_softmax;
  d.cpu = softmax_cpu<kLog>;
  d.saves_inputs = false;
  d.saves_outputs = true;
  d.backward = [](const BackwardContext& c) {
    OpKind k = kLog ? OpKind::LogSoftmaxBackward : OpKind::SoftmaxBackward;
    return std::vector<Tensor>{call1(k, {c.grad_outputs[0], c.outputs[0]}, c.attrs)};
  };

  OpDef& b = def_of(t, kLog ? OpKind::LogSoftmaxBackward : OpKind::SoftmaxBackward);
  b.name = kLog ? "log_softmax_backward" : "softmax_backward";
  b.num_inputs = 2;
  b.infer = infer_softmax_backward<kLog>;
  b.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 4); };
  b.shard = shard_softmax;
  b.cpu = softmax_backward_cpu<kLog>;
}

// ---------------- layer_norm / rms_norm (over the last dim) ----------------
// layer_norm: y = (x - mean) rstd w + b; rms_norm: y = x rstd w, with rstd = 1/sqrt(var + eps)
// (layer_norm, biased variance) or 1/sqrt(mean(x^2) + eps) (rms_norm). Statistics accumulate in
// double; the backward kernels recompute them from x rather than keeping them from the forward.

const char* norm_name(bool rms) { return rms ? "rms_norm" : "layer_norm"; }

// Checks x [..., C] (input x_at) and the optional parameters after it ([C] each).
void check_norm_inputs(const Metas& in, size_t x_at, const char* op) {
  const TensorMeta& x = in[x_at];
  check_floating(op, in, x_at);
  HAP_CHECK(!x.shape.empty() && x.shape.back() > 0, op,
            ": input must have at least 1 dim and a non-empty last dim, got ", shape_str(x.shape));
  int64_t c = x.shape.back();
  for (size_t i = x_at + 1; i < in.size(); ++i) {
    if (!in[i].defined) continue;
    const char* what = i == x_at + 1 ? "weight" : "bias";
    HAP_CHECK(in[i].shape == Shape{c}, op, ": ", what, " ", shape_str(in[i].shape),
              " does not match input ", shape_str(x.shape), " (expected [", c, "])");
    check_same_dtype(op, in, x_at, i);
  }
}

template <bool kRms>
Metas infer_norm(const Metas& in, const Attrs&) {
  check_norm_inputs(in, 0, norm_name(kRms));
  return {in[0]};
}

// Backward kernels: inputs (grad of y, x, weight or undefined); outputs dx, dweight[, dbias].
template <bool kRms>
Metas infer_norm_backward(const Metas& in, const Attrs&) {
  const char* op = kRms ? "rms_norm_backward" : "layer_norm_backward";
  check_norm_inputs(in, 1, op);
  check_same_dtype(op, in, 0, 1);
  HAP_CHECK(in[0].shape == in[1].shape, op, ": gradient ", shape_str(in[0].shape),
            " does not match input ", shape_str(in[1].shape));
  TensorMeta param{{in[1].shape.back()}, in[1].dtype};
  if (kRms) return {in[1], param};
  return {in[1], param, param};
}

// Data parallel over any dim but the normalised last one; the parameters stay Replicated.
std::vector<ShardSignature> shard_norm(const Metas& in, const Metas&, const Attrs&) {
  std::vector<ShardSignature> sigs;
  int64_t nd = static_cast<int64_t>(in[0].shape.size());
  for (int64_t d = 0; d + 1 < nd; ++d) {
    std::vector<Prop> ins(in.size(), Prop::replicated());
    ins[0] = Prop::sharded(d);
    sigs.push_back({ins, {Prop::sharded(d)}});
  }
  return sigs;
}

// Backward: rows split alike in the gradient and x; the parameter gradients are Partial sums.
std::vector<ShardSignature> shard_norm_backward(const Metas& in, const Metas& out, const Attrs&) {
  std::vector<ShardSignature> sigs;
  int64_t nd = static_cast<int64_t>(in[1].shape.size());
  for (int64_t d = 0; d + 1 < nd; ++d) {
    std::vector<Prop> outs(out.size(), Prop::partial());
    outs[0] = Prop::sharded(d);
    sigs.push_back({{Prop::sharded(d), Prop::sharded(d), Prop::replicated()}, outs});
  }
  return sigs;
}

// Data of a [C] parameter, or of a filled stand-in when it was omitted.
template <typename T>
const T* param_data(const Tensor& p, Tensor& hold, int64_t c, double fill, DType dtype) {
  hold = p.defined() ? p.contiguous() : Tensor::full({c}, fill, TensorOptions{}.with_dtype(dtype));
  return hold.data<T>();
}

// mean (0 for rms_norm) and rstd of one row, in one pass: sums of x and x^2 in double, whose
// 53 bits keep E[x^2] - mean^2 exact enough unless |mean| / std exceeds about 1e6.
template <typename T, bool kRms>
[[gnu::always_inline]] inline void norm_stats(const T* x, int64_t n, double eps, T& mean_out,
                                              T& rstd_out) {
  double s = 0, ss = 0;
  if constexpr (kRms) {
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < n; ++j) ss += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  } else {
#pragma omp simd reduction(+ : s, ss)
    for (int64_t j = 0; j < n; ++j) {
      double v = static_cast<double>(x[j]);
      s += v;
      ss += v * v;
    }
  }
  double inv_n = 1.0 / static_cast<double>(n);
  double mean = s * inv_n;
  double var = std::max(ss * inv_n - mean * mean, 0.0);
  mean_out = static_cast<T>(mean);
  rstd_out = static_cast<T>(1.0 / std::sqrt(var + eps));
}

template <typename T, bool kRms>
HAP_MULTIVERSION void norm_kernel_clones(const KernelContext& c, const Tensor& out) {
  Tensor x = c.inputs[0].contiguous();
  double eps = attr<NormAttrs>(c.attrs).eps;
  int64_t n = x.shape().back(), rows = x.numel() / n;
  Tensor hw, hb;
  const T* w = param_data<T>(c.inputs[1], hw, n, 1.0, x.dtype());
  const T* b = kRms ? nullptr : param_data<T>(c.inputs[2], hb, n, 0.0, x.dtype());
  const T* px = x.data<T>();
  T* py = out.data<T>();
#pragma omp parallel for if (parallel_for(x.numel()))
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * n;
    T* yr = py + r * n;
    T mean, rstd;
    norm_stats<T, kRms>(xr, n, eps, mean, rstd);
    if constexpr (kRms) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = xr[j] * rstd * w[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
    }
  }
}

template <typename T, bool kRms>
void norm_kernel(const KernelContext& c, const Tensor& out) {
  ::hap::cpu::clone_call (&norm_kernel_clones<T, kRms>)(c, out);
}

// Row blocks for the parameter gradients: a fixed partition of the rows (independent of the
// thread count), each block summing into its own slot, slots added in order. Deterministic.
constexpr int64_t kParamGradBlocks = 64;

// dx = rstd (g w - mean(g w) - xhat mean(g w xhat)) (rms_norm: without the mean(g w) term),
// dweight = sum over rows of g xhat, dbias = sum over rows of g.
template <typename T, bool kRms>
HAP_MULTIVERSION void norm_backward_kernel_clones(const KernelContext& c,
                                                  const std::vector<Tensor>& outs) {
  Tensor g = c.inputs[0].contiguous(), x = c.inputs[1].contiguous();
  double eps = attr<NormAttrs>(c.attrs).eps;
  int64_t n = x.shape().back(), rows = x.numel() / n;
  Tensor hw;
  const T* w = param_data<T>(c.inputs[2], hw, n, 1.0, x.dtype());
  const T* pg = g.data<T>();
  const T* px = x.data<T>();
  T* pdx = outs[0].data<T>();
  int64_t nparams = kRms ? 1 : 2;
  int64_t blocks = std::min(rows, kParamGradBlocks);
  std::vector<T> partial(static_cast<size_t>(std::max<int64_t>(blocks, 1) * nparams * n), T(0));
  T inv_n = T(1) / static_cast<T>(n);
#pragma omp parallel for schedule(static) if (parallel_for(x.numel()))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    T* dw = partial.data() + blk * nparams * n;
    T* db = dw + n;
    for (int64_t r = blk * rows / blocks; r < (blk + 1) * rows / blocks; ++r) {
      const T* gr = pg + r * n;
      const T* xr = px + r * n;
      T* dxr = pdx + r * n;
      T mean, rstd;
      norm_stats<T, kRms>(xr, n, eps, mean, rstd);
      T sum_gw = 0, sum_gwx = 0;
#pragma omp simd reduction(+ : sum_gw, sum_gwx)
      for (int64_t j = 0; j < n; ++j) {
        T xh = (xr[j] - mean) * rstd;
        T gw = gr[j] * w[j];
        sum_gw += gw;
        sum_gwx += gw * xh;
        dw[j] += gr[j] * xh;
        if constexpr (!kRms) db[j] += gr[j];
      }
      T a = kRms ? T(0) : sum_gw * inv_n, bx = sum_gwx * inv_n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        T xh = (xr[j] - mean) * rstd;
        dxr[j] = rstd * (gr[j] * w[j] - a - xh * bx);
      }
    }
  }
  // The blocks' sums added in block order, each element's in double: block by block over
  // contiguous rows of the partial sums (vectorised), not element by element across blocks.
  std::vector<double> total(static_cast<size_t>(n));
  for (int64_t p = 0; p < nparams; ++p) {
    std::fill(total.begin(), total.end(), 0.0);
    double* acc = total.data();
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const T* part = partial.data() + (blk * nparams + p) * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(part[j]);
    }
    T* dst = outs[1 + p].data<T>();
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<T>(acc[j]);
  }
}

template <typename T, bool kRms>
void norm_backward_kernel(const KernelContext& c, const std::vector<Tensor>& outs) {
  ::hap::cpu::clone_call (&norm_backward_kernel_clones<T, kRms>)(c, outs);
}

template <bool kRms>
void def_norm(OpTable& t) {
  OpDef& d = def_of(t, kRms ? OpKind::RmsNorm : OpKind::LayerNorm);
  d.autocast = Autocast::Float;
  d.name = norm_name(kRms);
  d.num_inputs = kRms ? 2 : 3;
  d.optional_inputs = kRms ? 0b10u : 0b110u;
  d.infer = infer_norm<kRms>;
  d.flops = [](const Metas&, const Metas& o, const Attrs&) {
    return elementwise_flops(o, kRms ? 5 : 8);
  };
  d.shard = shard_norm;
  d.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), norm_name(kRms),
                   [&](auto tag) { norm_kernel<decltype(tag), kRms>(c, out); });
    return std::vector<Tensor>{out};
  };
  d.backward = [](const BackwardContext& c) {
    OpKind k = kRms ? OpKind::RmsNormBackward : OpKind::LayerNormBackward;
    std::vector<Tensor> g = call(k, {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
    std::vector<Tensor> grads(c.inputs.size());
    for (size_t i = 0; i < grads.size(); ++i)
      if (c.needs_input_grad[i]) grads[i] = g[i];
    return grads;
  };

  OpDef& b = def_of(t, kRms ? OpKind::RmsNormBackward : OpKind::LayerNormBackward);
  b.name = kRms ? "rms_norm_backward" : "layer_norm_backward";
  b.num_inputs = 3;
  b.optional_inputs = 0b100u;
  b.infer = infer_norm_backward<kRms>;
  b.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return static_cast<double>(shape_numel(in[1].shape)) * (kRms ? 10 : 14);
  };
  b.shard = shard_norm_backward;
  b.cpu = [](const KernelContext& c) {
    std::vector<Tensor> outs;
    for (size_t i = 0; i < c.out_meta.size(); ++i) outs.push_back(c.alloc(i));
    dispatch_float(outs[0].dtype(), kRms ? "rms_norm_backward" : "layer_norm_backward",
                   [&](auto tag) { norm_backward_kernel<decltype(tag), kRms>(c, outs); });
    return outs;
  };
}

// ---------------- embedding ----------------
// Inputs (weight [V, C], ids i64 [...]) -> [..., C]. The attributes are NoAttrs (weight is the
// whole vocabulary; an id outside [0, V) is an error) or, for a vocabulary-parallel shard,
// SliceAttrs{0, start, end}: weight holds rows [start, end) of the logical vocabulary and ids
// outside that range look up zeros, so the ranks' outputs sum to the full lookup (Partial).

struct VocabRange {
  int64_t start = 0;
  bool shard = false;
};

VocabRange vocab_range(const Attrs& a, int64_t rows) {
  const SliceAttrs* s = std::get_if<SliceAttrs>(&a);
  if (!s) return {};
  HAP_CHECK(s->dim == 0 && s->start >= 0 && s->end - s->start == rows,
            "embedding: vocabulary shard rows [", s->start, ", ", s->end, ") of dim ", s->dim,
            " do not match a weight shard of ", rows, " rows");
  return {s->start, true};
}

Metas infer_embedding(const Metas& in, const Attrs& a) {
  const Shape &w = in[0].shape, &ids = in[1].shape;
  check_floating("embedding", in, 0);
  HAP_CHECK(w.size() == 2, "embedding: weight must be [V, C], got ", shape_str(w));
  HAP_CHECK(in[1].dtype == DType::I64, "embedding: ids ", shape_str(ids), " must be i64, got ",
            dtype_name(in[1].dtype));
  vocab_range(a, w[0]);
  Shape out = ids;
  out.push_back(w[1]);
  return {{out, in[0].dtype}};
}

void check_ids(const Tensor& ids, int64_t v) {
  const int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i)
    HAP_CHECK(p[i] >= 0 && p[i] < v, "embedding: id ", p[i], " at position ", i,
              " is out of range for a vocabulary of ", v, " rows (expected 0 <= id < ", v, ")");
}

template <typename T>
HAP_MULTIVERSION void embedding_kernel_clones(const KernelContext& c, const Tensor& out) {
  Tensor w = c.inputs[0].contiguous(), ids = c.inputs[1].contiguous();
  int64_t v = w.shape()[0], n = w.shape()[1], count = ids.numel();
  VocabRange range = vocab_range(c.attrs, v);
  if (!range.shard) check_ids(ids, v);
  const T* pw = w.data<T>();
  const int64_t* pi = ids.data<int64_t>();
  T* py = out.data<T>();
#pragma omp parallel for if (parallel_for(count * n))
  for (int64_t i = 0; i < count; ++i) {
    int64_t r = pi[i] - range.start;
    if (r >= 0 && r < v)
      std::copy(pw + r * n, pw + (r + 1) * n, py + i * n);
    else
      std::fill(py + i * n, py + (i + 1) * n, T(0));
  }
}

template <typename T>
void embedding_kernel(const KernelContext& c, const Tensor& out) {
  ::hap::cpu::clone_call (&embedding_kernel_clones<T>)(c, out);
}

// Inputs (grad [..., C], ids [...]); ScatterAttrs{0, start, {V, C}}: the gradient of a weight
// (shard) holding vocabulary rows [start, start + V). Ids are bucketed by row (a stable counting
// sort), then every weight row is written once: zeros, or its gradient rows added in id order.
// Deterministic and free of races, whatever the thread count.
template <typename T>
HAP_MULTIVERSION void embedding_backward_kernel_clones(const KernelContext& c, const Tensor& out) {
  const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
  Tensor g = c.inputs[0].contiguous(), ids = c.inputs[1].contiguous();
  int64_t v = a.shape[0], n = a.shape[1], count = ids.numel();
  const int64_t* pi = ids.data<int64_t>();
  std::vector<int64_t> first(static_cast<size_t>(v + 1), 0), order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t r = pi[i] - a.start;
    if (r >= 0 && r < v) ++first[r + 1];
  }
  for (int64_t r = 0; r < v; ++r) first[r + 1] += first[r];
  std::vector<int64_t> fill(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < count; ++i) {
    int64_t r = pi[i] - a.start;
    if (r >= 0 && r < v) order[fill[r]++] = i;
  }
  const T* pg = g.data<T>();
  T* py = out.data<T>();
#pragma omp parallel for schedule(static) if (parallel_for(v * n))
  for (int64_t r = 0; r < v; ++r) {
    T* yr = py + r * n;
    int64_t b = first[r], e = first[r + 1];
    if (b == e) {
      std::fill(yr, yr + n, T(0));
      continue;
    }
    std::copy(pg + order[b] * n, pg + (order[b] + 1) * n, yr);
    for (int64_t k = b + 1; k < e; ++k) {
      const T* gr = pg + order[k] * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yr[j] += gr[j];
    }
  }
}

template <typename T>
void embedding_backward_kernel(const KernelContext& c, const Tensor& out) {
  ::hap::cpu::clone_call (&embedding_backward_kernel_clones<T>)(c, out);
}

std::vector<ShardSignature> shard_embedding(const Metas& in, const Metas&, const Attrs&) {
  std::vector<ShardSignature> sigs;
  int64_t nids = static_cast<int64_t>(in[1].shape.size());
  for (int64_t d = 0; d < nids; ++d)  // data parallel over the ids
    sigs.push_back({{Prop::replicated(), Prop::sharded(d)}, {Prop::sharded(d)}});
  // Vocabulary parallel: each rank looks up the ids in its row range (the executor passes
  // SliceAttrs with that range), zeros elsewhere; the sum over ranks is the lookup.
  sigs.push_back({{Prop::sharded(0), Prop::replicated()}, {Prop::partial()}});
  // Feature parallel: each rank holds some columns of every row.
  sigs.push_back({{Prop::sharded(1), Prop::replicated()}, {Prop::sharded(nids)}});
  return sigs;
}

// An embedding whose table is split by rows looks up only the ids in its row range (the rest
// give zeros: the Partial sum over ranks is the lookup).
std::vector<Tensor> embedding_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                    const Attrs& attrs) {
  const Prop w = ctx.input_prop(0);
  if (w.kind != PropKind::Sharded || w.dim != 0) return {call1(OpKind::Embedding, inputs, attrs)};
  const int64_t start = ctx.input_offset(0);
  return {call1(OpKind::Embedding, inputs, SliceAttrs{0, start, start + inputs[0].size(0)})};
}

// The gradient of an embedding table split by features ([V, C_r]): the shard's columns.
std::vector<Tensor> embedding_backward_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                             const Attrs& attrs) {
  ScatterAttrs a = attr<ScatterAttrs>(attrs);
  if (ctx.output_prop(0).kind == PropKind::Sharded) a.shape[1] = inputs[0].shape().back();
  return {call1(OpKind::EmbeddingBackward, inputs, a)};
}

void def_embedding(OpTable& t) {
  OpDef& d = def_of(t, OpKind::Embedding);
  d.name = "embedding";
  d.num_inputs = 2;
  d.infer = infer_embedding;
  d.shard = shard_embedding;
  d.local = embedding_local;
  d.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "embedding",
                   [&](auto tag) { embedding_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
  d.backward = [](const BackwardContext& c) {
    const Tensor& w = c.inputs[0];
    if (!c.needs_input_grad[0]) return std::vector<Tensor>{Tensor(), Tensor()};
    VocabRange range = vocab_range(c.attrs, w.shape()[0]);
    Tensor gw = call1(OpKind::EmbeddingBackward, {c.grad_outputs[0], c.inputs[1]},
                      ScatterAttrs{0, range.start, w.shape()});
    return std::vector<Tensor>{gw, Tensor()};
  };

  OpDef& b = def_of(t, OpKind::EmbeddingBackward);
  b.name = "embedding_backward";
  b.num_inputs = 2;
  b.infer = [](const Metas& in, const Attrs& a) {
    const ScatterAttrs& s = attr<ScatterAttrs>(a);
    check_floating("embedding_backward", in, 0);
    HAP_CHECK(in[1].dtype == DType::I64, "embedding_backward: ids must be i64, got ",
              dtype_name(in[1].dtype));
    HAP_CHECK(s.shape.size() == 2, "embedding_backward: weight must be [V, C], got ",
              shape_str(s.shape));
    Shape expect = in[1].shape;
    expect.push_back(s.shape[1]);
    HAP_CHECK(in[0].shape == expect, "embedding_backward: gradient ", shape_str(in[0].shape),
              " does not match ids ", shape_str(in[1].shape), " and weight ", shape_str(s.shape),
              " (expected ", shape_str(expect), ")");
    return Metas{{s.shape, in[0].dtype}};
  };
  b.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return static_cast<double>(shape_numel(in[0].shape));
  };
  b.shard = [](const Metas& in, const Metas&, const Attrs&) {
    std::vector<ShardSignature> sigs;
    int64_t nids = static_cast<int64_t>(in[1].shape.size());
    for (int64_t d = 0; d < nids; ++d)
      sigs.push_back({{Prop::sharded(d), Prop::sharded(d)}, {Prop::partial()}});
    sigs.push_back({{Prop::sharded(nids), Prop::replicated()}, {Prop::sharded(1)}});
    return sigs;
  };
  b.local = embedding_backward_local;
  b.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "embedding_backward",
                   [&](auto tag) { embedding_backward_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
}

// ---- MaskTokens: the masked-LM corruption of token ids (MaskTokensAttrs) ----

// The draw for logical position `i`: chosen or not, and what a chosen input becomes.
int64_t masked_token(const MaskTokensAttrs& a, int64_t id, uint64_t i) {
  const auto w = philox_words(a.seed, a.stream, i);
  constexpr double kWord = 1.0 / 4294967296.0;
  const bool chosen = static_cast<double>(w[0]) * kWord < a.p;
  if (a.targets) return chosen ? id : a.ignore_index;
  if (!chosen) return id;
  const double u = static_cast<double>(w[1]) * kWord;
  if (u < 0.8) return a.mask_id;
  // In 64 bits: a vocabulary of 2^32 (allowed) would be a modulo by zero in 32.
  if (u < 0.9) return static_cast<int64_t>(uint64_t{w[2]} % static_cast<uint64_t>(a.vocab));
  return id;
}

// A shard draws its slice of the logical positions with the step's streams and the run's seed.
std::vector<Tensor> mask_tokens_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                      const Attrs& attrs) {
  MaskTokensAttrs a = attr<MaskTokensAttrs>(attrs);
  a.stream += ctx.random_offset();
  if (ctx.random_seed()) a.seed = *ctx.random_seed();
  a.slice = ctx.input_slice(0);
  return {call1(OpKind::MaskTokens, inputs, a)};
}

void def_mask_tokens(OpTable& t) {
  OpDef& d = def_of(t, OpKind::MaskTokens);
  d.name = "mask_tokens";
  d.num_inputs = 1;
  d.infer = [](const Metas& in, const Attrs& attrs) {
    const MaskTokensAttrs& a = attr<MaskTokensAttrs>(attrs);
    HAP_CHECK(in[0].dtype == DType::I64, "mask_tokens: ids must be i64, got ",
              dtype_name(in[0].dtype));
    HAP_CHECK(a.p >= 0 && a.p <= 1, "mask_tokens: probability must be in [0, 1], got ", a.p);
    HAP_CHECK(a.vocab >= 1 && a.vocab <= (int64_t{1} << 32),
              "mask_tokens: vocab must be in [1, 2^32], got ", a.vocab);
    return Metas{{in[0].shape, DType::I64}};
  };
  d.flops = [](const Metas&, const Metas&, const Attrs&) { return 0.0; };
  d.shard = [](const Metas& in, const Metas&, const Attrs&) {
    std::vector<ShardSignature> sigs;
    for (int64_t dim = 0; dim < static_cast<int64_t>(in[0].shape.size()); ++dim)
      sigs.push_back({{Prop::sharded(dim)}, {Prop::sharded(dim)}});
    return sigs;
  };
  d.local = mask_tokens_local;
  d.saves_inputs = false;
  d.cpu = [](const KernelContext& c) {
    const MaskTokensAttrs& a = attr<MaskTokensAttrs>(c.attrs);
    Tensor ids = c.inputs[0].contiguous();
    Tensor out = c.alloc(0);
    const int64_t* pi = ids.data<int64_t>();
    int64_t* po = out.data<int64_t>();
    for_each_logical_index(ids.shape(), a.slice, [&](int64_t i, uint64_t logical) {
      po[i] = masked_token(a, pi[i], logical);
    });
    return std::vector<Tensor>{out};
  };
}

// ---- TrainEvalSelect(train, eval): `train` in training, `eval` in evaluation ----
// What a layer with running statistics (BatchNorm) records so that one traced graph serves both
// modes on ranks: the executor's local hook picks by the forward's mode. Called eagerly (only in
// training) it is a copy of `train`, with the gradient flowing to `train` alone.
void def_train_eval_select(OpTable& t) {
  OpDef& d = def_of(t, OpKind::TrainEvalSelect);
  d.name = "train_eval_select";
  d.num_inputs = 2;
  d.infer = [](const Metas& in, const Attrs&) {
    HAP_CHECK(in[0].shape == in[1].shape && in[0].dtype == in[1].dtype,
              "train_eval_select: both inputs must have one shape and dtype, got ",
              shape_str(in[0].shape), " ", dtype_name(in[0].dtype), " and ", shape_str(in[1].shape),
              " ", dtype_name(in[1].dtype));
    return Metas{in[0]};
  };
  d.shard = [](const Metas& in, const Metas&, const Attrs&) {
    std::vector<ShardSignature> sigs;
    for (int64_t dim = 0; dim < static_cast<int64_t>(in[0].shape.size()); ++dim)
      if (in[0].shape[static_cast<size_t>(dim)] > 1)
        sigs.push_back({{Prop::sharded(dim), Prop::sharded(dim)}, {Prop::sharded(dim)}});
    return sigs;
  };
  d.local = [](ShardContext& ctx, const std::vector<Tensor>& inputs, const Attrs& attrs) {
    if (!ctx.training()) return std::vector<Tensor>{inputs[1]};
    return std::vector<Tensor>{call1(OpKind::TrainEvalSelect, inputs, attrs)};
  };
  d.saves_inputs = false;
  d.moves_data = true;
  d.any_device = true;
  d.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    out.copy_from(c.inputs[0]);  // on any device
    return std::vector<Tensor>{out};
  };
  // The training output does not depend on `eval`: its gradient is zero where one is asked for.
  d.backward = [](const BackwardContext& c) {
    const Tensor& g = c.grad_outputs[0];
    return std::vector<Tensor>{
        g, c.needs_input_grad[1] ? call1(OpKind::MulScalar, {g}, ScalarAttrs{0.0}) : Tensor()};
  };
}

}  // namespace

void register_nn_ops(OpTable& t) {
  def_train_eval_select(t);
  def_softmax<false>(t);
  def_softmax<true>(t);
  def_norm<false>(t);
  def_norm<true>(t);
  def_embedding(t);
  def_mask_tokens(t);
}

}  // namespace hap::ops
