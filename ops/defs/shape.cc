// Shape ops: reshape, permute, slice, expand (views where the layout allows), concat, split,
// contiguous, and the scatter that slicing's backward uses.
#include <numeric>

#include "ops/cpu/loops.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

Shape infer_reshape_shape(const Shape& in, Shape out) {
  int64_t n = shape_numel(in), known = 1, infer_at = -1;
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    if (out[i] == -1) {
      HAP_CHECK(infer_at < 0, "reshape: only one dim can be -1, got ", shape_str(out));
      infer_at = i;
    } else {
      HAP_CHECK(out[i] >= 0, "reshape: invalid size ", out[i], " in ", shape_str(out));
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    HAP_CHECK(known > 0 && n % known == 0, "reshape: cannot reshape ", shape_str(in), " (", n,
              " elements) into ", shape_str(out));
    out[infer_at] = n / known;
  }
  HAP_CHECK(shape_numel(out) == n, "reshape: cannot reshape ", shape_str(in), " (", n,
            " elements) into ", shape_str(out), " (", shape_numel(out), " elements)");
  return out;
}

// Strides that view `t` as `shape` without copying, if its layout allows (as PyTorch's view).
bool view_strides(const Tensor& t, const Shape& shape, Strides& out) {
  if (t.is_contiguous()) {
    out = contiguous_strides(shape);
    return true;
  }
  const Shape& os = t.shape();
  const Strides& ost = t.strides();
  out.assign(shape.size(), 0);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = ost.empty() ? 1 : ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(os.size()) - 1; d >= 0; --d) {
    tensor_numel *= os[d];
    if (d == 0 || (os[d - 1] != 1 && ost[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = ost[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

// Reshape keeps Sharded(d) where dim d survives with the same prefix of elements before it,
// or where it becomes the leading part of a merged dim.
std::vector<ShardSignature> shard_reshape(const Metas& in, const Metas& out, const Attrs&) {
  std::vector<ShardSignature> sigs;
  const Shape &a = in[0].shape, &b = out[0].shape;
  int64_t pa = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(a.size()); ++d) {
    int64_t pb = 1;
    for (int64_t e = 0; e < static_cast<int64_t>(b.size()); ++e) {
      if (pa == pb && a[d] > 1 && b[e] % a[d] == 0) {
        int64_t rest_a = shape_numel(a) / (pa * a[d]);
        int64_t rest_b = shape_numel(b) / (pb * b[e]);
        if (b[e] / a[d] == rest_a / rest_b || b[e] == a[d])
          sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(e)}});
        break;
      }
      // A sharded dim split into consecutive output dims ([B, T, C] -> [B, T, H, D]): its shards
      // become shards of the outer one, in whole multiples of the inner size (the heads of a
      // width; synth/shard_layout.cc sizes them so).
      if (pa == pb && a[d] > 1 && b[e] > 1 && a[d] % b[e] == 0) {
        int64_t prod = b[e];
        for (size_t f = static_cast<size_t>(e) + 1; prod < a[d] && f < b.size(); ++f) prod *= b[f];
        if (prod == a[d]) sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(e)}});
        break;
      }
      pb *= b[e];
      if (pb > pa) break;
    }
    pa *= a[d];
  }
  sigs.push_back({{Prop::partial()}, {Prop::partial()}});
  return sigs;
}

std::vector<int64_t> checked_perm(const std::vector<int64_t>& perm, int64_t nd) {
  HAP_CHECK(static_cast<int64_t>(perm.size()) == nd, "permute: ", perm.size(),
            " dims given for a tensor with ", nd, " dims");
  std::vector<int64_t> p(nd);
  std::vector<bool> seen(nd, false);
  for (int64_t i = 0; i < nd; ++i) {
    p[i] = wrap_dim(perm[i], nd, "permute dim");
    HAP_CHECK(!seen[p[i]], "permute: dim ", p[i], " appears twice in ", shape_str(perm));
    seen[p[i]] = true;
  }
  return p;
}

