// Uneven collectives over the communicator's backend (parallel/backend.h). Not differentiable:
// parallel/autograd_collectives.h wraps them with their adjoints.
//
// Every rank calls the same collective with the same arguments except its own tensor. A tensor
// Sharded(dim) over the communicator has `lengths[r]` elements of `dim` on rank r (any lengths
// >= 0, zero included; shard_lengths() turns ratios into lengths); all other dims agree.
//
// Methods (DESIGN.md glossary):
//   Padded  - every block is padded to the largest one and moves in one regular collective
//             (a regular BlockLayout: MPI_Allgather / MPI_Alltoall); the receiver trims.
//   Grouped - every block moves with its exact size inside one group call (a packed
//             BlockLayout: MPI_Allgatherv / MPI_Alltoallv; NCCL: grouped broadcasts and reduces).
//   Hierarchical - (all_gather and reduce_scatter, over a communicator carrying node groups)
//             the exact sizes in three phases, inside nodes, across them, inside again
//             (parallel/hierarchical.h), for clusters whose link between nodes is the slow one.
// All give bitwise-identical results (a hierarchical reduce-scatter sums each node first: exact up
// to reassociation, as the hierarchical all-reduce); they differ in bytes moved and in call
// structure.
//
// Determinism: the sums are the backend's (MpiBackend: every element in rank order,
// ((x_0 + x_1) + x_2) + ..., bf16 accumulated in f32), so every element of a sum is bitwise the
// same on every run, on every rank that holds it, and equals the single-process left fold over
// ranks. u8 tensors cannot be reduced.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/sharding.h"
#include "parallel/backend.h"
#include "parallel/communicator.h"

