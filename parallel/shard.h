// Shard lengths from ratios, and where each rank's shard sits in the logical tensor.
//
// The lengths themselves (largest-remainder rounding of the ratios) come from core/split.h.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/shape.h"
#include "core/split.h"
#include "core/tensor.h"

namespace hap::parallel {

using hap::even_ratios;
using hap::shard_lengths;
using hap::shard_offsets;
using hap::validate_ratios;

// How one dimension of a logical tensor is split over the ranks of a communicator.
struct ShardSpec {
  int64_t dim = 0;
  std::vector<int64_t> lengths;  // one per rank, summing to the logical size of `dim`
  std::vector<int64_t> offsets;  // shard_offsets(lengths)

  ShardSpec() = default;
  // Throws if a length is negative.
  ShardSpec(int64_t dim, std::vector<int64_t> lengths);
  static ShardSpec from_ratios(int64_t dim, int64_t dim_size, const std::vector<double>& ratios);

  int num_shards() const { return static_cast<int>(lengths.size()); }
  int64_t dim_size() const;    // sum of the lengths
  int64_t max_length() const;  // the padded methods' block length
  int64_t length(int rank) const;
  int64_t offset(int rank) const;

  // The local shape of `rank`: logical_shape with `dim` replaced by the rank's length.
  Shape local_shape(const Shape& logical_shape, int rank) const;
  // Where rank's shard sits in the logical tensor, for drawing its slice of random numbers.
  LogicalSlice logical_slice(const Shape& logical_shape, int rank) const;
  // A raw (non-differentiable) view of rank's slice of a logical tensor.
  Tensor slice_of(const Tensor& logical, int rank) const;
};

// A raw view of the box `slice` (as a TensorSource receives it) of a logical tensor: all of it
// when the slice is empty.
Tensor box_of(const Tensor& logical, const Shape& local_shape, const LogicalSlice& slice);

}  // namespace hap::parallel
