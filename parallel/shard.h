// Shard lengths from ratios, and where each rank's shard sits in the logical tensor.
//
// A Sharded(dim) tensor of logical size N along `dim` is split into one contiguous slice per rank,
// in rank order. The lengths come from the segment's ratios by largest-remainder rounding: rank i
// first gets floor(N * r_i); the elements still missing go, one each, to the ranks with the
// largest fractional parts N * r_i - floor(N * r_i), ties to the lower rank. The lengths sum
// exactly to N and depend only on (N, ratios), so every rank computes the same ones.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "core/shape.h"
#include "core/tensor.h"

namespace hap::parallel {

// Throws hap::Error unless `ratios` is non-empty, every ratio is finite and >= 0 and they sum to
// 1 within 1e-6; the message quotes the offending values.
void validate_ratios(const std::vector<double>& ratios);

// Largest-remainder lengths, one per ratio; they sum to dim_size (>= 0). A ratio of 0 (or one
// too small to earn an element) gives a zero-length shard.
std::vector<int64_t> shard_lengths(int64_t dim_size, const std::vector<double>& ratios);

// Start of each shard: offsets[i] = lengths[0] + ... + lengths[i-1] (one entry per shard).
std::vector<int64_t> shard_offsets(const std::vector<int64_t>& lengths);

// Equal ratios (1/n each), for splits that are not driven by a segment's ratios.
std::vector<double> even_ratios(int n);

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
