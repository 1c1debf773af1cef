// CUDA kernels of the mixture-of-experts routing ops (ops/defs/moe.cc): dispatch, combine and the
// gate gradient. The slots are a sequential scan on the CPU (every first choice before any second
// choice, token order within, per group), so they are assigned here on the host from one copy of
// the small i64 expert ids, with the CPU's rule and errors, and uploaded as a table. The kernels
// only gather by that table: each thread owns one output element and adds its sources in the
// CPU's order (choice order for combine, feature order for the gate gradient's dot products).
// No atomics; the results are deterministic.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// Where each choice at = (g T + t) k + j of the ids [G, T, k] went: `slot` its slot in expert
// idx[at]'s buffer of group g, or -1 when dropped, and `expert` the id itself.
struct Routing {
  int64_t groups = 0, tokens = 0, k = 0;
  std::vector<int64_t> slot, expert;
};

// The CPU's slot assignment (moe_assign_slots, ops/defs/common.h) on a host copy of the ids: the
// same scan order, the same error for an expert id outside [0, experts).
Routing assign_slots(const char* op, const Tensor& ids, int64_t experts, int64_t capacity) {
  const Tensor h = ids.to(Device::cpu()).contiguous();
  Routing r;
  r.groups = h.size(0);
  r.tokens = h.size(1);
  r.k = h.size(2);
  r.slot = moe_assign_slots(op, h, experts, capacity);
  const int64_t* p = h.data<int64_t>();
  r.expert.assign(p, p + h.numel());
  return r;
}

// An i64 vector as a tensor on `device`.
Tensor upload(const std::vector<int64_t>& v, Device device) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(device);
}

// Per choice: the row of its slot in the buffers viewed as [G E cap, C], or -1 when dropped.
Tensor choice_rows(const Routing& r, const MoeAttrs& a, Device device) {
  std::vector<int64_t> rows(r.slot.size(), -1);
  for (size_t at = 0; at < rows.size(); ++at) {
    if (r.slot[at] < 0) continue;
    const int64_t g = static_cast<int64_t>(at) / (r.tokens * r.k);
    rows[at] = (g * a.experts + r.expert[at]) * a.capacity + r.slot[at];
  }
  return upload(rows, device);
}

// Per buffer row (g, e, s) of [G E cap, C]: the choice that holds it, or -1 for an empty slot.
// A slot has at most one holder: the scan hands each out once.
Tensor slot_holders(const Routing& r, const MoeAttrs& a, Device device) {
  std::vector<int64_t> holder(static_cast<size_t>(r.groups * a.experts * a.capacity), -1);
  for (size_t at = 0; at < r.slot.size(); ++at) {
    if (r.slot[at] < 0) continue;
    const int64_t g = static_cast<int64_t>(at) / (r.tokens * r.k);
    holder[static_cast<size_t>((g * a.experts + r.expert[at]) * a.capacity + r.slot[at])] =
        static_cast<int64_t>(at);
  }
  return upload(holder, device);
}

// The optional gate weights of input 2 (packed), or an undefined tensor. The CPU reads them at
// every choice, so they must hold one per choice (infer skips a 0-d tensor).
Tensor weights_of(const KernelContext& c, const char* op) {
  if (c.inputs.size() <= 2 || !c.inputs[2].defined()) return Tensor();
  const Tensor& w = c.inputs[2];
  HAP_CHECK(w.shape() == c.inputs[1].shape(), op, ": gate weights ", shape_str(w.shape()),
            " must match the expert ids ", shape_str(c.inputs[1].shape()));
  return dense(w);
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? ptr<T>(t) : nullptr;
}

// buf [rows, C]: row r = w[at] x[at / k] for the choice `at` holding slot r (w = 1 when absent,
// the CPU's f * x), zero for an empty slot. x: [G T, C] packed.
template <typename T>
__global__ void dispatch_kernel(T* buf, const T* x, const T* w, const int64_t* holder, int64_t rows,
                                int64_t C, int64_t k) {
  HAP_GRID_STRIDE_LOOP(i, rows * C) {
    const int64_t at = holder[i / C];
    if (at < 0) {
      buf[i] = T(0);
    } else {
      const T f = w != nullptr ? w[at] : T(1);
      buf[i] = f * x[(at / k) * C + i % C];
    }
  }
}

