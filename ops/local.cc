#include "ops/local.h"

#include <numeric>

#include "core/error.h"

namespace hap::ops {

namespace {
int64_t offset_of(const std::vector<int64_t>& lengths, int rank) {
  HAP_ASSERT(rank >= 0 && static_cast<size_t>(rank) < lengths.size(), "rank ", rank,
             " has no shard length");
  return std::accumulate(lengths.begin(), lengths.begin() + rank, int64_t{0});
}
}  // namespace

int64_t ShardContext::input_offset(size_t i) const { return offset_of(input_lengths(i), rank()); }
int64_t ShardContext::output_offset(size_t o) const { return offset_of(output_lengths(o), rank()); }

LogicalSlice ShardContext::input_slice(size_t i) const {
  const Prop p = input_prop(i);
  if (p.kind != PropKind::Sharded) return {};
  const Shape& s = input_shape(i);
  LogicalSlice slice;
  slice.logical_shape = s;
  slice.offset.assign(s.size(), 0);
  slice.offset[static_cast<size_t>(p.dim)] = input_offset(i);
  return slice;
}

}  // namespace hap::ops
