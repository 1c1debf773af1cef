// Mixture-of-experts routing (GShard's dispatch and combine over routing groups):
//   moe_dispatch(x [G, T, C], idx i64 [G, T, k], w [G, T, k] or none) -> buf [G, E, cap, C]
//   moe_combine(buf [G, E, cap, C], idx, gates [G, T, k] or none) -> y [G, T, C]
//   moe_gate_grad(a [G, T, C], buf [G, E, cap, C], idx) -> [G, T, k]
// Group g (a sequence) routes its T tokens alone: token t's j-th choice idx[g, t, j] takes the
// next free slot of that expert's cap slots in group g, first choices of every token before any
// second choice, each in token order; a choice past the capacity is dropped (no slot, nothing
// combined back: the residual passes the token through). dispatch puts w[g, t, j] x[g, t] (x when
// w is absent) in the slot; combine sums gates[g, t, j] buf[g, e, slot] over the token's kept
// choices; gate_grad gives <a[g, t], buf[g, e, slot]> per choice (0 when dropped). The slots depend
// only on the group's own choices, so groups split over ranks route exactly as on one device.
#include <algorithm>
#include <vector>

#include "ops/cpu/loops.h"
#include "ops/defs/common.h"

namespace hap::ops {

std::vector<int64_t> moe_assign_slots(const char* op, const Tensor& idx, int64_t experts,
                                      int64_t capacity) {
  Tensor ids = idx.to(Device::cpu()).contiguous();
  const int64_t G = ids.size(0), T = ids.size(1), k = ids.size(2);
  const int64_t* p = ids.data<int64_t>();
  std::vector<int64_t> slot(static_cast<size_t>(G * T * k), -1);
  std::vector<int64_t> used(static_cast<size_t>(experts));
  for (int64_t g = 0; g < G; ++g) {
    std::fill(used.begin(), used.end(), 0);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t at = (g * T + t) * k + j, e = p[at];
        HAP_CHECK(e >= 0 && e < experts, op, ": expert id ", e, " at [", g, ", ", t, ", ", j,
                  "] is outside [0, ", experts, ")");
        if (used[static_cast<size_t>(e)] < capacity)
          slot[static_cast<size_t>(at)] = used[static_cast<size_t>(e)]++;
      }
  }
  return slot;
}

