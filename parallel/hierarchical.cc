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
  groups->node = comm.split(node_index, comm.rank());
  groups->lane =
      comm.split(groups->local_rank < groups->lanes ? groups->local_rank : -1, node_index);
  return groups;
}

namespace {

// Block j of `numel` elements cut into `lanes` even blocks goes to local rank j; the node's other
// ranks get empty blocks.
BlockLayout lane_layout(int64_t numel, int lanes, int node_size) {
  std::vector<int64_t> counts(static_cast<size_t>(node_size), 0);
  for (int j = 0; j < lanes; ++j)
    counts[static_cast<size_t>(j)] = numel / lanes + (j < numel % lanes ? 1 : 0);
  return BlockLayout::packed(counts);
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

}  // namespace hap::parallel
