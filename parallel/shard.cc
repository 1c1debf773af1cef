#include "parallel/shard.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/shape.h"

namespace hap::parallel {

ShardSpec::ShardSpec(int64_t dim_, std::vector<int64_t> lengths_)
    : dim(dim_), lengths(std::move(lengths_)) {
  HAP_CHECK(!lengths.empty(), "ShardSpec: expected one shard length per rank, got none");
  for (size_t i = 0; i < lengths.size(); ++i)
    HAP_CHECK(lengths[i] >= 0, "ShardSpec: shard lengths ", shape_str(lengths),
              " have a negative entry at rank ", i);
  offsets = shard_offsets(lengths);
}

ShardSpec ShardSpec::from_ratios(int64_t dim, int64_t dim_size, const std::vector<double>& ratios) {
  return ShardSpec(dim, shard_lengths(dim_size, ratios));
}

int64_t ShardSpec::dim_size() const {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

int64_t ShardSpec::max_length() const {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

int64_t ShardSpec::length(int rank) const {
  HAP_CHECK(rank >= 0 && rank < num_shards(), "ShardSpec: rank ", rank, " out of range for ",
            num_shards(), " shards");
  return lengths[static_cast<size_t>(rank)];
}

int64_t ShardSpec::offset(int rank) const {
  HAP_CHECK(rank >= 0 && rank < num_shards(), "ShardSpec: rank ", rank, " out of range for ",
            num_shards(), " shards");
  return offsets[static_cast<size_t>(rank)];
}

Shape ShardSpec::local_shape(const Shape& logical_shape, int rank) const {
  int64_t d = wrap_dim(dim, static_cast<int64_t>(logical_shape.size()), "ShardSpec dim");
  HAP_CHECK(logical_shape[d] == dim_size(), "ShardSpec: logical shape ", shape_str(logical_shape),
            " has size ", logical_shape[d], " in dim ", d, " but the shard lengths ",
            shape_str(lengths), " sum to ", dim_size());
  Shape s = logical_shape;
  s[d] = length(rank);
  return s;
}

LogicalSlice ShardSpec::logical_slice(const Shape& logical_shape, int rank) const {
  int64_t d = wrap_dim(dim, static_cast<int64_t>(logical_shape.size()), "ShardSpec dim");
  local_shape(logical_shape, rank);  // validates
  LogicalSlice s;
  s.logical_shape = logical_shape;
  s.offset.assign(logical_shape.size(), 0);
  s.offset[d] = offset(rank);
  return s;
}

Tensor ShardSpec::slice_of(const Tensor& logical, int rank) const {
  int64_t d = wrap_dim(dim, logical.dim(), "ShardSpec dim");
  Shape s = local_shape(logical.shape(), rank);
  return logical.as_strided(s, logical.strides(),
                            logical.offset() + offset(rank) * logical.strides()[d]);
}

Tensor box_of(const Tensor& logical, const Shape& local_shape, const LogicalSlice& slice) {
  if (slice.offset.empty()) return logical;
  HAP_CHECK(
      slice.offset.size() == local_shape.size() && local_shape.size() == logical.shape().size(),
      "box_of: a box of rank ", local_shape.size(), " in a tensor ", logical.str());
  int64_t off = logical.offset();
  for (size_t d = 0; d < local_shape.size(); ++d) {
    HAP_CHECK(slice.offset[d] + local_shape[d] <= logical.shape()[d], "box_of: box ",
              shape_str(local_shape), " at dim ", d, " offset ", slice.offset[d], " exceeds ",
              logical.str());
    off += slice.offset[d] * logical.strides()[d];
  }
  return logical.as_strided(local_shape, logical.strides(), off);
}

}  // namespace hap::parallel