void check_slice(const Shape& s, SliceAttrs& a) {
  int64_t nd = static_cast<int64_t>(s.size());
  HAP_CHECK(nd > 0, "slice: input must have at least 1 dim, got a scalar");
  a.dim = wrap_dim(a.dim, nd, "slice dim");
  int64_t n = s[a.dim];
  if (a.start < 0) a.start += n;
  if (a.end < 0) a.end += n;
  HAP_CHECK(a.start >= 0 && a.start <= a.end && a.end <= n, "slice: range [", a.start, ", ", a.end,
            ") is out of bounds for dim ", a.dim, " of size ", n, " in ", shape_str(s));
}

Tensor copy_into_slice(const Tensor& dst, const Tensor& src, int64_t dim, int64_t start) {
  Strides st = dst.strides();
  Tensor view = dst.as_strided(src.shape(), st, dst.offset() + start * st[dim]);
  view.copy_from(src);  // on any device
  return dst;
}

// A reshape on a shard: the sharded output dim holds whatever the local input has left after
// the output's other (whole) dims.
std::vector<Tensor> reshape_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                  const Attrs&) {
  Shape target = ctx.output_shape(0);
  const Prop o = ctx.output_prop(0);
  if (o.kind == PropKind::Sharded) {
    const size_t d = static_cast<size_t>(o.dim);
    const int64_t rest = shape_numel(target) / std::max<int64_t>(target[d], 1);
    target[d] = rest > 0 ? inputs[0].numel() / rest : 0;
  }
  return {call1(OpKind::Reshape, inputs, ShapeAttrs{target})};
}

// An expand to a sharded output: the shard's length of that dim.
std::vector<Tensor> expand_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                 const Attrs&) {
  Shape target = ctx.output_shape(0);
  const Prop o = ctx.output_prop(0);
  if (o.kind == PropKind::Sharded)
    target[static_cast<size_t>(o.dim)] = ctx.output_lengths(0)[static_cast<size_t>(ctx.rank())];
  return {call1(OpKind::Expand, inputs, ShapeAttrs{target})};
}

}  // namespace

