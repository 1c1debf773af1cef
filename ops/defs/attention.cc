// Scaled dot-product attention, fused per (batch, head): S = scale Q K^T, the causal mask and the
// key padding mask, a row softmax, Philox dropout and O = P V, without materialising [B, H, T, T].
// The forward keeps the row log-sum-exp; the backward recomputes P from it (as flash attention
// does). Heads run in parallel (dynamically scheduled: a head is computed whole by one thread, so
// results do not depend on the schedule), each with single-threaded GEMMs, in blocks of query rows;
// with the causal mask a block only computes the key columns up to its last row.
#include <cmath>
#include <limits>

#include "core/philox.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/multiversion.h"
#include "ops/cpu/vec_math.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

using cpu::exp_fast;

constexpr int64_t kRowBlock = 64;  // query rows per block: S, P, dP blocks stay in cache

// Checks q, k [B, H, T, D] and v [B, H, T, Dv] (inputs 0, 1, 2).
void check_qkv(const Metas& in, const char* op) {
  for (size_t i = 0; i < 3; ++i) check_floating(op, in, i);
  check_same_dtype(op, in, 0, 1);
  check_same_dtype(op, in, 0, 2);
  const Shape &q = in[0].shape, &k = in[1].shape, &v = in[2].shape;
  HAP_CHECK(q.size() == 4 && k.size() == 4 && v.size() == 4, op,
            ": q, k, v must be [B, H, T, D], got ", shape_str(q), ", ", shape_str(k), ", ",
            shape_str(v));
  HAP_CHECK(q == k, op, ": q ", shape_str(q), " and k ", shape_str(k), " must have the same shape");
  HAP_CHECK(v[0] == q[0] && v[1] == q[1] && v[2] == q[2], op, ": v ", shape_str(v),
            " must share [B, H, T] with q ", shape_str(q));
  HAP_CHECK(q[3] > 0, op, ": head size D must be > 0, got q ", shape_str(q));
}

// The optional key mask (input `i`): u8 [B, T], 1 where a query may attend to that key.
void check_key_mask(const Metas& in, size_t i, const char* op) {
  if (in.size() <= i || !in[i].defined) return;
  const Shape& q = in[0].shape;
  HAP_CHECK(in[i].dtype == DType::U8, op, ": the key mask must be u8 (1: attend, 0: padding), got ",
            dtype_name(in[i].dtype));
  HAP_CHECK(in[i].shape == (Shape{q[0], q[2]}), op, ": the key mask ", shape_str(in[i].shape),
            " must be [B, T] = [", q[0], ", ", q[2], "] for q ", shape_str(q));
}

// Sets the scores of masked keys to -inf; returns whether any key of the row is left.
template <typename T>
bool mask_keys(T* row, int64_t n, const uint8_t* keep) {
  bool any = keep == nullptr;
  if (keep)
    for (int64_t j = 0; j < n; ++j) {
      if (keep[j])
        any = true;
      else
        row[j] = -std::numeric_limits<T>::infinity();
    }
  return any;
}

Shape lse_shape(const Shape& q) { return {q[0], q[1], q[2]}; }
Shape out_shape(const Shape& q, const Shape& v) { return {q[0], q[1], q[2], v[3]}; }

// The log-sum-exp's dtype: q's, but f32 for bf16 operands (a statistic, as the softmax's sums are
// accumulated: rounded to bf16 at lse ~ 7 it would be off by up to 2^-6, and P recomputed from it
// in backward, exp(s - lse), by as much relatively).
DType lse_dtype(DType q) { return q == DType::BF16 ? DType::F32 : q; }

// Outputs: out [B, H, T, Dv] of q's dtype and the row log-sum-exp of the scaled scores [B, H, T]
// (lse_dtype).
Metas infer_attention(const Metas& in, const Attrs&) {
  check_qkv(in, "attention");
  check_key_mask(in, 3, "attention");
  DType dt = in[0].dtype;
  return {{out_shape(in[0].shape, in[2].shape), dt}, {lse_shape(in[0].shape), lse_dtype(dt)}};
}

