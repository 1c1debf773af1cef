// How an op runs on one rank's shards under a sharding signature: the SPMD executor's "localise"
// hook, declared by the op next to its signatures (as OneFlow's ops declare their physical
// tensor descriptions beside GetSbp). Most ops run their kernel on the local shards with their
// attributes unchanged and declare nothing. An op declares OpDef::local when
//   - its attributes hold global sizes or positions (a reshape's target shape, an expand's sizes,
//     a mean's element count, a dropout mask's place in the logical tensor, an embedding's row
//     range, a loss's count of targets), or
//   - its shards must talk (cross-entropy over a vocabulary split across ranks combines each
//     rank's log-sum-exp): it calls the differentiable collectives of the ShardContext.
// The executor implements ShardContext (parallel/executor.cc) and never switches on op kinds.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/rng.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "ops/attrs.h"
#include "ops/sharding.h"

namespace hap::ops {

class ShardContext {
 public:
  virtual ~ShardContext() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // The node's logical (whole) shapes, and how this rank holds each input and output under the
  // chosen signature.
  virtual const Shape& input_shape(size_t i) const = 0;
  virtual const Shape& output_shape(size_t o) const = 0;
  virtual Prop input_prop(size_t i) const = 0;
  virtual Prop output_prop(size_t o) const = 0;
  // For a Sharded input or output: every rank's length of its sharded dimension, as the executor
  // cuts it.
  virtual std::vector<int64_t> input_lengths(size_t i) const = 0;
  virtual std::vector<int64_t> output_lengths(size_t o) const = 0;

  // Randomness of this forward: the stream offset of the step, the seed that replaces the traced
  // one (nullopt: keep it), and whether dropout is on.
  virtual uint64_t random_offset() const = 0;
  virtual std::optional<uint64_t> random_seed() const = 0;
  virtual bool training() const = 0;

  // Differentiable collectives over the ranks (the program's own, with their adjoints).
  virtual Tensor all_gather(const Tensor& shard, int64_t dim,
                            const std::vector<int64_t>& lengths) = 0;
  // Sum of an integer over ranks (not differentiable).
  virtual int64_t sum_over_ranks(int64_t value) = 0;

  // ---- helpers on the above ----
  // This rank's offset along input i's (output o's) sharded dimension.
  int64_t input_offset(size_t i) const;
  int64_t output_offset(size_t o) const;
  // Where this rank's part of input i sits in the logical tensor (empty when not Sharded).
  LogicalSlice input_slice(size_t i) const;
};

// Runs the op on this rank's shards (`inputs`, laid out as the signature says) and returns this
// rank's outputs, with the properties the signature gives them.
using LocalFn = std::vector<Tensor> (*)(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                        const Attrs& attrs);

}  // namespace hap::ops