std::vector<Tensor> dispatch(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  const Routing r = assign_slots("moe_dispatch", c.inputs[1], a.experts, a.capacity);
  const Tensor w = weights_of(c, "moe_dispatch");
  Tensor out = c.alloc(0);  // [G, E, cap, C]
  if (out.numel() == 0) return {out};
  const Tensor x = dense(c.inputs[0]);  // [G, T, C]
  const int64_t C = x.size(2), rows = out.numel() / C;
  const Tensor holder = slot_holders(r, a, out.device());
  on_float(out, "moe_dispatch", [&](auto tag) {
    using T = decltype(tag);
    dispatch_kernel<<<blocks_for(rows * C), kThreads>>>(ptr<T>(out), ptr<T>(x), ptr_or_null<T>(w),
                                                        ptr<int64_t>(holder), rows, C, r.k);
  });
  return {out};
}

// y [G T, C]: y[tok, i] = sum over the token's kept choices j, in choice order from 0, of
// gates[at] buf[row(at), i] (gates = 1 when absent): the CPU's fill with 0 then += f src.
template <typename T>
__global__ void combine_kernel(T* y, const T* buf, const T* gates, const int64_t* rows,
                               int64_t tokens, int64_t C, int64_t k) {
  HAP_GRID_STRIDE_LOOP(i, tokens * C) {
    const int64_t tok = i / C, col = i % C;
    T acc = T(0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at = tok * k + j, row = rows[at];
      if (row < 0) continue;
      const T f = gates != nullptr ? gates[at] : T(1);
      acc += f * buf[row * C + col];
    }
    y[i] = acc;
  }
}

std::vector<Tensor> combine(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  const Routing r = assign_slots("moe_combine", c.inputs[1], a.experts, a.capacity);
  const Tensor gates = weights_of(c, "moe_combine");
  Tensor out = c.alloc(0);  // [G, T, C]
  if (out.numel() == 0) return {out};
  const Tensor buf = dense(c.inputs[0]);  // [G, E, cap, C]
  const int64_t C = buf.size(3), tokens = r.groups * r.tokens;
  const Tensor rows = choice_rows(r, a, out.device());
  on_float(out, "moe_combine", [&](auto tag) {
    using T = decltype(tag);
    combine_kernel<<<blocks_for(tokens * C), kThreads>>>(
        ptr<T>(out), ptr<T>(buf), ptr_or_null<T>(gates), ptr<int64_t>(rows), tokens, C, r.k);
  });
  return {out};
}

// out [G T k]: out[at] = <x[at / k], buf[row(at)]> summed over the features in order from 0, or
// 0 for a dropped choice. One thread per choice keeps the CPU's order of additions.
template <typename T>
__global__ void gate_grad_kernel(T* out, const T* x, const T* buf, const int64_t* rows,
                                 int64_t choices, int64_t C, int64_t k) {
  HAP_GRID_STRIDE_LOOP(at, choices) {
    const int64_t row = rows[at];
    T dot = T(0);
    if (row >= 0) {
      const T* xr = x + (at / k) * C;
      const T* br = buf + row * C;
      for (int64_t i = 0; i < C; ++i) dot += xr[i] * br[i];
    }
    out[at] = dot;
  }
}

std::vector<Tensor> gate_grad(const KernelContext& c) {
  const MoeAttrs& a = attr<MoeAttrs>(c.attrs);
  const Routing r = assign_slots("moe_gate_grad", c.inputs[2], a.experts, a.capacity);
  Tensor out = c.alloc(0);  // [G, T, k]
  if (out.numel() == 0) return {out};
  const Tensor x = dense(c.inputs[0]), buf = dense(c.inputs[1]);  // [G, T, C], [G, E, cap, C]
  const int64_t C = x.size(2), choices = out.numel();
  const Tensor rows = choice_rows(r, a, out.device());
  on_float(out, "moe_gate_grad", [&](auto tag) {
    using T = decltype(tag);
    gate_grad_kernel<<<blocks_for(choices), kThreads>>>(ptr<T>(out), ptr<T>(x), ptr<T>(buf),
                                                        ptr<int64_t>(rows), choices, C, r.k);
  });
  return {out};
}

}  // namespace

void register_moe(OpTable& t) {
  t[static_cast<size_t>(OpKind::MoeDispatch)].cuda = dispatch;
  t[static_cast<size_t>(OpKind::MoeCombine)].cuda = combine;
  t[static_cast<size_t>(OpKind::MoeGateGrad)].cuda = gate_grad;
}

}  // namespace hap::ops::cuda