// Inputs: q, k, v, out, lse, grad of out (or undefined), grad of lse (or undefined), key mask
// (or undefined). Outputs: dq, dk, dv.
Metas infer_attention_backward(const Metas& in, const Attrs&) {
  const char* op = "attention_backward";
  check_qkv(in, op);
  check_key_mask(in, 7, op);
  Shape o = out_shape(in[0].shape, in[2].shape), l = lse_shape(in[0].shape);
  const Shape expect[] = {o, l, o, l};
  const char* what[] = {"out", "lse", "grad of out", "grad of lse"};
  for (size_t i = 3; i < 7; ++i) {
    if (!in[i].defined) continue;
    HAP_CHECK(in[i].shape == expect[i - 3], op, ": ", what[i - 3], " ", shape_str(in[i].shape),
              " does not match q ", shape_str(in[0].shape), " and v ", shape_str(in[2].shape),
              " (expected ", shape_str(expect[i - 3]), ")");
    if (i == 4 || i == 6) {
      HAP_CHECK(in[i].dtype == lse_dtype(in[0].dtype), op, ": ", what[i - 3], " is ",
                dtype_name(in[i].dtype), " but q is ", dtype_name(in[0].dtype), " (expected ",
                dtype_name(lse_dtype(in[0].dtype)), ")");
    } else {
      check_same_dtype(op, in, 0, i);
    }
  }
  return {in[0], in[1], in[2]};
}

double causal_share(const Attrs& a) { return attr<AttentionAttrs>(a).causal ? 0.5 : 1.0; }

double flops_attention(const Metas& in, const Metas&, const Attrs& a) {
  const Shape &q = in[0].shape, &v = in[2].shape;
  double bhtt = static_cast<double>(q[0] * q[1]) * static_cast<double>(q[2] * q[2]);
  return causal_share(a) * bhtt * (2.0 * static_cast<double>(q[3] + v[3]) + 5.0);
}

double flops_attention_backward(const Metas& in, const Metas&, const Attrs& a) {
  const Shape &q = in[0].shape, &v = in[2].shape;
  double bhtt = static_cast<double>(q[0] * q[1]) * static_cast<double>(q[2] * q[2]);
  return causal_share(a) * bhtt * (2.0 * static_cast<double>(3 * q[3] + 2 * v[3]) + 8.0);
}

// Batch- or head-parallel: every (b, h) is independent; the key mask [B, T] is split with the
// batch and whole on every rank when heads are split. With dropout the executor passes each
// rank its slice of the logical [B, H, T, T] probabilities in attrs.dropout.slice.
std::vector<ShardSignature> shard_attention(const Metas& in, const Metas& out, size_t mask_at) {
  std::vector<ShardSignature> sigs;
  for (int64_t d = 0; d < 2; ++d) {
    std::vector<Prop> ins;
    for (size_t i = 0; i < in.size(); ++i) {
      const bool split = in[i].defined && (i != mask_at || d == 0);
      ins.push_back(split ? Prop::sharded(d) : Prop::replicated());
    }
    sigs.push_back({ins, std::vector<Prop>(out.size(), Prop::sharded(d))});
  }
  return sigs;
}

// One [T, D] matrix per (b, h) of a [B, H, T, D] tensor, handed to GEMM in place when its rows
// are unit-stride (e.g. heads permuted from [B, T, H, D]), else from a packed copy.
template <typename T>
struct Heads {
  Tensor held;
  const T* data = nullptr;
  int64_t stride_b = 0, stride_h = 0, ld = 1;

  explicit Heads(const Tensor& x) {
    const Strides& s = x.strides();
    int64_t rows = x.shape()[2], cols = x.shape()[3];
    bool in_place = (s[3] == 1 || cols <= 1) && (rows <= 1 || s[2] >= std::max<int64_t>(cols, 1));
    held = in_place ? x : x.contiguous();
    data = held.data<T>();
    stride_b = held.strides()[0];
    stride_h = held.strides()[1];
    ld = std::max<int64_t>(rows <= 1 ? cols : held.strides()[2], 1);
  }
  const T* at(int64_t b, int64_t h) const { return data + b * stride_b + h * stride_h; }
};

// The dropout mask of the probabilities [B, H, T, T]: element (b, h, i, j) is kept when the
// Philox uniform at its logical index is below 1 - p, exactly as the dropout op draws it, so a
// shard (attrs.dropout.slice) draws its slice of the single-device mask.
struct DropoutMask {
  bool on = false;
  uint64_t seed = 0, stream = 0;
  double keep = 1;
  int64_t offset[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 1};

