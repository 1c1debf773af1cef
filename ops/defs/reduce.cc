// Reductions: sum, mean, max over dims; argmax, topk; the scatter that their backward uses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/cpu/loops.h"
#include "ops/cpu/multiversion.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

// Normalised, sorted, unique reduction dims (empty = all).
std::vector<int64_t> reduce_dims(const Shape& s, const std::vector<int64_t>& dims, const char* op) {
  int64_t nd = static_cast<int64_t>(s.size());
  std::vector<int64_t> out;
  if (dims.empty()) {
    out.resize(nd);
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  if (nd == 0) {  // a scalar accepts dim 0 or -1 and reduces over nothing
    for (int64_t d : dims) wrap_dim(d, nd, op);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, nd, op));
  std::sort(out.begin(), out.end());
  HAP_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(), op,
            ": a dim appears twice in ", shape_str(dims));
  return out;
}

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    bool r = std::binary_search(dims.begin(), dims.end(), d);
    if (!r)
      out.push_back(s[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Metas infer_reduce(const Metas& in, const Attrs& a) {
  check_floating("reduction", in, 0);
  const ReduceAttrs& r = attr<ReduceAttrs>(a);
  auto dims = reduce_dims(in[0].shape, r.dims, "reduction");
  return {{reduced_shape(in[0].shape, dims, r.keepdim), in[0].dtype}};
}

// out[o, i] = sum_r x[o, r, i] after moving the reduced dims next to each other.
template <typename T>
HAP_MULTIVERSION void sum_kernel_clones(const Tensor& out, const Tensor& x_in,
                                        const std::vector<int64_t>& dims, double scale) {
  int64_t nd = x_in.dim();
  bool block = dims.empty() || dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  Tensor x;
  int64_t outer = 1, red = 1, inner = 1;
  if (block && !dims.empty()) {
    x = x_in.contiguous();
    for (int64_t d = 0; d < nd; ++d) {
      if (d < dims.front())
        outer *= x.shape()[d];
      else if (d > dims.back())
        inner *= x.shape()[d];
      else
        red *= x.shape()[d];
    }
  } else {
    // Permute reduced dims last, then reduce rows.
    std::vector<int64_t> perm;
    for (int64_t d = 0; d < nd; ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) perm.push_back(d);
    for (int64_t d : dims) perm.push_back(d);
    Shape ps;
    Strides pst;
    for (int64_t d : perm) {
      ps.push_back(x_in.shape()[d]);
      pst.push_back(x_in.strides()[d]);
    }
    x = x_in.as_strided(ps, pst, x_in.offset()).contiguous();
    for (int64_t d : dims) red *= x_in.shape()[d];
    outer = red == 0 ? out.numel() : x.numel() / std::max<int64_t>(red, 1);
  }
  const T* px = x.data<T>();
  T* py = out.data<T>();
  T s = static_cast<T>(scale);
  if (inner == 1) {
#pragma omp parallel for if (outer * red > cpu::kParallelGrain)
    for (int64_t o = 0; o < outer; ++o) {
      double acc = 0;
      const T* row = px + o * red;
      for (int64_t r = 0; r < red; ++r) acc += row[r];
      py[o] = static_cast<T>(acc) * s;
    }
    return;
  }
  // Accumulate in double as above: an f32 running sum over a long reduced dim (the batch dim of
  // a bias gradient) drifts by ~1e-4 relative at 1e5 terms. Work is split over (outer, column
  // block), so a reduction over the leading dim (outer == 1) still uses every core; each output
  // element is summed by one thread in r order, so the result does not depend on the threads.
  constexpr int64_t kBlock = 256;
  int64_t blocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) if (outer * red * inner > cpu::kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      int64_t lo = blk * kBlock, n = std::min(inner, lo + kBlock) - lo;
      double acc[kBlock] = {};
      for (int64_t r = 0; r < red; ++r) {
        const T* xr = px + (o * red + r) * inner + lo;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<double>(xr[i]);
      }
      T* yo = py + o * inner + lo;
      for (int64_t i = 0; i < n; ++i) yo[i] = static_cast<T>(acc[i]) * s;
    }
  }
}

template <typename T>
void sum_kernel(const Tensor& out, const Tensor& x_in, const std::vector<int64_t>& dims,
                double scale) {
  ::hap::cpu::clone_call (&sum_kernel_clones<T>)(out, x_in, dims, scale);
}

