// The typed description of a cluster: devices (one per rank) grouped into nodes, with one link
// inside each node and one link between nodes. The synthesizer's cost model reads it; it knows
// nothing about YAML (train/cluster_config.h loads it from a file).
//
// Ranks are device indices: `devices[r]` is the device that rank r drives. A cluster loaded from
// YAML lists its devices node by node, in file order, so the ranks of a node are contiguous; a
// cluster built in code only has to keep `Device::node` and `Node::devices` consistent.
//
// Units: bandwidth in bytes/s, latency in s, compute in FLOP/s, memory in bytes.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace hap::synth {

// The collectives a link can be profiled for separately.
enum class Collective { AllReduce, AllGather, ReduceScatter, AllToAll };
inline constexpr int kNumCollectives = 4;
const char* collective_name(Collective c);  // "all_reduce", ...

// Latency and bandwidth of one collective over a link, as hap-profile fits them.
struct LinkTerms {
  double bandwidth_bytes_per_s = 0;  // 0: not given
  double latency_s = 0;
};

// A point-to-point path between two devices. Moving b bytes over it takes
// latency_s + b / bandwidth_bytes_per_s. A profiled link may also carry figures per collective
// (what a real implementation achieves differs by collective): for_collective() uses them where
// given, the link's own figures otherwise.
struct Link {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
  std::array<LinkTerms, kNumCollectives> collective = {};
  // The share of a collective's time over this link that can pass while its devices compute (a
  // collective started before the backward pass's next kernels and completed after them): 1 where
  // the transfer runs beside the kernels (a GPU's NCCL kernels and copy engines), less where the
  // device itself must drive it (a CPU rank advances MPI between its ops, under one CPU quota).
  // hap-profile measures it; 1 where not given. The cost model's step time moves the overlapped
  // channels (bucketed gradient all-reduces, parameter gathers) at this share of the link's pace
  // while the passes compute.
  double overlap = 1.0;

  double transfer_s(double bytes) const { return latency_s + bytes / bandwidth_bytes_per_s; }
  Link for_collective(Collective c) const {
    const LinkTerms& t = collective[static_cast<int>(c)];
    if (t.bandwidth_bytes_per_s <= 0) return {bandwidth_bytes_per_s, latency_s, {}, overlap};
    return {t.bandwidth_bytes_per_s, t.latency_s, {}, overlap};
  }
};

struct Device {
  std::string name;               // unique in the cluster
  std::string type;               // e.g. "v100-32gb"; descriptive only
  double flops_per_s = 0;         // effective (profiled), not peak
  std::int64_t memory_bytes = 0;  // usable by training
  int node = -1;                  // index into Cluster::nodes
  // Emulated clusters only (scripts/hap-emulate): the share of one CPU core this rank is capped
  // to. 0 for a real device. The planner never reads it; flops_per_s is what it plans with.
  double cpu_quota = 0;
  // Clusters emulated on one GPU only (scripts/hap-emulate): the SMs of the GPU this rank's green
  // context holds. 0 for a real device. The planner never reads it either.
  int sm_count = 0;
  // Seconds per parameter element of the optimizer step (and the gradient-norm pass) outside the
  // model's graph, e.g. AdamW; profiled by hap-profile. 0: not modelled.
  double update_s_per_param = 0;
  // Sustained memory bandwidth (profiled): the cost model adds each op's bytes at this rate to
  // its FLOPs at flops_per_s. 0: not modelled (FLOPs only).
  double memory_bandwidth_bytes_per_s = 0;
  // Seconds every kernel call costs on this device whatever its size (dispatch, launch, the
  // parts of a kernel that do not shrink with its rows), profiled: the cost model charges each
  // op's forward and backward calls this much besides their FLOPs and bytes at the rates above.
  // 0: not modelled (a kernel's time is proportional to its work).
  double kernel_overhead_s = 0;
};

struct Node {
  std::string name;          // unique in the cluster
  Link link;                 // between two devices of this node
  std::vector<int> devices;  // ranks (indices into Cluster::devices)
};

struct Cluster {
  std::string name;
  std::vector<Device> devices;
  std::vector<Node> nodes;
  Link inter_node;  // between devices on different nodes; unused (may be zero) with one node
  // Between nodes as the hierarchical collectives' middle phase uses it (parallel/hierarchical.h):
  // one rank of every node in each lane, every lane at once, each moving its part of the tensor,
  // priced with terms for one device per node and the whole tensor. hap-profile measures it on
  // the lanes themselves; a flat collective over every rank (what inter_node is fitted to) crosses
  // the link at other hops, with other latencies. Bandwidth 0: not given (inter_node's figures).
  Link lanes;
  const Link& across_lanes() const { return lanes.bandwidth_bytes_per_s > 0 ? lanes : inter_node; }

  // Number of devices (= number of ranks).
  int size() const { return static_cast<int>(devices.size()); }
  int num_nodes() const { return static_cast<int>(nodes.size()); }

  // Appends a node holding `node_devices` (their `node` field is overwritten) and returns its
  // index; the devices get the next ranks. Does not validate.
  int add_node(std::string node_name, Link link, std::vector<Device> node_devices);

  // Throws hap::Error naming the cluster, the device or node and the bad value for: no devices;
  // a device with an empty or duplicate name, or FLOP/s or memory that is not finite and > 0; a
  // node with no devices, a duplicate name, or a device list that disagrees with Device::node;
  // a link (of a node, or inter_node when there are several nodes) whose bandwidth is not finite
  // and > 0 or whose latency is not finite and >= 0.
  void validate() const;

  // The node of rank r. Throws hap::Error for a rank outside [0, size()).
  int node_of(int rank) const;

  // The link between ranks a and b: the node's link when they share a node (also for a == b),
  // inter_node otherwise.
  Link link_between(int a, int b) const;

  // The slowest link any pair of distinct ranks in `ranks` communicates over: the minimum
  // bandwidth and the maximum latency of the links used (these may come from different links,
  // e.g. a group with two devices on one node and one on another uses both the node link and
  // inter_node). A group of one rank communicates with nobody: {+infinity, 0}. Throws hap::Error
  // for an empty group, a rank out of range or a repeated rank.
  Link bottleneck(const std::vector<int>& ranks) const;
  // bottleneck() over every rank of the cluster.
  Link bottleneck() const;

  // Whether the ranks are on more than one node (same argument checks as bottleneck()).
  bool spans_nodes(const std::vector<int>& ranks) const;

  double total_flops_per_s() const;
  // Each device's share of the total FLOP/s, by rank; sums to 1 (up to rounding).
  std::vector<double> flops_ratios() const;
  // The smallest memory of any device (0 for a cluster without devices).
  std::int64_t min_memory_bytes() const;

  // The cluster of the given ranks only (ascending rank order; their nodes, links and names
  // kept): what a program that leaves the other devices out is planned on. Throws hap::Error for
  // an empty list, a rank out of range or a repeated rank.
  Cluster subset(std::vector<int> ranks) const;

  // A compact table: a header line with totals and the inter-node link, then per node its link and
  // one row per run of identical devices (ranks, count, type, FLOP/s, memory, share of FLOP/s).
  std::string summary() const;
};

}  // namespace hap::synth
