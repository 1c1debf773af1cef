// Shard lengths from ratios: how a dimension of N elements is split over devices in given
// proportions. Pure arithmetic, shared by the planner (synth/) and the runtime (parallel/).
//
// A Sharded(dim) tensor of logical size N along `dim` is split into one contiguous slice per rank,
// in rank order. The lengths come from the segment's ratios by largest-remainder rounding: rank i
// first gets floor(N * r_i); the elements still missing go, one each, to the ranks with the
// largest fractional parts N * r_i - floor(N * r_i), ties to the lower rank. The lengths sum
// exactly to N and depend only on (N, ratios), so every rank computes the same ones.
#pragma once
#include <cstdint>
#include <vector>

namespace hap {

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

}  // namespace hap