  DropoutMask(const RandomAttrs& r, const Shape& local) {
    on = r.p > 0;
    seed = r.seed;
    stream = r.stream;
    keep = 1.0 - r.p;
    Shape logical = local;
    if (!r.slice.logical_shape.empty() || !r.slice.offset.empty()) {
      HAP_CHECK(r.slice.logical_shape.size() == 4 && r.slice.offset.size() == 4,
                "attention: dropout slice must be 4-d (of the probabilities [B, H, T, T]), got ",
                "logical shape ", shape_str(r.slice.logical_shape), " and offset ",
                shape_str(r.slice.offset));
      logical = r.slice.logical_shape;
      for (size_t d = 0; d < 4; ++d) {
        HAP_CHECK(r.slice.offset[d] >= 0 && r.slice.offset[d] + local[d] <= logical[d],
                  "attention: probabilities ", shape_str(local), " at offset ",
                  shape_str(r.slice.offset), " do not fit the logical shape ", shape_str(logical));
        offset[d] = r.slice.offset[d];
      }
    }
    Strides ls = contiguous_strides(logical);
    for (size_t d = 0; d < 4; ++d) stride[d] = ls[d];
  }

  // m[j] = 1 / (1 - p) where element j of row (b, h, i) is kept, 0 where it is dropped.
  template <typename T>
  void row(T* m, int64_t n, int64_t b, int64_t h, int64_t i) const {
    uint64_t base =
        static_cast<uint64_t>((b + offset[0]) * stride[0] + (h + offset[1]) * stride[1] +
                              (i + offset[2]) * stride[2] + offset[3] * stride[3]);
    T s = static_cast<T>(1.0 / keep);
    double k = keep;
    uint64_t sd = seed, st = stream;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      m[j] = static_cast<double>(philox_uniform(sd, st, base + static_cast<uint64_t>(j))) < k
                 ? s
                 : T(0);
  }
};

template <typename T>
T attention_scale(const AttentionAttrs& a, int64_t d) {
  return static_cast<T>(a.scale != 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(d)));
}

template <typename T>
HAP_MULTIVERSION void attention_kernel_clones(const KernelContext& c, const Tensor& out,
                                              const Tensor& lse) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  Heads<T> q(c.inputs[0]), k(c.inputs[1]), v(c.inputs[2]);
  const Shape& qs = c.inputs[0].shape();
  int64_t nb = qs[0], nh = qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  T scale = attention_scale<T>(a, d);
  DropoutMask mask(a.dropout, {nb, nh, t, t});
  T* po = out.data<T>();
  T* pl = lse.data<T>();
  const Tensor keys =
      c.inputs.size() > 3 && c.inputs[3].defined() ? c.inputs[3].contiguous() : Tensor();
  const uint8_t* pk = keys.defined() ? keys.data<uint8_t>() : nullptr;
  cpu::gemm_path();  // HAP_CPU_GEMM is read (and may throw) before the parallel region
#pragma omp parallel if (nb * nh > 1)
  {
    std::vector<T> s(static_cast<size_t>(kRowBlock * t)), m(static_cast<size_t>(t));
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < nb * nh; ++bh) {
      int64_t b = bh / nh, h = bh % nh;
      const T *qh = q.at(b, h), *kh = k.at(b, h), *vh = v.at(b, h);
      T* oh = po + bh * t * dv;
      T* lh = pl + bh * t;
      for (int64_t r0 = 0; r0 < t; r0 += kRowBlock) {
        int64_t r1 = std::min(t, r0 + kRowBlock), cols = a.causal ? r1 : t;
        // s[i - r0, j] = scale q_i . k_j
        cpu::gemm<T>(false, true, r1 - r0, cols, d, scale, qh + r0 * q.ld, q.ld, kh, k.ld, T(0),
                     s.data(), t);
        for (int64_t i = r0; i < r1; ++i) {
          T* row = s.data() + (i - r0) * t;
          int64_t n = a.causal ? i + 1 : t;
          if (!mask_keys(row, n, pk ? pk + b * t : nullptr)) {  // no key to attend to: zeros
            lh[i] = -std::numeric_limits<T>::infinity();
            std::fill(row, row + cols, T(0));
            continue;
          }
          const T mx = cpu::max_skipping_nan(row, n);
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < n; ++j) {
            T e = row[j] == -std::numeric_limits<T>::infinity() ? T(0) : exp_fast(row[j] - mx);
            row[j] = e;
            sum += e;
          }
          lh[i] = mx + std::log(sum);
          T inv = T(1) / sum;
          if (mask.on) {
            mask.row(m.data(), n, b, h, i);
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] *= inv * m[j];
          } else {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          }
          std::fill(row + n, row + cols, T(0));
        }
        // o[r0:r1] = p[r0:r1, 0:cols] v[0:cols]
        cpu::gemm<T>(false, false, r1 - r0, dv, cols, T(1), s.data(), t, vh, v.ld, T(0),
                     oh + r0 * dv, dv);
      }
    }
  }
}

template <typename T>
void attention_kernel(const KernelContext& c, const Tensor& out, const Tensor& lse) {
  ::hap::cpu::clone_call (&attention_kernel_clones<T>)(c, out, lse);
}