std::vector<Tensor> run_sum(const KernelContext& c, bool mean) {
  const Tensor& x = c.inputs[0];
  auto dims = reduce_dims(x.shape(), attr<ReduceAttrs>(c.attrs).dims, "reduction");
  int64_t count = 1;
  for (int64_t d : dims) count *= x.shape()[d];
  Tensor out = c.alloc(0);
  double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;
  HAP_CHECK(!mean || count > 0, "mean over ", shape_str(x.shape()), " reduces an empty dim");
  dispatch_float(out.dtype(), "sum",
                 [&](auto tag) { sum_kernel<decltype(tag)>(out, x, dims, scale); });
  return {out};
}

// Gradient of a reduction: broadcast g (reduced shape) back to the input shape.
Tensor expand_back(const Tensor& g, const Shape& in_shape, const std::vector<int64_t>& dims) {
  Shape keep = reduced_shape(in_shape, dims, true);
  Tensor k = call1(OpKind::Reshape, {g}, ShapeAttrs{keep});
  return call1(OpKind::Expand, {k}, ShapeAttrs{in_shape});
}

std::vector<ShardSignature> shard_reduce(const Metas& in, const Metas& out, const Attrs& a) {
  const ReduceAttrs& r = attr<ReduceAttrs>(a);
  auto dims = reduce_dims(in[0].shape, r.dims, "reduction");
  std::vector<ShardSignature> sigs;
  int64_t od = 0;
  for (int64_t d = 0; d < static_cast<int64_t>(in[0].shape.size()); ++d) {
    bool red = std::binary_search(dims.begin(), dims.end(), d);
    // Splitting a reduced dim leaves each rank a partial sum (a mean is rescaled by global counts).
    if (red)
      sigs.push_back({{Prop::sharded(d)}, {Prop::partial()}});
    else
      sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(od)}});
    if (!red || r.keepdim) ++od;
  }
  sigs.push_back({{Prop::partial()}, {Prop::partial()}});
  return sigs;
}

// ---- max / argmax along one dim ----
Metas infer_dim_reduce(const Metas& in, const Attrs& a, DType out_dtype, const char* op) {
  check_floating(op, in, 0);
  HAP_CHECK(!in[0].shape.empty(), op, ": input must have at least 1 dim, got a scalar");
  const DimAttrs& d = attr<DimAttrs>(a);
  int64_t dim = wrap_dim(d.dim, static_cast<int64_t>(in[0].shape.size()), op);
  HAP_CHECK(in[0].shape[dim] > 0, op, ": dim ", dim, " of ", shape_str(in[0].shape), " is empty");
  return {{reduced_shape(in[0].shape, {dim}, d.keepdim), out_dtype}};
}

template <typename T, typename F>
HAP_MULTIVERSION void argmax_rows_clones(const Tensor& x_in, int64_t dim, F emit) {
  Tensor x = x_in.contiguous();
  cpu::DimSplit s = cpu::split_at(x.shape(), dim);
  const T* px = x.data<T>();
#pragma omp parallel for if (x.numel() > cpu::kParallelGrain)
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      const T* p = px + o * s.n * s.inner + i;
      int64_t best = 0;
      T bv = p[0];
      for (int64_t r = 1; r < s.n; ++r) {
        T v = p[r * s.inner];
        if (v > bv || (v != v && bv == bv)) {  // NaN wins, as in PyTorch
          bv = v;
          best = r;
        }
      }
      emit(o * s.inner + i, best, bv);
    }
}

template <typename T, typename F>
void argmax_rows(const Tensor& x_in, int64_t dim, F emit) {
  ::hap::cpu::clone_call (&argmax_rows_clones<T, F>)(x_in, dim, emit);
}

std::vector<Tensor> index_backward_grads(const BackwardContext& c, const Tensor& g,
                                         const Tensor& idx, int64_t dim) {
  Tensor r = call1(OpKind::IndexBackward, {g, idx}, ScatterAttrs{dim, 0, c.inputs[0].shape()});
  return {r};
}

// out[i] = log sum_j exp(x[i, j]) over the last dim, stable; -inf for a row of no (or only
// -inf) entries: the log of an empty sum.
template <typename T>
HAP_MULTIVERSION void logsumexp_kernel_clones(const Tensor& x_in, const Tensor& out) {
  Tensor x = x_in.contiguous();
  const int64_t v = x.shape().back();
  const int64_t rows = v == 0 ? out.numel() : x.numel() / v;
  const T* px = x.data<T>();
  T* py = out.data<T>();
#pragma omp parallel for if (rows * v > cpu::kParallelGrain)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = px + i * v;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, xr[j]);
    if (mx == -std::numeric_limits<T>::infinity()) {
      py[i] = mx;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(xr[j] - mx));
    py[i] = static_cast<T>(static_cast<double>(mx) + std::log(sum));
  }
}

