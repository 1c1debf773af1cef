// Loading a cluster description (synth/cluster.h) from YAML (`hap-plan --cluster c.yaml`).
//
// Schema (every number may be written 1e9, 1.25e9, 2.0e-5, ...):
//
//   name: emu-2node                 # optional; defaults to the file name without its extension
//   inter_node:                     # the link between nodes; required iff there are >= 2 nodes
//     {bandwidth_bytes_per_s: 1.25e8, latency_s: 2.0e-4}
//   nodes:                          # a non-empty sequence; ranks follow it, node by node
//     - name: node0                 # optional; defaults to node<i>; unique
//       link: {bandwidth_bytes_per_s: 5.0e9, latency_s: 5.0e-6}   # inside the node; required
//       devices:                    # a non-empty sequence
//         - {name: cpu0, type: cpu-0.8core, flops_per_s: 3.2e10, memory_bytes: 4.0e9}
//         - {type: v100-32gb, flops_per_s: 3.86e12, memory_bytes: 32GiB, count: 8}
//
// Device keys: `type` (required, non-empty), `flops_per_s` (required, in [1e3, 1e18], effective
// rather than peak; or a number of CPU cores in (0, 4096] with the unit `cores`, e.g. "0.8 cores",
// which is that many times this machine's per-core rate (train/core_rate.h): for emulated
// clusters, whose ranks are shares of a core whatever the CPU model), `memory_bytes` (required: a
// whole number of bytes in [1, 1e15], or a number with a unit B, KB (or kB), MB, GB, TB (powers of
// 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 32GiB or "1.5 GB", rounded to whole bytes),
// `count` (optional integer in [1, 65536], default 1: the entry stands for that many identical
// devices; at most 65536 devices in the whole file) and `name` (optional, unique in the cluster;
// not allowed with count > 1; defaults to <node>.<type>.<i>, i counting the node's earlier devices
// of that type from 0), `cpu_quota` (optional, in (0, 1]: on an emulated cluster, the share of one
// CPU core scripts/hap-emulate caps the rank to; the planner ignores it), `sm_count` (optional
// integer in [1, 4096], not with cpu_quota: on a cluster emulated on one GPU, the SMs of the
// GPU the rank's green context holds, core/sm_partition.h; the planner ignores it too),
// `update_s_per_param`
// (optional, in [0, 1e-3], default 0: seconds of optimizer step per parameter element, as
// hap-profile measures it; the cost model adds it per stored parameter),
// `memory_bandwidth_bytes_per_s` (optional, 0 or in [1e3, 1e15], default 0 = not modelled: the
// cost model adds each op's bytes at this rate), `kernel_overhead_s` (optional, in [0, 1], default
// 0 = not modelled: seconds each kernel call costs whatever its size, as hap-profile fits it; the
// cost model adds it per forward and backward call of every op). Link keys: `bandwidth_bytes_per_s`
// (in [1e3, 1e15]) and `latency_s` (in [0, 10]), both required, and `collectives` (optional): a
// mapping from all_reduce, all_gather, reduce_scatter or all_to_all to {bandwidth_bytes_per_s,
// latency_s} (same ranges), figures for that collective over the link (hap-profile fits them); the
// cost model uses them instead of the link's own for that collective; and `overlap` (optional, in
// [0, 1], default 1): the share of a collective's time over the link that passes while the devices
// compute (hap-profile measures it; synth::Link::overlap). `inter_node` may also have `lanes`: a
// link mapping (the same keys) with the figures of the hierarchical collectives' lanes between
// nodes (synth::Cluster::lanes; hap-profile measures them); inter_node's own where absent.
//
// The ranges are physically plausible figures, generous on both sides (1 kFLOP/s to 1 EFLOP/s,
// 1 kB/s to 1 PB/s, up to 10 s of latency, 1 ms per parameter, 1 s per kernel call, 1 PB of
// memory): a value outside them is a typo or a unit mistake, and would overflow the cost model or
// break the ratio LP.
//
// Loading is strict like the training config (train/config.h): unknown, repeated, missing or
// mistyped keys and out-of-range values throw one ConfigError naming the file, the key path (list
// items by index: nodes[1].devices[0].flops_per_s), the value and the expectation, e.g.
//   configs/clusters/x.yaml: nodes[1].devices[0].flops_per_s: expected a number in [1000, 1e+18]
//   (FLOP/s of one device), got 0
// The loaded cluster always passes Cluster::validate().
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "synth/cluster.h"
#include "train/config.h"

namespace hap::train {

// What loading resolved besides the cluster.
struct ClusterLoadInfo {
  double core_flops_per_s = 0;  // the per-core rate "<x> cores" used; 0 when no device has one
};

// "cluster PATH: compute in CPU cores of R FLOP/s (where R came from)", for a file in cores; ""
// for one in FLOP/s. What hap-train and hap-plan print.
std::string core_rate_line(const std::string& path, const ClusterLoadInfo& loaded);

// Reads and validates the cluster file at `path`. Throws ConfigError on the first problem.
// `core_flops` gives one CPU core's FLOP/s for devices whose flops_per_s is in cores, called at
// most once and only when one is (empty: core_rate(), train/core_rate.h; an MPI run passes a
// function that takes rank 0's rate, so that every rank plans with the same figure).
synth::Cluster load_cluster_config(const std::string& path,
                                   const std::function<double()>& core_flops = {},
                                   ClusterLoadInfo* info = nullptr);

// The validated cluster as JSON, one device per rank (name, type, node, flops_per_s,
// memory_bytes, memory_bandwidth_bytes_per_s, kernel_overhead_s, update_s_per_param, cpu_quota,
// sm_count),
// with its nodes and links: for scripts (scripts/hap-emulate) that must
// not parse cluster files themselves.
nlohmann::json cluster_to_json(const synth::Cluster& cluster);

}  // namespace hap::train