// With P the softmax, Pd = P * mask / (1 - p) the dropped probabilities and O = Pd V:
// dV = Pd^T dO, dPd = dO V^T, dS = P * (dPd * mask / (1 - p) - rowsum(dO * O) + dlse),
// dQ = scale dS K, dK = scale dS^T Q. P is recomputed as exp(scale Q K^T - lse).
template <typename T>
HAP_MULTIVERSION void attention_backward_kernel_clones(const KernelContext& c,
                                                       const std::vector<Tensor>& outs) {
  const AttentionAttrs& a = attr<AttentionAttrs>(c.attrs);
  const Shape& qs = c.inputs[0].shape();
  int64_t nb = qs[0], nh = qs[1], t = qs[2], d = qs[3], dv = c.inputs[2].shape()[3];
  Tensor gout = c.inputs[5].defined()
                    ? c.inputs[5]
                    : Tensor::zeros(out_shape(qs, c.inputs[2].shape()),
                                    TensorOptions{}.with_dtype(c.inputs[0].dtype()));
  Heads<T> q(c.inputs[0]), k(c.inputs[1]), v(c.inputs[2]), o(c.inputs[3]), go(gout);
  Tensor lse = c.inputs[4].contiguous();
  Tensor glse = c.inputs[6].defined() ? c.inputs[6].contiguous() : Tensor();
  T scale = attention_scale<T>(a, d);
  DropoutMask mask(a.dropout, {nb, nh, t, t});
  const T* pl = lse.data<T>();
  const T* pgl = glse.defined() ? glse.data<T>() : nullptr;
  const Tensor keys =
      c.inputs.size() > 7 && c.inputs[7].defined() ? c.inputs[7].contiguous() : Tensor();
  const uint8_t* pk = keys.defined() ? keys.data<uint8_t>() : nullptr;
  T *pdq = outs[0].data<T>(), *pdk = outs[1].data<T>(), *pdv = outs[2].data<T>();
  cpu::gemm_path();  // HAP_CPU_GEMM is read (and may throw) before the parallel region
#pragma omp parallel if (nb * nh > 1)
  {
    size_t block = static_cast<size_t>(kRowBlock * t);
    std::vector<T> p(block), dp(block), m(static_cast<size_t>(t)), delta(static_cast<size_t>(t));
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < nb * nh; ++bh) {
      int64_t b = bh / nh, h = bh % nh;
      const T *qh = q.at(b, h), *kh = k.at(b, h), *vh = v.at(b, h), *oh = o.at(b, h);
      const T* goh = go.at(b, h);
      const T* lh = pl + bh * t;
      const T* glh = pgl ? pgl + bh * t : nullptr;
      T *dqh = pdq + bh * t * d, *dkh = pdk + bh * t * d, *dvh = pdv + bh * t * dv;
      for (int64_t i = 0; i < t; ++i) {
        const T *gi = goh + i * go.ld, *oi = oh + i * o.ld;
        T acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < dv; ++j) acc += gi[j] * oi[j];
        delta[i] = acc;
      }
      std::fill(dkh, dkh + t * d, T(0));
      std::fill(dvh, dvh + t * dv, T(0));
      for (int64_t r0 = 0; r0 < t; r0 += kRowBlock) {
        int64_t r1 = std::min(t, r0 + kRowBlock), rows = r1 - r0, cols = a.causal ? r1 : t;
        cpu::gemm<T>(false, true, rows, cols, d, scale, qh + r0 * q.ld, q.ld, kh, k.ld, T(0),
                     p.data(), t);
        cpu::gemm<T>(false, true, rows, cols, dv, T(1), goh + r0 * go.ld, go.ld, vh, v.ld, T(0),
                     dp.data(), t);
        for (int64_t i = r0; i < r1; ++i) {
          T* pr = p.data() + (i - r0) * t;
          T* dpr = dp.data() + (i - r0) * t;
          int64_t n = a.causal ? i + 1 : t;
          T li = lh[i], shift = delta[i] - (glh ? glh[i] : T(0));
          if (li == -std::numeric_limits<T>::infinity()) {  // a row with no key: all zeros
            std::fill(pr, pr + cols, T(0));
            std::fill(dpr, dpr + cols, T(0));
            continue;
          }
          mask_keys(pr, n, pk ? pk + b * t : nullptr);
          if (mask.on) {
            mask.row(m.data(), n, b, h, i);
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
              T pj = pr[j] == -std::numeric_limits<T>::infinity() ? T(0) : exp_fast(pr[j] - li);
              pr[j] = pj * m[j];
              dpr[j] = pj * (dpr[j] * m[j] - shift);
            }
          } else {
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) {
              T pj = pr[j] == -std::numeric_limits<T>::infinity() ? T(0) : exp_fast(pr[j] - li);
              pr[j] = pj;
              dpr[j] = pj * (dpr[j] - shift);
            }
          }
          std::fill(pr + n, pr + cols, T(0));
          std::fill(dpr + n, dpr + cols, T(0));
        }
        // dv[0:cols] += pd^T go[r0:r1], dq[r0:r1] = scale ds k[0:cols],
        // dk[0:cols] += scale ds^T q[r0:r1]
        cpu::gemm<T>(true, false, cols, dv, rows, T(1), p.data(), t, goh + r0 * go.ld, go.ld, T(1),
                     dvh, dv);
        cpu::gemm<T>(false, false, rows, d, cols, scale, dp.data(), t, kh, k.ld, T(0), dqh + r0 * d,
                     d);
        cpu::gemm<T>(true, false, cols, d, rows, scale, dp.data(), t, qh + r0 * q.ld, q.ld, T(1),
                     dkh, d);
      }
    }
  }
}

