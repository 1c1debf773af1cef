// Matrix products on the CPU GEMM paths (ops/cpu/blas.h): matmul (batched, broadcasting) and
// linear (x W^T + b), in f32, f64 and bf16 (bf16 operands, f32 accumulation).
#include "ops/cpu/blas.h"
#include "ops/cpu/loops.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

// How to hand the last two dims of a view to GEMM without copying, if its layout allows.
struct GemmView {
  bool trans = false;
  int64_t ld = 0;
};

bool gemm_view(const Tensor& t, GemmView& v) {
  int64_t nd = t.dim();
  int64_t r = t.shape()[nd - 2], c = t.shape()[nd - 1];
  int64_t s0 = t.strides()[nd - 2], s1 = t.strides()[nd - 1];
  if ((s1 == 1 || c == 1) && s0 >= std::max<int64_t>(c, 1)) {
    v = {false, s0};
    return true;
  }
  if ((s0 == 1 || r == 1) && s1 >= std::max<int64_t>(r, 1)) {
    v = {true, s1};
    return true;
  }
  return false;
}

// Makes a view GEMM-ready, copying only when its layout cannot be described to BLAS.
Tensor gemm_ready(const Tensor& t, GemmView& v) {
  if (gemm_view(t, v)) return t;
  Tensor c = t.contiguous();
  gemm_view(c, v);
  return c;
}

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

Metas infer_matmul(const Metas& in, const Attrs&) {
  const Shape &a = in[0].shape, &b = in[1].shape;
  check_floating("matmul", in, 0);
  check_floating("matmul", in, 1);
  check_same_dtype("matmul", in, 0, 1);
  HAP_CHECK(a.size() >= 2 && b.size() >= 2, "matmul: operands must have at least 2 dims, got ",
            shape_str(a), " and ", shape_str(b));
  HAP_CHECK(a[a.size() - 1] == b[b.size() - 2], "matmul: shapes ", shape_str(a), " and ",
            shape_str(b), " do not match (inner dims ", a[a.size() - 1], " vs ", b[b.size() - 2],
            ")");
  Shape out = broadcast_shapes(batch_of(a), batch_of(b), "matmul (batch dims)");
  out.push_back(a[a.size() - 2]);
  out.push_back(b[b.size() - 1]);
  return {{out, in[0].dtype}};
}

double flops_matmul(const Metas& in, const Metas& out, const Attrs&) {
  int64_t k = in[0].shape.back();
  return 2.0 * static_cast<double>(shape_numel(out[0].shape)) * static_cast<double>(k);
}

template <typename T>
void matmul_kernel(const Tensor& out, const Tensor& a_in, const Tensor& b_in) {
  int64_t m = out.shape()[out.dim() - 2], n = out.shape()[out.dim() - 1];
  int64_t k = a_in.shape().back();
  T* c = out.data<T>();
  if (out.numel() == 0) return;
  if (k == 0) {
    out.fill_(0.0);
    return;
  }
  GemmView va, vb;
  Tensor b = gemm_ready(b_in, vb);
  // Fold a's batch into M when b has no batch: one large GEMM instead of many small ones.
  if (b.dim() == 2 && a_in.dim() > 2) {
    Tensor a = a_in.contiguous();
    int64_t rows = a.numel() / k;
    cpu::gemm<T>(false, vb.trans, rows, n, k, T(1), a.data<T>(), k, b.data<T>(), vb.ld, T(0), c, n);
    return;
  }
  Tensor a = gemm_ready(a_in, va);
  Shape batch = batch_of(out.shape());
  int64_t nb = shape_numel(batch);
  Shape bshape = batch;
  Strides sa = cpu::broadcast_strides(
      a.as_strided(batch_of(a.shape()), batch_of(a.strides()), a.offset()), bshape);
  Strides sb = cpu::broadcast_strides(
      b.as_strided(batch_of(b.shape()), batch_of(b.strides()), b.offset()), bshape);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  for (int64_t i = 0; i < nb; ++i) {
    int64_t rem = i, oa = 0, ob = 0;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    cpu::gemm<T>(va.trans, vb.trans, m, n, k, T(1), pa + oa, va.ld, pb + ob, vb.ld, T(0),
                 c + i * m * n, n);
  }
}

Tensor mT(const Tensor& t) {
  std::vector<int64_t> perm(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) perm[i] = i;
  std::swap(perm[t.dim() - 1], perm[t.dim() - 2]);
  return call1(OpKind::Permute, {t}, PermuteAttrs{perm});
}

