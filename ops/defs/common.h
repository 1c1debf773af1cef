// Helpers shared by the op definitions in ops/defs/: attribute access, inference and sharding
// building blocks, and the gradient reductions backward rules need.
#pragma once
#include <variant>
#include <vector>

#include "ops/dispatch.h"
#include "ops/op.h"

namespace hap::ops {

template <typename A>
const A& attr(const Attrs& attrs) {
  const A* a = std::get_if<A>(&attrs);
  HAP_ASSERT(a != nullptr, "op called with the wrong attribute type");
  return *a;
}

// One output with the given shape and the dtype of input 0.
inline Metas same_as_input(const Metas& in, size_t i = 0) { return {in[i]}; }

// Checks that input `i` is floating point, naming the op.
inline void check_floating(const char* op, const Metas& in, size_t i) {
  HAP_CHECK(is_floating(in[i].dtype), op, ": input ", i, " must be floating point, got ",
            dtype_name(in[i].dtype));
}
inline void check_same_dtype(const char* op, const Metas& in, size_t i, size_t j) {
  HAP_CHECK(in[i].dtype == in[j].dtype, op, ": inputs ", i, " and ", j,
            " must have the same dtype, got ", dtype_name(in[i].dtype), " and ",
            dtype_name(in[j].dtype));
}

// Reduces a gradient of a broadcast result back to an input's shape (sums the broadcast dims).
Tensor sum_to(const Tensor& grad, const Shape& shape);

// Sharding of an elementwise op over broadcast inputs: every output dim can be split, inputs
// that broadcast along it stay Replicated. `partial_inputs` lists the inputs through which the op
// is linear (a Partial there, with the others Replicated, gives a Partial output).
std::vector<ShardSignature> elementwise_signatures(const Metas& in, const Metas& out,
                                                   const std::vector<size_t>& partial_inputs);

// FLOPs of `per_element` operations per output element.
inline double elementwise_flops(const Metas& out, double per_element) {
  double n = 0;
  for (const TensorMeta& m : out) n += static_cast<double>(shape_numel(m.shape));
  return n * per_element;
}

// MoE routing (ops/defs/moe.cc): slot[(g T + t) k + j] is the slot of token t's j-th choice in
// its expert's buffer of group g, or -1 when dropped; choices claim slots in the order every first
// choice of the group, in token order, then every second... Throws naming `op` for an expert id
// outside [0, experts). `idx` ([G, T, k], i64) may be on any device (read through a host copy).
std::vector<int64_t> moe_assign_slots(const char* op, const Tensor& idx, int64_t experts,
                                      int64_t capacity);

}  // namespace hap::ops