template <typename T>
void logsumexp_kernel(const Tensor& x_in, const Tensor& out) {
  ::hap::cpu::clone_call (&logsumexp_kernel_clones<T>)(x_in, out);
}

// A mean over a dimension split across ranks: each rank's sum of its shard over the global count,
// so that the Partial sum over ranks is the global mean (a rank whose shard is empty adds 0).
std::vector<Tensor> mean_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                               const Attrs& attrs) {
  const Prop q = ctx.input_prop(0);
  const Shape& s = ctx.input_shape(0);
  const auto dims = reduce_dims(s, attr<ReduceAttrs>(attrs).dims, "mean");
  if (q.kind != PropKind::Sharded || !std::binary_search(dims.begin(), dims.end(), q.dim))
    return {call1(OpKind::Mean, inputs, attrs)};
  int64_t count = 1;
  for (int64_t d : dims) count *= s[static_cast<size_t>(d)];
  Tensor sum = call1(OpKind::Sum, inputs, attrs);
  return {call1(OpKind::MulScalar, {sum}, ScalarAttrs{1.0 / static_cast<double>(count)})};
}

}  // namespace

void register_reduce_ops(OpTable& t) {
  for (OpKind k : {OpKind::Sum, OpKind::Mean}) {
    OpDef& d = def_of(t, k);
    d.autocast = Autocast::Float;  // mixed precision: sums (batch statistics, losses) in f32
    d.name = k == OpKind::Sum ? "sum" : "mean";
    d.num_inputs = 1;
    d.infer = infer_reduce;
    d.flops = [](const Metas& in, const Metas&, const Attrs&) {
      return static_cast<double>(shape_numel(in[0].shape));
    };
    d.shard = shard_reduce;
    if (k == OpKind::Mean) d.local = mean_local;
    d.cpu = k == OpKind::Sum ? [](const KernelContext& c) { return run_sum(c, false); }
                             : [](const KernelContext& c) { return run_sum(c, true); };
    d.input_metas_only = true;
    d.backward = [](const BackwardContext& c) {
      const Shape& s = c.inputs[0].shape();
      auto dims = reduce_dims(s, attr<ReduceAttrs>(c.attrs).dims, "reduction");
      Tensor g = expand_back(c.grad_outputs[0], s, dims);
      if (c.kind == OpKind::Mean) {
        int64_t count = 1;
        for (int64_t d : dims) count *= s[d];
        g = call1(OpKind::MulScalar, {g}, ScalarAttrs{1.0 / static_cast<double>(count)});
      }
      return std::vector<Tensor>{g};
    };
  }

  // LogSumExp over the last dim: [..., V] -> [...]. Rows split freely; the backward is the
  // softmax of the row times the incoming gradient.
  OpDef& ls = def_of(t, OpKind::LogSumExp);
  ls.autocast = Autocast::Float;
  ls.name = "logsumexp";
  ls.num_inputs = 1;
  ls.infer = [](const Metas& in, const Attrs&) {
    check_floating("logsumexp", in, 0);
    HAP_CHECK(!in[0].shape.empty(), "logsumexp: input must have at least 1 dim, got a scalar");
    return Metas{{Shape(in[0].shape.begin(), in[0].shape.end() - 1), in[0].dtype}};
  };
  ls.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 3.0 * static_cast<double>(shape_numel(in[0].shape));
  };
  ls.shard = [](const Metas& in, const Metas&, const Attrs&) {
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d + 1 < static_cast<int64_t>(in[0].shape.size()); ++d)
      sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(d)}});
    return sigs;
  };
  ls.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "logsumexp",
                   [&](auto tag) { logsumexp_kernel<decltype(tag)>(c.inputs[0], out); });
    return std::vector<Tensor>{out};
  };
  ls.backward = [](const BackwardContext& c) {
    const Tensor& x = c.inputs[0];
    Shape column = x.shape();
    column.back() = 1;
    Tensor p = call1(OpKind::Softmax, {x}, DimAttrs{-1, false});
    Tensor g = call1(OpKind::Reshape, {c.grad_outputs[0]}, ShapeAttrs{column});
    return std::vector<Tensor>{call1(OpKind::Mul, {p, g})};
  };

  OpDef& mx = def_of(t, OpKind::Max);
  mx.name = "max";
  mx.num_inputs = 1;
  mx.infer = [](const Metas& in, const Attrs& a) {
    return infer_dim_reduce(in, a, in[0].dtype, "max");
  };
  mx.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return static_cast<double>(shape_numel(in[0].shape));
  };
  mx.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    int64_t dim = wrap_dim(attr<DimAttrs>(c.attrs).dim, c.inputs[0].dim(), "max");
    dispatch_float(out.dtype(), "max", [&](auto tag) {
      using T = decltype(tag);
      T* py = out.data<T>();
      argmax_rows<T>(c.inputs[0], dim, [&](int64_t i, int64_t, T v) { py[i] = v; });
    });
    return std::vector<Tensor>{out};
  };
  mx.backward = [](const BackwardContext& c) {
    const DimAttrs& a = attr<DimAttrs>(c.attrs);
    Tensor idx = call1(OpKind::Argmax, {c.inputs[0]}, DimAttrs{a.dim, a.keepdim});
    int64_t dim = wrap_dim(a.dim, c.inputs[0].dim(), "max");
    Tensor g = c.grad_outputs[0];
    if (!a.keepdim) {
      Shape keep = reduced_shape(c.inputs[0].shape(), {dim}, true);
      g = call1(OpKind::Reshape, {g}, ShapeAttrs{keep});
      idx = call1(OpKind::Reshape, {idx}, ShapeAttrs{keep});
    }
    return index_backward_grads(c, g, idx, dim);
  };
  mx.shard = [](const Metas& in, const Metas&, const Attrs& a) {
    const DimAttrs& d = attr<DimAttrs>(a);
    int64_t nd = static_cast<int64_t>(in[0].shape.size());
    int64_t dim = wrap_dim(d.dim, nd, "max");
    std::vector<ShardSignature> sigs;
    for (int64_t i = 0, od = 0; i < nd; ++i) {
      if (i == dim) {
        if (d.keepdim) ++od;
        continue;
      }
      sigs.push_back({{Prop::sharded(i)}, {Prop::sharded(od++)}});
    }
    return sigs;
  };

  OpDef& am = def_of(t, OpKind::Argmax);
  am.name = "argmax";
  am.num_inputs = 1;
  am.infer = [](const Metas& in, const Attrs& a) {
    return infer_dim_reduce(in, a, DType::I64, "argmax");
  };
  am.shard = mx.shard;
  am.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    int64_t dim = wrap_dim(attr<DimAttrs>(c.attrs).dim, c.inputs[0].dim(), "argmax");
    int64_t* py = out.data<int64_t>();
    dispatch_float(c.inputs[0].dtype(), "argmax", [&](auto tag) {
      using T = decltype(tag);
      argmax_rows<T>(c.inputs[0], dim, [&](int64_t i, int64_t best, T) { py[i] = best; });
    });
    return std::vector<Tensor>{out};
  };

  OpDef& tk = def_of(t, OpKind::TopK);
  tk.name = "topk";
  tk.num_inputs = 1;
  tk.infer = [](const Metas& in, const Attrs& a) {
    check_floating("topk", in, 0);
    HAP_CHECK(!in[0].shape.empty(), "topk: input must have at least 1 dim, got a scalar");
    const TopKAttrs& k = attr<TopKAttrs>(a);
    int64_t dim = wrap_dim(k.dim, static_cast<int64_t>(in[0].shape.size()), "topk dim");
    HAP_CHECK(k.k >= 0 && k.k <= in[0].shape[dim], "topk: k = ", k.k, " is out of range for dim ",
              dim, " of size ", in[0].shape[dim], " (expected 0 <= k <= ", in[0].shape[dim], ")");
    Shape s = in[0].shape;
    s[dim] = k.k;
    return Metas{{s, in[0].dtype}, {s, DType::I64}};
  };
  tk.cpu = [](const KernelContext& c) {
    const TopKAttrs& a = attr<TopKAttrs>(c.attrs);
    Tensor x = c.inputs[0].contiguous();
    int64_t dim = wrap_dim(a.dim, x.dim(), "topk dim");
    Tensor vals = c.alloc(0), idx = c.alloc(1);
    cpu::DimSplit s = cpu::split_at(x.shape(), dim);
    int64_t k = a.k;
    dispatch_float(x.dtype(), "topk", [&](auto tag) {
      using T = decltype(tag);
      const T* px = x.data<T>();
      T* pv = vals.data<T>();
      int64_t* pi = idx.data<int64_t>();
#pragma omp parallel for if (x.numel() > cpu::kParallelGrain)
      for (int64_t o = 0; o < s.outer; ++o) {
        std::vector<int64_t> order(s.n);
        for (int64_t i = 0; i < s.inner; ++i) {
          const T* p = px + o * s.n * s.inner + i;
          std::iota(order.begin(), order.end(), 0);
          // NaN ranks above every number, as in argmax (and PyTorch); NaNs tie with each other.
          // Without this the comparator is not a strict weak order and the sort is undefined.
          auto above = [](T x, T y) { return x > y || (x != x && y == y); };
          const bool largest = a.largest;  // (clang 14 cannot capture `a` through the loop)
          auto cmp = [&](int64_t l, int64_t r) {
            T vl = p[l * s.inner], vr = p[r * s.inner];
            if (above(vl, vr)) return largest;
            if (above(vr, vl)) return !largest;
            return l < r;  // ties keep index order: deterministic
          };
          std::partial_sort(order.begin(), order.begin() + k, order.end(), cmp);
          for (int64_t j = 0; j < k; ++j) {
            int64_t off = (o * k + j) * s.inner + i;
            pv[off] = p[order[j] * s.inner];
            pi[off] = order[j];
          }
        }
      }
    });
    return std::vector<Tensor>{vals, idx};
  };
  // Any dim but the one searched may be split: each shard's rows are searched alone.
  tk.shard = [](const Metas& in, const Metas&, const Attrs& a) {
    const int64_t nd = static_cast<int64_t>(in[0].shape.size());
    const int64_t dim = wrap_dim(attr<TopKAttrs>(a).dim, nd, "topk dim");
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d < nd; ++d)
      if (d != dim) sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(d), Prop::sharded(d)}});
    return sigs;
  };
  tk.saves_outputs = true;
  tk.backward = [](const BackwardContext& c) {
    int64_t dim = wrap_dim(attr<TopKAttrs>(c.attrs).dim, c.inputs[0].dim(), "topk dim");
    return index_backward_grads(c, c.grad_outputs[0], c.outputs[1], dim);
  };

  // IndexBackward(g, idx): zeros of attrs.shape with g scattered (added) at idx along dim.
  OpDef& ib = def_of(t, OpKind::IndexBackward);
  ib.name = "index_backward";
  ib.num_inputs = 2;
  ib.infer = [](const Metas& in, const Attrs& a) {
    HAP_CHECK(in[1].dtype == DType::I64, "index_backward: indices must be i64");
    return Metas{{attr<ScatterAttrs>(a).shape, in[0].dtype}};
  };
  // Any dim but the scatter dim may be split (gradient and indices alike); a shard scatters into
  // its own part of the input's shape (the local hook narrows attrs.shape).
  ib.shard = [](const Metas& in, const Metas&, const Attrs& a) {
    const ScatterAttrs& s = attr<ScatterAttrs>(a);
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d < static_cast<int64_t>(in[0].shape.size()); ++d)
      if (d != s.dim) sigs.push_back({{Prop::sharded(d), Prop::sharded(d)}, {Prop::sharded(d)}});
    return sigs;
  };
  ib.local = [](ShardContext& ctx, const std::vector<Tensor>& inputs, const Attrs& attrs) {
    ScatterAttrs a = attr<ScatterAttrs>(attrs);
    const Prop out = ctx.output_prop(0);
    if (out.kind == PropKind::Sharded)
      a.shape[static_cast<size_t>(out.dim)] = inputs[0].size(out.dim);
    return std::vector<Tensor>{call1(OpKind::IndexBackward, inputs, a)};
  };
  ib.cpu = [](const KernelContext& c) {
    const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
    Tensor out = c.alloc(0);
    out.zero_();
    Tensor g = c.inputs[0].contiguous(), idx = c.inputs[1].contiguous();
    cpu::DimSplit so = cpu::split_at(a.shape, a.dim), sg = cpu::split_at(g.shape(), a.dim);
    dispatch_float(out.dtype(), "index_backward", [&](auto tag) {
      using T = decltype(tag);
      const T* pg = g.data<T>();
      const int64_t* pi = idx.data<int64_t>();
      T* py = out.data<T>();
      for (int64_t o = 0; o < sg.outer; ++o)
        for (int64_t j = 0; j < sg.n; ++j)
          for (int64_t i = 0; i < sg.inner; ++i) {
            int64_t src = (o * sg.n + j) * sg.inner + i;
            int64_t r = pi[src];
            HAP_ASSERT(r >= 0 && r < so.n, "index out of range in index_backward");
            py[(o * so.n + r) * so.inner + i] += pg[src];
          }
    });
    return std::vector<Tensor>{out};
  };
}

}  // namespace hap::ops