void register_shape_ops(OpTable& t) {
  OpDef& rs = def_of(t, OpKind::Reshape);
  rs.moves_data = true;
  rs.any_device = true;
  rs.name = "reshape";
  rs.num_inputs = 1;
  rs.infer = [](const Metas& in, const Attrs& a) {
    return Metas{{infer_reshape_shape(in[0].shape, attr<ShapeAttrs>(a).shape), in[0].dtype}};
  };
  rs.shard = shard_reshape;
  rs.local = reshape_local;
  rs.cpu = [](const KernelContext& c) {
    const Tensor& x = c.inputs[0];
    const Shape& s = c.out_meta[0].shape;
    Strides st;
    if (x.has_storage() && view_strides(x, s, st))
      return std::vector<Tensor>{x.as_strided(s, st, x.offset())};
    Tensor xc = x.contiguous();
    return std::vector<Tensor>{xc.as_strided(s, contiguous_strides(s), xc.offset())};
  };
  rs.input_metas_only = true;
  rs.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::Reshape, {c.grad_outputs[0]}, ShapeAttrs{c.inputs[0].shape()})};
  };

  OpDef& pm = def_of(t, OpKind::Permute);
  pm.moves_data = true;
  pm.any_device = true;
  pm.name = "permute";
  pm.num_inputs = 1;
  pm.infer = [](const Metas& in, const Attrs& a) {
    auto p = checked_perm(attr<PermuteAttrs>(a).perm, static_cast<int64_t>(in[0].shape.size()));
    Shape s;
    for (int64_t d : p) s.push_back(in[0].shape[d]);
    return Metas{{s, in[0].dtype}};
  };
  pm.shard = [](const Metas& in, const Metas&, const Attrs& a) {
    auto p = checked_perm(attr<PermuteAttrs>(a).perm, static_cast<int64_t>(in[0].shape.size()));
    std::vector<ShardSignature> sigs;
    for (int64_t i = 0; i < static_cast<int64_t>(p.size()); ++i)
      sigs.push_back({{Prop::sharded(p[i])}, {Prop::sharded(i)}});
    sigs.push_back({{Prop::partial()}, {Prop::partial()}});
    return sigs;
  };
  pm.saves_inputs = false;
  pm.cpu = [](const KernelContext& c) {
    const Tensor& x = c.inputs[0];
    auto p = checked_perm(attr<PermuteAttrs>(c.attrs).perm, x.dim());
    Shape s;
    Strides st;
    for (int64_t d : p) {
      s.push_back(x.shape()[d]);
      st.push_back(x.strides()[d]);
    }
    return std::vector<Tensor>{x.as_strided(s, st, x.offset())};
  };
  pm.backward = [](const BackwardContext& c) {
    const auto& perm = attr<PermuteAttrs>(c.attrs).perm;
    int64_t nd = static_cast<int64_t>(perm.size());
    auto p = checked_perm(perm, nd);
    std::vector<int64_t> inv(nd);
    for (int64_t i = 0; i < nd; ++i) inv[p[i]] = i;
    return std::vector<Tensor>{call1(OpKind::Permute, {c.grad_outputs[0]}, PermuteAttrs{inv})};
  };

  OpDef& sl = def_of(t, OpKind::Slice);
  sl.moves_data = true;
  sl.any_device = true;
  sl.name = "slice";
  sl.num_inputs = 1;
  sl.infer = [](const Metas& in, const Attrs& a) {
    SliceAttrs s = attr<SliceAttrs>(a);
    check_slice(in[0].shape, s);
    Shape out = in[0].shape;
    out[s.dim] = s.end - s.start;
    return Metas{{out, in[0].dtype}};
  };
  sl.shard = [](const Metas& in, const Metas&, const Attrs& a) {
    SliceAttrs s = attr<SliceAttrs>(a);
    check_slice(in[0].shape, s);
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d < static_cast<int64_t>(in[0].shape.size()); ++d)
      if (d != s.dim) sigs.push_back({{Prop::sharded(d)}, {Prop::sharded(d)}});
    sigs.push_back({{Prop::partial()}, {Prop::partial()}});
    return sigs;
  };
  sl.cpu = [](const KernelContext& c) {
    const Tensor& x = c.inputs[0];
    SliceAttrs s = attr<SliceAttrs>(c.attrs);
    check_slice(x.shape(), s);
    return std::vector<Tensor>{
        x.as_strided(c.out_meta[0].shape, x.strides(), x.offset() + s.start * x.strides()[s.dim])};
  };
  sl.input_metas_only = true;
  sl.backward = [](const BackwardContext& c) {
    SliceAttrs s = attr<SliceAttrs>(c.attrs);
    check_slice(c.inputs[0].shape(), s);
    return std::vector<Tensor>{call1(OpKind::SliceBackward, {c.grad_outputs[0]},
                                     ScatterAttrs{s.dim, s.start, c.inputs[0].shape()})};
  };

  OpDef& sb = def_of(t, OpKind::SliceBackward);
  sb.moves_data = true;
  sb.any_device = true;
  sb.name = "slice_backward";
  sb.num_inputs = 1;
  sb.infer = [](const Metas& in, const Attrs& a) {
    return Metas{{attr<ScatterAttrs>(a).shape, in[0].dtype}};
  };
  sb.cpu = [](const KernelContext& c) {
    const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
    Tensor out = c.alloc(0);
    out.zero_();
    copy_into_slice(out, c.inputs[0], a.dim, a.start);
    return std::vector<Tensor>{out};
  };
  sb.input_metas_only = true;
  sb.backward = [](const BackwardContext& c) {
    const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
    return std::vector<Tensor>{
        call1(OpKind::Slice, {c.grad_outputs[0]},
              SliceAttrs{a.dim, a.start, a.start + c.inputs[0].shape()[a.dim]})};
  };

  OpDef& ex = def_of(t, OpKind::Expand);
  ex.moves_data = true;
  ex.any_device = true;
  ex.name = "expand";
  ex.num_inputs = 1;
  ex.infer = [](const Metas& in, const Attrs& a) {
    const Shape& target = attr<ShapeAttrs>(a).shape;
    const Shape& s = in[0].shape;
    HAP_CHECK(target.size() >= s.size(), "expand: cannot expand ", shape_str(s), " to ",
              shape_str(target), " (fewer dims)");
    Shape out = target;
    for (size_t i = 0; i < s.size(); ++i) {
      size_t o = target.size() - s.size() + i;
      if (target[o] == -1) out[o] = s[i];
      HAP_CHECK(s[i] == out[o] || s[i] == 1, "expand: cannot expand ", shape_str(s), " to ",
                shape_str(target), " (dim ", o, ": ", s[i], " vs ", target[o], ")");
    }
    // -1 keeps an existing dim; any other negative size (or -1 on a new leading dim) is invalid.
    for (size_t o = 0; o < out.size(); ++o)
      HAP_CHECK(out[o] >= 0, "expand: invalid size ", target[o], " at dim ", o, " of ",
                shape_str(target), " (expanding ", shape_str(s), ")");
    return Metas{{out, in[0].dtype}};
  };
  ex.shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return elementwise_signatures(in, out, {0});
  };
  ex.local = expand_local;
  ex.cpu = [](const KernelContext& c) {
    const Tensor& x = c.inputs[0];
    const Shape& s = c.out_meta[0].shape;
    return std::vector<Tensor>{x.as_strided(s, cpu::broadcast_strides(x, s), x.offset())};
  };
  ex.input_metas_only = true;
  ex.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{sum_to(c.grad_outputs[0], c.inputs[0].shape())};
  };

  OpDef& ct = def_of(t, OpKind::Contiguous);
  ct.moves_data = true;
  ct.any_device = true;
  ct.name = "contiguous";
  ct.num_inputs = 1;
  ct.infer = [](const Metas& in, const Attrs&) { return Metas{in[0]}; };
  ct.shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return elementwise_signatures(in, out, {0});
  };
  ct.saves_inputs = false;
  ct.cpu = [](const KernelContext& c) { return std::vector<Tensor>{c.inputs[0].clone()}; };
  ct.backward = [](const BackwardContext& c) { return std::vector<Tensor>{c.grad_outputs[0]}; };

  OpDef& cc = def_of(t, OpKind::Concat);
  cc.moves_data = true;
  cc.any_device = true;
  cc.name = "concat";
  cc.num_inputs = -1;
  cc.infer = [](const Metas& in, const Attrs& a) {
    const Shape& s0 = in[0].shape;
    HAP_CHECK(!s0.empty(), "concat: inputs must have at least 1 dim, got a scalar");
    int64_t dim = wrap_dim(attr<DimAttrs>(a).dim, static_cast<int64_t>(s0.size()), "concat dim");
    Shape out = s0;
    out[dim] = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      HAP_CHECK(in[i].dtype == in[0].dtype, "concat: input ", i, " has dtype ",
                dtype_name(in[i].dtype), ", input 0 has ", dtype_name(in[0].dtype));
      HAP_CHECK(in[i].shape.size() == s0.size(), "concat: input ", i, " ", shape_str(in[i].shape),
                " and input 0 ", shape_str(s0), " differ in rank");
      for (size_t d = 0; d < s0.size(); ++d)
        HAP_CHECK(static_cast<int64_t>(d) == dim || in[i].shape[d] == s0[d], "concat: input ", i,
                  " ", shape_str(in[i].shape), " and input 0 ", shape_str(s0), " differ in dim ",
                  d);
      out[dim] += in[i].shape[dim];
    }
    return Metas{{out, in[0].dtype}};
  };
  cc.shard = [](const Metas& in, const Metas& out, const Attrs& a) {
    int64_t nd = static_cast<int64_t>(out[0].shape.size());
    int64_t dim = wrap_dim(attr<DimAttrs>(a).dim, nd, "concat dim");
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d < nd; ++d)
      if (d != dim)
        sigs.push_back({std::vector<Prop>(in.size(), Prop::sharded(d)), {Prop::sharded(d)}});
    sigs.push_back({std::vector<Prop>(in.size(), Prop::partial()), {Prop::partial()}});
    return sigs;
  };
  cc.saves_inputs = true;
  cc.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    int64_t dim = wrap_dim(attr<DimAttrs>(c.attrs).dim, out.dim(), "concat dim");
    int64_t start = 0;
    for (const Tensor& x : c.inputs) {
      copy_into_slice(out, x, dim, start);
      start += x.shape()[dim];
    }
    return std::vector<Tensor>{out};
  };
  cc.input_metas_only = true;
  cc.backward = [](const BackwardContext& c) {
    int64_t dim = wrap_dim(attr<DimAttrs>(c.attrs).dim, c.inputs[0].dim(), "concat dim");
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      int64_t n = c.inputs[i].shape()[dim];
      grads.push_back(c.needs_input_grad[i] ? call1(OpKind::Slice, {c.grad_outputs[0]},
                                                    SliceAttrs{dim, start, start + n})
                                            : Tensor());
      start += n;
    }
    return grads;
  };

  OpDef& sp = def_of(t, OpKind::Split);
  sp.moves_data = true;
  sp.any_device = true;
  sp.name = "split";
  sp.num_inputs = 1;
  sp.infer = [](const Metas& in, const Attrs& a) {
    const SplitAttrs& s = attr<SplitAttrs>(a);
    HAP_CHECK(!in[0].shape.empty(), "split: input must have at least 1 dim, got a scalar");
    int64_t dim = wrap_dim(s.dim, static_cast<int64_t>(in[0].shape.size()), "split dim");
    int64_t total = 0;
    Metas out;
    for (int64_t n : s.sizes) {
      HAP_CHECK(n >= 0, "split: negative size ", n, " in ", shape_str(s.sizes));
      total += n;
      Shape o = in[0].shape;
      o[dim] = n;
      out.push_back({o, in[0].dtype});
    }
    HAP_CHECK(total == in[0].shape[dim], "split: sizes ", shape_str(s.sizes), " sum to ", total,
              " but dim ", dim, " of ", shape_str(in[0].shape), " has size ", in[0].shape[dim]);
    return out;
  };
  sp.shard = [](const Metas& in, const Metas& out, const Attrs& a) {
    int64_t nd = static_cast<int64_t>(in[0].shape.size());
    int64_t dim = wrap_dim(attr<SplitAttrs>(a).dim, nd, "split dim");
    std::vector<ShardSignature> sigs;
    for (int64_t d = 0; d < nd; ++d)
      if (d != dim)
        sigs.push_back({{Prop::sharded(d)}, std::vector<Prop>(out.size(), Prop::sharded(d))});
    sigs.push_back({{Prop::partial()}, std::vector<Prop>(out.size(), Prop::partial())});
    return sigs;
  };
  sp.cpu = [](const KernelContext& c) {
    const Tensor& x = c.inputs[0];
    int64_t dim = wrap_dim(attr<SplitAttrs>(c.attrs).dim, x.dim(), "split dim");
    std::vector<Tensor> outs;
    int64_t start = 0;
    for (const TensorMeta& m : c.out_meta) {
      outs.push_back(x.as_strided(m.shape, x.strides(), x.offset() + start * x.strides()[dim]));
      start += m.shape[dim];
    }
    return outs;
  };
  sp.input_metas_only = true;
  sp.backward = [](const BackwardContext& c) {
    const Tensor& x = c.inputs[0];
    int64_t dim = wrap_dim(attr<SplitAttrs>(c.attrs).dim, x.dim(), "split dim");
    const auto& sizes = attr<SplitAttrs>(c.attrs).sizes;
    std::vector<Tensor> parts;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor g = c.grad_outputs[i];
      if (!g.defined()) {
        Shape s = x.shape();
        s[dim] = sizes[i];
        g = Tensor::zeros(s, TensorOptions{}.with_dtype(x.dtype()).with_device(x.device()));
      }
      parts.push_back(g);
    }
    return std::vector<Tensor>{call1(OpKind::Concat, parts, DimAttrs{dim, false})};
  };
}

}  // namespace hap::ops