namespace {

void check_routing(const char* op, const TensorMeta& idx, const Shape& tokens, const Attrs& attrs,
                   const TensorMeta* weights) {
  const MoeAttrs& a = attr<MoeAttrs>(attrs);
  HAP_CHECK(a.experts >= 1 && a.capacity >= 1, op, ": experts and capacity must be >= 1, got ",
            a.experts, " and ", a.capacity);
  HAP_CHECK(idx.dtype == DType::I64 && idx.shape.size() == 3 && tokens.size() == 3 &&
                idx.shape[0] == tokens[0] && idx.shape[1] == tokens[1],
            op, ": expert ids must be i64 [G, T, k] for tokens ", shape_str(tokens), ", got ",
            dtype_name(idx.dtype), " ", shape_str(idx.shape));
  if (weights != nullptr && !weights->shape.empty())
    HAP_CHECK(weights->shape == idx.shape, op, ": gate weights ", shape_str(weights->shape),
              " must match the expert ids ", shape_str(idx.shape));
}

Metas infer_dispatch(const Metas& in, const Attrs& attrs) {
  const MoeAttrs& a = attr<MoeAttrs>(attrs);
  check_floating("moe_dispatch", in, 0);
  HAP_CHECK(in[0].shape.size() == 3, "moe_dispatch: tokens must be [G, T, C], got ",
            shape_str(in[0].shape));
  const bool weighted = in.size() > 2 && in[2].defined;
  check_routing("moe_dispatch", in[1], in[0].shape, attrs, weighted ? &in[2] : nullptr);
  if (weighted) check_same_dtype("moe_dispatch", in, 0, 2);
  const Shape& x = in[0].shape;
  return Metas{{Shape{x[0], a.experts, a.capacity, x[2]}, in[0].dtype}};
}

Metas infer_combine(const Metas& in, const Attrs& attrs) {
  const MoeAttrs& a = attr<MoeAttrs>(attrs);
  check_floating("moe_combine", in, 0);
  const Shape& b = in[0].shape;
  HAP_CHECK(b.size() == 4 && b[1] == a.experts && b[2] == a.capacity,
            "moe_combine: expert buffers must be [G, ", a.experts, ", ", a.capacity, ", C], got ",
            shape_str(b));
  HAP_CHECK(in[1].shape.size() == 3, "moe_combine: expert ids must be i64 [G, T, k], got ",
            shape_str(in[1].shape));
  const Shape tokens = {b[0], in[1].shape[1], b[3]};
  const bool weighted = in.size() > 2 && in[2].defined;
  check_routing("moe_combine", in[1], tokens, attrs, weighted ? &in[2] : nullptr);
  if (weighted) check_same_dtype("moe_combine", in, 0, 2);
  return Metas{{tokens, in[0].dtype}};
}

Metas infer_gate_grad(const Metas& in, const Attrs& attrs) {
  const MoeAttrs& a = attr<MoeAttrs>(attrs);
  check_floating("moe_gate_grad", in, 0);
  check_same_dtype("moe_gate_grad", in, 0, 1);
  const Shape &x = in[0].shape, &b = in[1].shape;
  HAP_CHECK(x.size() == 3 && b.size() == 4 && b[0] == x[0] && b[1] == a.experts &&
                b[2] == a.capacity && b[3] == x[2],
            "moe_gate_grad: tokens ", shape_str(x), " and buffers ", shape_str(b),
            " do not match (expected [G, T, C] and [G, ", a.experts, ", ", a.capacity, ", C])");
  check_routing("moe_gate_grad", in[2], x, attrs, nullptr);
  return Metas{{in[2].shape, in[0].dtype}};
}

// Sharding: whole groups (dim 0 everywhere), or the feature dim (C) with the routing replicated;
// dispatch and combine are linear in their first input, so a Partial one gives a Partial result.
std::vector<ShardSignature> shard_dispatch(const Metas&, const Metas&, const Attrs&) {
  const Prop R = Prop::replicated(), S0 = Prop::sharded(0);
  return {{{S0, S0, S0}, {S0}},
          {{Prop::sharded(2), R, R}, {Prop::sharded(3)}},
          {{Prop::partial(), R, R}, {Prop::partial()}}};
}
std::vector<ShardSignature> shard_combine(const Metas&, const Metas&, const Attrs&) {
  const Prop R = Prop::replicated(), S0 = Prop::sharded(0);
  return {{{S0, S0, S0}, {S0}},
          {{Prop::sharded(3), R, R}, {Prop::sharded(2)}},
          {{Prop::partial(), R, R}, {Prop::partial()}}};
}
std::vector<ShardSignature> shard_gate_grad(const Metas&, const Metas&, const Attrs&) {
  const Prop S0 = Prop::sharded(0);
  return {{{S0, S0, S0}, {S0}},
          {{Prop::sharded(2), Prop::sharded(3), Prop::replicated()}, {Prop::partial()}}};
}

template <typename T>
T weight_at(const T* w, int64_t at) {
  return w != nullptr ? w[at] : static_cast<T>(1);
}

std::vector<Tensor> dispatch_cpu(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  Tensor x = c.inputs[0].contiguous();
  const bool weighted = c.inputs.size() > 2 && c.inputs[2].defined();
  Tensor w = weighted ? c.inputs[2].contiguous() : Tensor();
  const std::vector<int64_t> slot =
      moe_assign_slots("moe_dispatch", c.inputs[1], a.experts, a.capacity);
  const int64_t G = x.size(0), T = x.size(1), C = x.size(2), k = c.inputs[1].size(2);
  Tensor out = c.alloc(0);
  out.zero_();
  Tensor ids = c.inputs[1].contiguous();
  const int64_t* pi = ids.data<int64_t>();
  dispatch_float(x.dtype(), "moe_dispatch", [&](auto tag) {
    using V = decltype(tag);
    const V* px = x.data<V>();
    const V* pw = weighted ? w.data<V>() : nullptr;
    V* po = out.data<V>();
#pragma omp parallel for if (G * T * C > cpu::kParallelGrain)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at = (g * T + t) * k + j, s = slot[static_cast<size_t>(at)];
          if (s < 0) continue;
          const V f = weight_at(pw, at);
          V* dst = po + ((g * a.experts + pi[at]) * a.capacity + s) * C;
          const V* src = px + (g * T + t) * C;
          for (int64_t i = 0; i < C; ++i) dst[i] = f * src[i];
        }
  });
  return {out};
}

std::vector<Tensor> combine_cpu(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  Tensor buf = c.inputs[0].contiguous();
  const bool weighted = c.inputs.size() > 2 && c.inputs[2].defined();
  Tensor w = weighted ? c.inputs[2].contiguous() : Tensor();
  const std::vector<int64_t> slot =
      moe_assign_slots("moe_combine", c.inputs[1], a.experts, a.capacity);
  Tensor ids = c.inputs[1].contiguous();
  const int64_t G = buf.size(0), C = buf.size(3), T = ids.size(1), k = ids.size(2);
  const int64_t* pi = ids.data<int64_t>();
  Tensor out = c.alloc(0);
  dispatch_float(buf.dtype(), "moe_combine", [&](auto tag) {
    using V = decltype(tag);
    const V* pb = buf.data<V>();
    const V* pw = weighted ? w.data<V>() : nullptr;
    V* po = out.data<V>();
#pragma omp parallel for if (G * T * C > cpu::kParallelGrain)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t) {
        V* dst = po + (g * T + t) * C;
        std::fill(dst, dst + C, static_cast<V>(0));
        for (int64_t j = 0; j < k; ++j) {  // in choice order: a fixed summation order
          const int64_t at = (g * T + t) * k + j, s = slot[static_cast<size_t>(at)];
          if (s < 0) continue;
          const V f = weight_at(pw, at);
          const V* src = pb + ((g * a.experts + pi[at]) * a.capacity + s) * C;
          for (int64_t i = 0; i < C; ++i) dst[i] += f * src[i];
        }
      }
  });
  return {out};
}

