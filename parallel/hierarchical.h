// The hierarchical all-reduce: ranks grouped by node, an all-reduce runs as
//   1. a reduce-scatter inside each node: the tensor is cut into `lanes` even blocks (lanes = the
//      smallest node's size) and local rank j of every node gets block j summed over its node;
//   2. an all-reduce of block j across nodes, between the local ranks j (one "lane" per block);
//   3. an all-gather inside each node of the lanes' sums.
// Each node's link carries about 2 (nodes - 1) / nodes times the tensor to the other nodes, where
// a flat all-reduce over every rank carries 2 (ranks - 1) / ranks times it (a ring) or more (the
// MPI backend's all-to-all of addends): what the planner picks it for on clusters whose link
// between nodes is slower than the links inside them (synth::CostModel prices both forms).
//
// Sums: every element is the sum over nodes, in node order, of its node's sum over ranks, in
// rank order (each phase sums in the backend's order, parallel/backend.h). That is a
// reassociation of the flat all-reduce's rank-order sum (DESIGN.md, Contracts: exact up to
// reassociation); it is bitwise the same on every rank and on every run, and the blocking and
// nonblocking forms give the same bits.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/backend.h"
#include "parallel/communicator.h"

namespace hap::parallel {

struct NodeGroups {
  Communicator node;   // the ranks of this rank's node, in rank order
  Communicator lane;   // local rank `local_rank` of every node, in node order; invalid when
                       // local_rank >= lanes
  int lanes = 0;       // the smallest node's size
  int local_rank = 0;  // this rank's place in its node
};

// Groups comm's ranks by node: node_of_rank[r] labels rank r's node (any integers; nodes are
// ordered by label). Collective over comm: every rank passes the same labels. Throws hap::Error
// when the labels are not one per rank.
std::shared_ptr<const NodeGroups> group_by_node(const Communicator& comm,
                                                const std::vector<int>& node_of_rank);

// The sum over every rank of `in` into `out` (contiguous, same size and dtype, on a device the
// backends support) by the three phases above, started: the phases advance in test() and wait()
// (nonblocking where the backends have nonblocking forms, Backend::start_reduce_scatter and
// friends). Same rules as Backend::start_all_reduce: the communicators in `groups` carry nothing
// else until it completes.
std::unique_ptr<PendingCollective> start_hierarchical_all_reduce(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const Tensor& out);
// The same, run to completion.
void hierarchical_all_reduce(std::shared_ptr<const NodeGroups> groups, const Tensor& in,
                             const Tensor& out);

}  // namespace hap::parallel