Tensor reshape_to(const Tensor& t, Shape s) {
  return call1(OpKind::Reshape, {t}, ShapeAttrs{std::move(s)});
}

// t: [..., c] as a matrix [rows, c]. The row count is spelled out (not -1), so that a shard with
// no columns (c = 0, a rank holding none of a column-parallel Linear's outputs) reshapes too.
Tensor as_rows(const Tensor& t) {
  const Shape& s = t.shape();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) rows *= s[i];
  return reshape_to(t, {rows, s.empty() ? 1 : s.back()});
}

std::vector<Tensor> matmul_backward(const BackwardContext& c) {
  const Tensor& g = c.grad_outputs[0];
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor ga, gb;
  if (c.needs_input_grad[0]) ga = sum_to(call1(OpKind::MatMul, {g, mT(b)}), a.shape());
  if (c.needs_input_grad[1]) {
    if (b.dim() == 2 && a.dim() > 2) {
      gb = call1(OpKind::MatMul, {mT(as_rows(a)), as_rows(g)});
    } else {
      gb = sum_to(call1(OpKind::MatMul, {mT(a), g}), b.shape());
    }
  }
  return {ga, gb};
}

std::vector<ShardSignature> shard_matmul(const Metas& in, const Metas& out, const Attrs&) {
  std::vector<ShardSignature> sigs;
  int64_t na = static_cast<int64_t>(in[0].shape.size()),
          nb = static_cast<int64_t>(in[1].shape.size());
  int64_t no = static_cast<int64_t>(out[0].shape.size());
  // Batch dims: split both operands where they are not broadcast.
  for (int64_t d = 0; d < no - 2; ++d) {
    int64_t da = d - (no - na), db = d - (no - nb);
    bool a_has = da >= 0 && in[0].shape[da] == out[0].shape[d];
    bool b_has = db >= 0 && in[1].shape[db] == out[0].shape[d];
    if (!a_has && !b_has) continue;
    sigs.push_back({{a_has ? Prop::sharded(da) : Prop::replicated(),
                     b_has ? Prop::sharded(db) : Prop::replicated()},
                    {Prop::sharded(d)}});
  }
  sigs.push_back({{Prop::sharded(na - 2), Prop::replicated()}, {Prop::sharded(no - 2)}});  // rows
  sigs.push_back({{Prop::replicated(), Prop::sharded(nb - 1)}, {Prop::sharded(no - 1)}});  // cols
  sigs.push_back({{Prop::sharded(na - 1), Prop::sharded(nb - 2)}, {Prop::partial()}});     // inner
  sigs.push_back({{Prop::partial(), Prop::replicated()}, {Prop::partial()}});
  sigs.push_back({{Prop::replicated(), Prop::partial()}, {Prop::partial()}});
  return sigs;
}

// ---------------- linear ----------------
Metas infer_linear(const Metas& in, const Attrs&) {
  const Shape &x = in[0].shape, &w = in[1].shape;
  check_floating("linear", in, 0);
  HAP_CHECK(!x.empty(), "linear: input must have at least 1 dim, got a scalar");
  HAP_CHECK(w.size() == 2, "linear: weight must be [out, in], got ", shape_str(w));
  HAP_CHECK(x.back() == w[1], "linear: input ", shape_str(x), " has ", x.back(),
            " features but weight ", shape_str(w), " expects ", w[1]);
  check_same_dtype("linear", in, 0, 1);
  if (in[2].defined) {
    HAP_CHECK(in[2].shape == Shape{w[0]}, "linear: bias ", shape_str(in[2].shape),
              " does not match weight ", shape_str(w), " (expected [", w[0], "])");
    check_same_dtype("linear", in, 0, 2);
  }
  Shape out = x;
  out.back() = w[0];
  return {{out, in[0].dtype}};
}

template <typename T>
void linear_kernel(const Tensor& out, const Tensor& x_in, const Tensor& w_in, const Tensor& bias) {
  int64_t k = x_in.shape().back(), n = w_in.shape()[0];
  int64_t rows = k == 0 ? out.numel() / std::max<int64_t>(n, 1) : x_in.numel() / k;
  T* y = out.data<T>();
  T beta = T(0);
  if (bias.defined()) {
    Tensor b = bias.contiguous();
    const T* pb = b.data<T>();
#pragma omp parallel for if (rows * n > cpu::kParallelGrain)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) y[r * n + j] = pb[j];
    beta = T(1);
  } else if (k == 0) {
    out.fill_(0.0);
  }
  if (rows == 0 || n == 0 || k == 0) return;
  Tensor x = x_in.contiguous();
  GemmView vw;
  Tensor w = gemm_ready(w_in, vw);
  // y[rows, n] (+)= x[rows, k] @ w[n, k]^T
  cpu::gemm<T>(false, !vw.trans, rows, n, k, T(1), x.data<T>(), k, w.data<T>(), vw.ld, beta, y, n);
}

