// Random tensors from the counter-based generator. The value at logical element i depends only on
// (seed, stream, i); a shard draws exactly its slice of the logical tensor's numbers.
#pragma once
#include <cstdint>
#include <functional>

#include "core/tensor.h"

namespace hap {

// Which part of a logical tensor a local tensor holds: a box starting at `offset` inside a logical
// tensor of shape `logical_shape`. The default (empty) means the local tensor is the whole.
struct LogicalSlice {
  Shape logical_shape;
  std::vector<int64_t> offset;
};

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t stream, double lo, double hi,
                  const LogicalSlice& slice = {});
void fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, double mean, double std,
                 const LogicalSlice& slice = {});
// 1 with probability keep_prob, else 0 (dropout masks).
void fill_bernoulli(const Tensor& out, uint64_t seed, uint64_t stream, double keep_prob,
                    const LogicalSlice& slice = {});

// Calls f(i, logical) for every element i (row-major) of a tensor of `shape` that holds the box
// `slice` of a logical tensor, with i's flat index in the logical tensor (slice empty: i itself).
void for_each_logical_index(const Shape& shape, const LogicalSlice& slice,
                            const std::function<void(int64_t, uint64_t)>& f);

Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream = 0, TensorOptions opt = {});
Tensor rand(const Shape& shape, uint64_t seed, uint64_t stream = 0, TensorOptions opt = {});

}  // namespace hap