namespace hap::parallel {

using ops::CollectiveMethod;  // None is not a way to move data

// Sharded(dim) -> Replicated. x_local: the rank's shard, size lengths[rank] in dim.
// Returns the logical tensor (size sum(lengths) in dim) on every rank.
Tensor all_gather(const Communicator& comm, const Tensor& x_local, int64_t dim,
                  const std::vector<int64_t>& lengths, CollectiveMethod method);

// Partial -> Sharded(dim). x_partial: the rank's addend of the logical tensor (full size
// sum(lengths) in dim). Returns the rank's shard (size lengths[rank] in dim) of the sum.
Tensor reduce_scatter(const Communicator& comm, const Tensor& x_partial, int64_t dim,
                      const std::vector<int64_t>& lengths, CollectiveMethod method);

// Backend::start_all_gather / start_reduce_scatter by `method`: the hierarchical form over the
// communicator's node groups, any other the backend's own (the layout says padded or packed).
std::unique_ptr<PendingCollective> start_all_gather(const Communicator& comm,
                                                    CollectiveMethod method, const Tensor& send,
                                                    const Tensor& recv, const BlockLayout& layout);
std::unique_ptr<PendingCollective> start_reduce_scatter(const Communicator& comm,
                                                        CollectiveMethod method, const Tensor& send,
                                                        const BlockLayout& layout,
                                                        const Tensor& recv);

// Partial -> Replicated: the sum of every rank's x on every rank (same shape). Implemented as a
// reduce-scatter over the flattened tensor with even lengths followed by an all-gather; `method`
// picks how those two phases move their uneven pieces and does not change the result.
Tensor all_reduce(const Communicator& comm, const Tensor& x_partial,
                  CollectiveMethod method = CollectiveMethod::Grouped);

// Sharded(concat_dim) -> Sharded(split_dim). x_local: size lengths_concat[rank] in concat_dim
// and the full sum(lengths_split) in split_dim. Returns size lengths_split[rank] in split_dim
// and sum(lengths_concat) in concat_dim. split_dim != concat_dim.
Tensor all_to_all(const Communicator& comm, const Tensor& x_local, int64_t split_dim,
                  int64_t concat_dim, const std::vector<int64_t>& lengths_split,
                  const std::vector<int64_t>& lengths_concat,
                  CollectiveMethod method = CollectiveMethod::Grouped);

// ---- several tensors in one collective (the executor's parameter buckets) ----
// How a tensor is split over the ranks: Sharded(dim) with these lengths.
struct ShardOf {
  int64_t dim = 0;
  std::vector<int64_t> lengths;
};

// all_gather of several shards at once, in one collective: block r holds rank r's shards of
// every tensor back to back (padded: every block in a slot the size of the largest). Returns
// the logical tensors, bitwise what one all_gather each gives.
std::vector<Tensor> all_gather_many(const Communicator& comm, const std::vector<Tensor>& locals,
                                    const std::vector<ShardOf>& shards, CollectiveMethod method);
// all_gather_many split in three, so that the collective itself can run nonblocking
// (Backend::start_all_gather) between pack and unpack:
//   ManyGather m = pack_all_gather_many(comm, locals, shards, method);
//   comm.backend().all_gather(m.send, m.recv, m.layout);   // or start_all_gather
//   std::vector<Tensor> wholes = unpack_all_gather_many(m);
struct ManyGather {
  Tensor send, recv;
  BlockLayout layout;
  std::vector<Shape> wholes;             // each tensor's logical shape
  std::vector<ShardOf> shards;           // and how it is split
  std::vector<std::vector<int64_t>> at;  // per rank, per tensor: its offset in the rank's block
  double bytes = 0;                      // of the logical tensors together
};
ManyGather pack_all_gather_many(const Communicator& comm, const std::vector<Tensor>& locals,
                                const std::vector<ShardOf>& shards, CollectiveMethod method);
std::vector<Tensor> unpack_all_gather_many(const ManyGather& m);

// reduce_scatter of several Partial tensors at once, in one collective (the same block layout
// as all_gather_many), split in three so that the collective itself can run nonblocking
// (Backend::start_reduce_scatter) between pack and unpack:
//   ManyScatter m = pack_reduce_scatter_many(comm, partials, shards, method);
//   comm.backend().reduce_scatter(m.send, m.layout, m.recv);   // or start_reduce_scatter
//   std::vector<Tensor> mine = unpack_reduce_scatter_many(comm, m);
// The shards are bitwise what one reduce_scatter each gives.
struct ManyScatter {
  Tensor send, recv;
  BlockLayout layout;
  std::vector<Shape> local_shapes;  // this rank's shard of each tensor
};
ManyScatter pack_reduce_scatter_many(const Communicator& comm, const std::vector<Tensor>& partials,
                                     const std::vector<ShardOf>& shards, CollectiveMethod method);
std::vector<Tensor> unpack_reduce_scatter_many(const ManyScatter& m);

// Time spent in each collective on this rank since the last reset (a collective called inside
// another, as all_reduce's two phases, counts as the outer one only): what `hap-train --profile`
// reports next to the kernels' time.
enum class CollectiveStat { AllGather, ReduceScatter, AllReduce, AllToAll, Broadcast };
inline constexpr int kNumCollectiveStats = 5;
const char* collective_stat_name(CollectiveStat c);
struct CollectiveStats {
  uint64_t calls[kNumCollectiveStats] = {};
  double seconds[kNumCollectiveStats] = {};
  double bytes[kNumCollectiveStats] = {};  // of the tensors passed in (all_gather: gathered)
};
const CollectiveStats& collective_stats();
void reset_collective_stats();
// For collectives run outside these functions (the executor's overlapped gradient all-reduces:
// their seconds are the time the rank waited on them, not the time they ran).
void add_collective_stat(CollectiveStat kind, uint64_t calls, double bytes, double seconds);

// Root's tensor on every rank (a new contiguous tensor). Non-roots may pass an undefined tensor
// (shape and dtype come from the root) or one whose shape and dtype must match the root's.
Tensor broadcast(const Communicator& comm, const Tensor& x, int root = 0);

}  // namespace hap::parallel