std::vector<Tensor> linear_backward(const BackwardContext& c) {
  const Tensor& g = c.grad_outputs[0];
  const Tensor &x = c.inputs[0], &w = c.inputs[1];
  Tensor g2 = as_rows(g);
  Tensor gx, gw, gb;
  if (c.needs_input_grad[0]) gx = reshape_to(call1(OpKind::MatMul, {g2, w}), x.shape());
  if (c.needs_input_grad[1]) gw = call1(OpKind::MatMul, {mT(g2), as_rows(x)});
  if (c.needs_input_grad.size() > 2 && c.needs_input_grad[2])
    gb = call1(OpKind::Sum, {g2}, ReduceAttrs{{0}, false});
  return {gx, gw, gb};
}

std::vector<ShardSignature> shard_linear(const Metas& in, const Metas& out, const Attrs&) {
  std::vector<ShardSignature> sigs;
  int64_t nx = static_cast<int64_t>(in[0].shape.size());
  bool has_bias = in[2].defined;
  for (int64_t d = 0; d < nx - 1; ++d)  // data parallel over any leading dim
    sigs.push_back(
        {{Prop::sharded(d), Prop::replicated(), Prop::replicated()}, {Prop::sharded(d)}});
  // Column parallel: weight rows (output features) split, bias split alike.
  sigs.push_back(
      {{Prop::replicated(), Prop::sharded(0), has_bias ? Prop::sharded(0) : Prop::replicated()},
       {Prop::sharded(nx - 1)}});
  // Row parallel: input features split; the product is a Partial sum. A bias must then be a
  // Partial too (held by one rank), or it would be added once per rank.
  sigs.push_back(
      {{Prop::sharded(nx - 1), Prop::sharded(1), has_bias ? Prop::partial() : Prop::replicated()},
       {Prop::partial()}});
  sigs.push_back(
      {{Prop::partial(), Prop::replicated(), has_bias ? Prop::partial() : Prop::replicated()},
       {Prop::partial()}});
  return sigs;
}

}  // namespace

void register_matmul_ops(OpTable& t) {
  OpDef& mm = def_of(t, OpKind::MatMul);
  mm.autocast = Autocast::Lower;
  mm.product = mm.flops_bound = true;
  mm.name = "matmul";
  mm.num_inputs = 2;
  mm.infer = infer_matmul;
  mm.flops = flops_matmul;
  mm.shard = shard_matmul;
  mm.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    if (out.dtype() == DType::BF16) {
      matmul_kernel<bf16>(out, c.inputs[0], c.inputs[1]);
    } else {
      dispatch_float(out.dtype(), "matmul", [&](auto tag) {
        matmul_kernel<decltype(tag)>(out, c.inputs[0], c.inputs[1]);
      });
    }
    return std::vector<Tensor>{out};
  };
  mm.cpu_bf16 = true;
  mm.backward = matmul_backward;

  OpDef& li = def_of(t, OpKind::Linear);
  li.autocast = Autocast::Lower;
  li.product = li.flops_bound = true;
  li.name = "linear";
  li.num_inputs = 3;
  li.optional_inputs = 1u << 2;
  li.infer = infer_linear;
  li.flops = [](const Metas& in, const Metas& out, const Attrs&) {
    return 2.0 * static_cast<double>(shape_numel(out[0].shape)) *
           static_cast<double>(in[0].shape.back());
  };
  li.shard = shard_linear;
  li.cpu = [](const KernelContext& c) {
    const Tensor& b = c.inputs[2];
    Tensor out = c.alloc(0);
    if (out.dtype() == DType::BF16) {
      linear_kernel<bf16>(out, c.inputs[0], c.inputs[1], b);
    } else {
      dispatch_float(out.dtype(), "linear", [&](auto tag) {
        linear_kernel<decltype(tag)>(out, c.inputs[0], c.inputs[1], b);
      });
    }
    return std::vector<Tensor>{out};
  };
  li.cpu_bf16 = true;
  li.backward = linear_backward;
}

}  // namespace hap::ops