template <typename T>
void attention_backward_kernel(const KernelContext& c, const std::vector<Tensor>& outs) {
  ::hap::cpu::clone_call (&attention_backward_kernel_clones<T>)(c, outs);
}

// Attention dropout on a shard (of batch or heads) draws its slice of the single-device mask of
// the attention weights [B, H, T, S], with the step's streams and the run's seed.
std::vector<Tensor> attention_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                    const Attrs& attrs) {
  AttentionAttrs a = attr<AttentionAttrs>(attrs);
  a.dropout.stream += ctx.random_offset();
  if (ctx.random_seed()) a.dropout.seed = *ctx.random_seed();
  if (!ctx.training()) a.dropout.p = 0;
  const Prop q = ctx.input_prop(0);
  if (q.kind == PropKind::Sharded && a.dropout.p > 0) {
    const Shape& s = ctx.input_shape(0);  // [B, H, T, D]
    LogicalSlice slice;
    slice.logical_shape = {s[0], s[1], s[2], ctx.input_shape(1)[2]};
    slice.offset.assign(4, 0);
    slice.offset[static_cast<size_t>(q.dim)] = ctx.input_offset(0);
    a.dropout.slice = slice;
  }
  return call(OpKind::Attention, inputs, a);
}

}  // namespace

void register_attention_ops(OpTable& t) {
  OpDef& at = def_of(t, OpKind::Attention);
  at.flops_bound = true;
  at.name = "attention";
  at.num_inputs = 4;
  at.optional_inputs = 1u << 3;
  at.infer = infer_attention;
  at.flops = flops_attention;
  at.shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return shard_attention(in, out, 3);
  };
  at.local = attention_local;
  at.saves_outputs = true;
  at.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0), lse = c.alloc(1);
    dispatch_float(out.dtype(), "attention",
                   [&](auto tag) { attention_kernel<decltype(tag)>(c, out, lse); });
    return std::vector<Tensor>{out, lse};
  };
  at.backward = [](const BackwardContext& c) {
    Tensor glse = c.grad_outputs.size() > 1 ? c.grad_outputs[1] : Tensor();
    std::vector<Tensor> g =
        call(OpKind::AttentionBackward,
             {c.inputs[0], c.inputs[1], c.inputs[2], c.outputs[0], c.outputs[1], c.grad_outputs[0],
              glse, c.inputs.size() > 3 ? c.inputs[3] : Tensor()},
             c.attrs);
    g.resize(c.inputs.size());  // the key mask has no gradient
    return g;
  };

  OpDef& ab = def_of(t, OpKind::AttentionBackward);
  ab.flops_bound = true;
  ab.name = "attention_backward";
  ab.num_inputs = 8;
  ab.optional_inputs = (1u << 5) | (1u << 6) | (1u << 7);
  ab.f32_stat_inputs = (1u << 4) | (1u << 6);  // lse and its gradient
  ab.infer = infer_attention_backward;
  ab.flops = flops_attention_backward;
  ab.shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return shard_attention(in, out, 7);
  };
  ab.cpu = [](const KernelContext& c) {
    std::vector<Tensor> outs{c.alloc(0), c.alloc(1), c.alloc(2)};
    dispatch_float(outs[0].dtype(), "attention_backward",
                   [&](auto tag) { attention_backward_kernel<decltype(tag)>(c, outs); });
    return outs;
  };
}

}  // namespace hap::ops
