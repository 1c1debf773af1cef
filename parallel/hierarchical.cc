#include "parallel/hierarchical.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/error.h"

namespace hap::parallel {

std::shared_ptr<const NodeGroups> group_by_node(const Communicator& comm,
                                                const std::vector<int>& node_of_rank) {
  HAP_CHECK(static_cast<int>(node_of_rank.size()) == comm.size(),
            "group_by_node: ", node_of_rank.size(), " node labels for a communicator of ",
            comm.size(), " ranks; expected one per rank");
  std::map<int, int> node_size;  // label -> ranks; ordered by label
  for (int label : node_of_rank) ++node_size[label];
  auto groups = std::make_shared<NodeGroups>();
  groups->lanes = comm.size();
  for (const auto& [label, n] : node_size) groups->lanes = std::min(groups->lanes, n);
  const int mine = node_of_rank[static_cast<size_t>(comm.rank())];
  for (int r = 0; r < comm.rank(); ++r)
    if (node_of_rank[static_cast<size_t>(r)] == mine) ++groups->local_rank;
  const int node_index = static_cast<int>(std::distance(node_size.begin(), node_size.find(mine)));
  groups->node_index = node_index;
  groups->members.resize(node_size.size());
  for (int r = 0; r < comm.size(); ++r) {
    const int label = node_of_rank[static_cast<size_t>(r)];
    const auto at = std::distance(node_size.begin(), node_size.find(label));
    groups->members[static_cast<size_t>(at)].push_back(r);
  }
  groups->node = comm.split(node_index, comm.rank());
  groups->lane =
      comm.split(groups->local_rank < groups->lanes ? groups->local_rank : -1, node_index);
  return groups;
}

namespace {

// Even cuts of `numel` elements into `lanes` pieces (the first numel % lanes one longer).
int64_t lane_piece(int64_t numel, int lanes, int j) {
  return numel / lanes + (j < numel % lanes ? 1 : 0);
}

// Block j of `numel` elements cut into `lanes` even blocks goes to local rank j; the node's other
// ranks get empty blocks.
BlockLayout lane_layout(int64_t numel, int lanes, int node_size) {
  std::vector<int64_t> counts(static_cast<size_t>(node_size), 0);
  for (int j = 0; j < lanes; ++j) counts[static_cast<size_t>(j)] = lane_piece(numel, lanes, j);
  return BlockLayout::packed(counts);
}

// Where a layout's blocks fall in the phases of the hierarchical all-gather and reduce-scatter.
struct NodePieces {
  std::vector<int64_t> member_at;              // per rank: its block's offset in its node's block
  std::vector<int64_t> node_total;             // per node: its block's elements
  std::vector<std::vector<int64_t>> piece;     // [node][lane]: piece j of the node's block
  std::vector<std::vector<int64_t>> piece_at;  // [node][lane]: its offset in the node's block
  std::vector<std::vector<int64_t>> lane_at;   // [node][lane]: its offset in the lane's buffer
  std::vector<int64_t> lane_total;             // per lane: its pieces of every node
  // Lane j's layout across nodes: piece j of each node's block, in node order.
  BlockLayout across(size_t j) const {
    std::vector<int64_t> counts;
    for (const auto& p : piece) counts.push_back(p[j]);
    return BlockLayout::packed(counts);
  }
};

NodePieces node_pieces(const NodeGroups& g, const BlockLayout& layout) {
  NodePieces np;
  const size_t nodes = g.members.size(), lanes = static_cast<size_t>(g.lanes);
  np.member_at.assign(layout.counts.size(), 0);
  np.node_total.assign(nodes, 0);
  np.piece.assign(nodes, std::vector<int64_t>(lanes, 0));
  np.piece_at = np.lane_at = np.piece;
  np.lane_total.assign(lanes, 0);
  for (size_t n = 0; n < nodes; ++n) {
    for (int r : g.members[n]) {
      np.member_at[static_cast<size_t>(r)] = np.node_total[n];
      np.node_total[n] += layout.counts[static_cast<size_t>(r)];
    }
    int64_t at = 0;
    for (size_t j = 0; j < lanes; ++j) {
      np.piece[n][j] = lane_piece(np.node_total[n], g.lanes, static_cast<int>(j));
      np.piece_at[n][j] = at;
      at += np.piece[n][j];
      np.lane_at[n][j] = np.lane_total[j];
      np.lane_total[j] += np.piece[n][j];
    }
  }
  return np;
}

// `n` elements of a contiguous tensor from element `at`, as a 1-D view.
Tensor flat(const Tensor& t, int64_t at, int64_t n) {
  return t.as_strided({n}, {1}, t.offset() + at);
}

// Copies between node n's piece j, held in `pieces` from element `pieces_at`, and the blocks of
// the node's ranks in `blocks` (laid out by `layout`): into the blocks where `to_blocks`, from
// them otherwise.
void copy_piece(const NodeGroups& g, const NodePieces& np, const BlockLayout& layout, size_t n,
                size_t j, const Tensor& pieces, int64_t pieces_at, const Tensor& blocks,
                bool to_blocks) {
  const int64_t lo = np.piece_at[n][j], hi = lo + np.piece[n][j];
  for (int r : g.members[n]) {
    const size_t ri = static_cast<size_t>(r);
    const int64_t b_lo = np.member_at[ri], b_hi = b_lo + layout.counts[ri];
    const int64_t from = std::max(lo, b_lo), to = std::min(hi, b_hi);
    if (from >= to) continue;
    const Tensor p = flat(pieces, pieces_at + from - lo, to - from);
    const Tensor b = flat(blocks, layout.displs[ri] + from - b_lo, to - from);
    if (to_blocks)
      b.copy_from(p);
    else
      p.copy_from(b);
  }
}

// The node-local layout of one block per local rank: `count(k)` for local ranks k < lanes, none
// for the others.
template <typename F>
BlockLayout per_lane(const NodeGroups& g, F count) {
  std::vector<int64_t> counts(static_cast<size_t>(g.node.size()), 0);
  for (int k = 0; k < g.lanes; ++k) counts[static_cast<size_t>(k)] = count(static_cast<size_t>(k));
  return BlockLayout::packed(counts);
}

// This rank's place in the grouped communicator.
size_t my_rank(const NodeGroups& g) {
  return static_cast<size_t>(
      g.members[static_cast<size_t>(g.node_index)][static_cast<size_t>(g.local_rank)]);
}

void check_layout(const NodeGroups& g, const BlockLayout& layout, const char* op) {
  HAP_CHECK(g.node.valid() && g.lanes >= 1 && !g.members.empty(), op,
            ": the node groups are not set up");
  size_t ranks = 0;
  for (const auto& m : g.members) ranks += m.size();
  HAP_CHECK(layout.counts.size() == ranks && layout.displs.size() == ranks, op, ": a layout of ",
            layout.counts.size(), " blocks for ", ranks, " ranks; expected one per rank");
}

void check_arguments(const NodeGroups& g, const Tensor& in, const Tensor& out) {
  const char* op = "hierarchical_all_reduce";
  HAP_CHECK(g.node.valid() && g.lanes >= 1, op, ": the node groups are not set up");
  HAP_CHECK(in.defined() && out.defined() && in.numel() == out.numel() && in.dtype() == out.dtype(),
            op, ": out ", out.str(), " does not match in ", in.str());
  HAP_CHECK(in.dtype() != DType::U8, op, ": cannot sum u8 tensors (masks); cast them first");
}

}  // namespace

std::unique_ptr<PendingCollective> start_hierarchical_all_reduce(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const Tensor& out) {
  HAP_CHECK(groups != nullptr, "start_hierarchical_all_reduce: no node groups");
  check_arguments(*groups, in, out);
  // The phases of hierarchical_all_reduce, each started when the one before has completed.
  const BlockLayout layout = lane_layout(in.numel(), groups->lanes, groups->node.size());
  const int64_t mine = layout.counts[static_cast<size_t>(groups->local_rank)];
  const TensorOptions options = TensorOptions{}.with_dtype(in.dtype()).with_device(in.device());
  Tensor block = Tensor::empty({mine}, options), sum = Tensor::empty({mine}, options);
  const std::shared_ptr<const NodeGroups>& g = groups;
  return std::make_unique<PhasedCollective>(std::vector<PhasedCollective::Phase>{
      [g, in, layout, block] { return g->node.backend().start_reduce_scatter(in, layout, block); },
      [g, block, sum] {
        return g->lane.valid() ? g->lane.backend().start_all_reduce(block, sum)
                               : Backend::completed();
      },
      [g, sum, out, layout] { return g->node.backend().start_all_gather(sum, out, layout); }});
}

void hierarchical_all_reduce(std::shared_ptr<const NodeGroups> groups, const Tensor& in,
                             const Tensor& out) {
  start_hierarchical_all_reduce(std::move(groups), in, out)->wait();
}

std::unique_ptr<PendingCollective> start_hierarchical_all_gather(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const Tensor& out,
    const BlockLayout& layout) {
  const char* op = "hierarchical all_gather";
  HAP_CHECK(groups != nullptr, op, ": no node groups");
  const std::shared_ptr<const NodeGroups>& g = groups;
  check_layout(*g, layout, op);
  const size_t me = my_rank(*g);
  HAP_CHECK(in.defined() && out.defined() && in.dtype() == out.dtype() &&
                in.numel() == layout.counts[me] && out.numel() >= layout.total(),
            op, ": in ", in.str(), " and out ", out.str(), " do not match the layout (",
            layout.counts[me], " elements in, ", layout.total(), " out)");
  auto np = std::make_shared<const NodePieces>(node_pieces(*g, layout));
  const size_t n = static_cast<size_t>(g->node_index), j = static_cast<size_t>(g->local_rank);
  const bool lane = g->local_rank < g->lanes;
  const TensorOptions options = TensorOptions{}.with_dtype(in.dtype()).with_device(in.device());
  std::vector<int64_t> member_counts;
  for (int r : g->members[n]) member_counts.push_back(layout.counts[static_cast<size_t>(r)]);
  const BlockLayout inside = BlockLayout::packed(member_counts);
  Tensor node_block = Tensor::empty({np->node_total[n]}, options);
  Tensor lane_buf = Tensor::empty({lane ? np->lane_total[j] : 0}, options);
  const BlockLayout lanes_layout = per_lane(*g, [&](size_t k) { return np->lane_total[k]; });
  Tensor all = Tensor::empty({lanes_layout.total()}, options);
  const Tensor src = in.contiguous();
  return std::make_unique<PhasedCollective>(std::vector<PhasedCollective::Phase>{
      [g, src, node_block, inside] {
        return g->node.backend().start_all_gather(src, node_block, inside);
      },
      [g, np, n, j, lane, node_block, lane_buf] {
        if (!lane) return Backend::completed();
        return g->lane.backend().start_all_gather(
            flat(node_block, np->piece_at[n][j], np->piece[n][j]), lane_buf, np->across(j));
      },
      [g, lane_buf, all, lanes_layout] {
        return g->node.backend().start_all_gather(lane_buf, all, lanes_layout);
      },
      [g, np, layout, lanes_layout, all, out] {
        for (size_t m = 0; m < g->members.size(); ++m)
          for (size_t k = 0; k < static_cast<size_t>(g->lanes); ++k)
            copy_piece(*g, *np, layout, m, k, all, lanes_layout.displs[k] + np->lane_at[m][k], out,
                       true);
        return Backend::completed();
      }});
}

std::unique_ptr<PendingCollective> start_hierarchical_reduce_scatter(
    std::shared_ptr<const NodeGroups> groups, const Tensor& in, const BlockLayout& layout,
    const Tensor& out) {
  const char* op = "hierarchical reduce_scatter";
  HAP_CHECK(groups != nullptr, op, ": no node groups");
  const std::shared_ptr<const NodeGroups>& g = groups;
  check_layout(*g, layout, op);
  const size_t me = my_rank(*g);
  HAP_CHECK(in.defined() && out.defined() && in.dtype() == out.dtype() &&
                in.numel() >= layout.total() && out.numel() == layout.counts[me],
            op, ": in ", in.str(), " and out ", out.str(), " do not match the layout (",
            layout.total(), " elements in, ", layout.counts[me], " out)");
  HAP_CHECK(in.dtype() != DType::U8, op, ": cannot sum u8 tensors (masks); cast them first");
  auto np = std::make_shared<const NodePieces>(node_pieces(*g, layout));
  const size_t n = static_cast<size_t>(g->node_index), j = static_cast<size_t>(g->local_rank);
  const bool lane = g->local_rank < g->lanes;
  const TensorOptions options = TensorOptions{}.with_dtype(in.dtype()).with_device(in.device());
  // Phase 1's buffer: lane by lane, every node's piece of that lane.
  const BlockLayout lanes_layout = per_lane(*g, [&](size_t k) { return np->lane_total[k]; });
  Tensor by_lane = Tensor::empty({lanes_layout.total()}, options);
  const Tensor src = in.contiguous();
  for (size_t m = 0; m < g->members.size(); ++m)
    for (size_t k = 0; k < static_cast<size_t>(g->lanes); ++k)
      copy_piece(*g, *np, layout, m, k, by_lane, lanes_layout.displs[k] + np->lane_at[m][k], src,
                 false);
  Tensor lane_buf = Tensor::empty({lane ? np->lane_total[j] : 0}, options);
  Tensor piece = Tensor::empty({lane ? np->piece[n][j] : 0}, options);
  Tensor node_block = Tensor::empty({np->node_total[n]}, options);
  const BlockLayout pieces_layout = per_lane(*g, [&](size_t k) { return np->piece[n][k]; });
  const int64_t my_at = np->member_at[me];
  return std::make_unique<PhasedCollective>(std::vector<PhasedCollective::Phase>{
      [g, by_lane, lanes_layout, lane_buf] {
        return g->node.backend().start_reduce_scatter(by_lane, lanes_layout, lane_buf);
      },
      [g, np, j, lane, lane_buf, piece] {
        if (!lane) return Backend::completed();
        return g->lane.backend().start_reduce_scatter(lane_buf, np->across(j), piece);
      },
      [g, piece, node_block, pieces_layout] {
        return g->node.backend().start_all_gather(piece, node_block, pieces_layout);
      },
      [node_block, out, my_at] {
        flat(out, 0, out.numel()).copy_from(flat(node_block, my_at, out.numel()));
        return Backend::completed();
      }});
}

}  // namespace hap::parallel
