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
// The same phases give an all-gather and a reduce-scatter of any block layout (one block per rank,
// parallel/backend.h): node n's block is its ranks' blocks back to back in rank order, cut into
// `lanes` even pieces, piece j travelling along lane j:
//   all-gather:     1. inside each node, an all-gather of the node's block;
//                   2. across nodes, lane j all-gathers piece j of every node's block;
//                   3. inside each node, an all-gather of the lanes' pieces, unpacked to the
//                   layout;
//   reduce-scatter: 1. inside each node, a reduce-scatter: local rank j gets piece j of every
//                      node's block, summed over its node;
//                   2. across nodes, lane j reduce-scatters them: node n's piece j to node n;
//                   3. inside each node, an all-gather of the node's summed pieces, from which each
//                      rank keeps its block.
// A node's link then carries its block once and the others' blocks once (gather) where a flat
// ring over every rank crosses the link between nodes at every hop of P - 1, each paying its
// latency: the planner prices both (synth::CostModel) and picks the cheaper.
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
  int node_index = 0;  // this rank's node, in node order
  // Per node, in node order: its ranks of the grouped communicator, in rank order.
  std::vector<std::vector<int>> members;
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

// Backend::all_gather(in, out, layout) by the phases above, started (advancing in test() and
// wait(), as start_hierarchical_all_reduce), over any layout: the same bits as the flat one.
std::unique_ptr<PendingCollective> start_hierarchical_all_gather(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const Tensor& out,
    const BlockLayout& layout);
// Backend::reduce_scatter(in, layout, out) by the phases above, started; sums as above.
std::unique_ptr<PendingCollective> start_hierarchical_reduce_scatter(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const BlockLayout& layout,
    const Tensor& out);

}  // namespace hap::parallel