std::vector<Tensor> gate_grad_cpu(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  Tensor x = c.inputs[0].contiguous(), buf = c.inputs[1].contiguous();
  const std::vector<int64_t> slot =
      moe_assign_slots("moe_gate_grad", c.inputs[2], a.experts, a.capacity);
  Tensor ids = c.inputs[2].contiguous();
  const int64_t G = x.size(0), T = x.size(1), C = x.size(2), k = ids.size(2);
  const int64_t* pi = ids.data<int64_t>();
  Tensor out = c.alloc(0);
  dispatch_float(x.dtype(), "moe_gate_grad", [&](auto tag) {
    using V = decltype(tag);
    const V* px = x.data<V>();
    const V* pb = buf.data<V>();
    V* po = out.data<V>();
#pragma omp parallel for if (G * T * C > cpu::kParallelGrain)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at = (g * T + t) * k + j, s = slot[static_cast<size_t>(at)];
          V dot = 0;
          if (s >= 0) {
            const V* row = pb + ((g * a.experts + pi[at]) * a.capacity + s) * C;
            const V* xr = px + (g * T + t) * C;
            for (int64_t i = 0; i < C; ++i) dot += xr[i] * row[i];
          }
          po[at] = dot;
        }
  });
  return {out};
}

double flops_moved(const Metas& in, const Metas& out, const Attrs&) {
  return 2.0 * static_cast<double>(std::max(shape_numel(in[0].shape), shape_numel(out[0].shape)));
}

// The entry of one of the three routing ops: (data, expert ids, weights), the weights optional
// for dispatch and combine.
OpDef& routing_op(OpTable& t, OpKind kind, const char* name, InferFn infer, ShardFn shard,
                  KernelFn cpu, bool optional_weights) {
  OpDef& d = def_of(t, kind);
  d.name = name;
  d.num_inputs = 3;
  if (optional_weights) d.optional_inputs = 0b100u;
  d.infer = infer;
  d.flops = flops_moved;
  d.shard = shard;
  d.cpu = cpu;
  return d;
}

}  // namespace

void register_moe_ops(OpTable& t) {
  OpDef& d = routing_op(t, OpKind::MoeDispatch, "moe_dispatch", infer_dispatch, shard_dispatch,
                        dispatch_cpu, true);
  d.backward = [](const BackwardContext& c) {
    std::vector<Tensor> g(3);
    const Tensor& w = c.inputs[2];
    if (c.needs_input_grad[0])
      g[0] = call1(OpKind::MoeCombine, {c.grad_outputs[0], c.inputs[1], w}, c.attrs);
    if (w.defined() && c.needs_input_grad[2])
      g[2] = call1(OpKind::MoeGateGrad, {c.inputs[0], c.grad_outputs[0], c.inputs[1]}, c.attrs);
    return g;
  };

  OpDef& m = routing_op(t, OpKind::MoeCombine, "moe_combine", infer_combine, shard_combine,
                        combine_cpu, true);
  m.backward = [](const BackwardContext& c) {
    std::vector<Tensor> g(3);
    const Tensor& gates = c.inputs[2];
    if (c.needs_input_grad[0])
      g[0] = call1(OpKind::MoeDispatch, {c.grad_outputs[0], c.inputs[1], gates}, c.attrs);
    if (gates.defined() && c.needs_input_grad[2])
      g[2] = call1(OpKind::MoeGateGrad, {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
    return g;
  };

  OpDef& gg = routing_op(t, OpKind::MoeGateGrad, "moe_gate_grad", infer_gate_grad, shard_gate_grad,
                         gate_grad_cpu, false);
  gg.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 2.0 * static_cast<double>(shape_numel(in[0].shape)) *
           static_cast<double>(in[2].shape.empty() ? 1 : in[2].shape.back());
  };
  gg.backward = [](const BackwardContext& c) {
    // <a, buf[slot]> is bilinear: d/da = combine(g... ) with the choice weights g; d/dbuf =
    // dispatch(a weighted by g).
    std::vector<Tensor> g(3);
    const Tensor& go = c.grad_outputs[0];
    if (c.needs_input_grad[0])
      g[0] = call1(OpKind::MoeCombine, {c.inputs[1], c.inputs[2], go}, c.attrs);
    if (c.needs_input_grad[1])
      g[1] = call1(OpKind::MoeDispatch, {c.inputs[0], c.inputs[2], go}, c.attrs);
    return g;
  };
}

}  // namespace hap::ops
