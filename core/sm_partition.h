// A GPU's streaming multiprocessors (SMs) shared out among the ranks of an emulated mixed
// cluster (scripts/hap-emulate with a cluster file whose devices have `sm_count`): every rank on
// the GPU runs in a CUDA green context holding its own group of SMs (core/cuda/green_context.h),
// so that four ranks on one GPU behave like four GPUs of different speed.
//
// The ranks are separate processes and the driver splits SMs per process: every rank splits the
// whole GPU the same way, in rank order, and keeps its own group, so that the groups are
// disjoint. This file is the arithmetic of that split (no GPU needed; tested everywhere); the
// driver calls are in core/cuda/green_context.cc.
//
// The environment a rank reads (hap-emulate sets it):
//   HAP_EMULATE_SMS       the SM counts of every rank sharing the GPU, in rank order: "64,32,16,16"
//   HAP_EMULATE_SM_GROUP  which of them this process takes (0-based)
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace hap {

// What the driver allows a partition of a GPU's SMs to be (cuDeviceGetDevResource: smCount,
// minSmPartitionSize, smCoscheduledAlignment; e.g. an H100 or H200: 132 SMs, groups of at least
// 8, in multiples of 8).
struct SmGranularity {
  int total = 0;
  int minimum = 1;
  int alignment = 1;
};

// The SM groups that the counts asked for get, in order: each count rounded to the nearest
// multiple of the alignment (halfway: up), which is what the driver then grants exactly. Throws a
// hap::Error naming `device` and the numbers where a count is below 1 or the partition minimum,
// more than the GPU has, or where the groups together need more SMs than it has.
std::vector<int> sm_groups(const std::vector<int>& asked, const SmGranularity& granularity,
                           const std::string& device);

// The partition and group a process was given in its environment (HAP_EMULATE_SMS,
// HAP_EMULATE_SM_GROUP), or an empty partition where HAP_EMULATE_SMS is unset. Malformed values
// (not a comma-separated list of positive integers, a group out of range or missing) throw a
// hap::Error naming the variable.
struct SmPartitionRequest {
  std::vector<int> asked;  // empty: no emulation
  int group = -1;
};
SmPartitionRequest sm_partition_from_environment();
// The same, from the variables' values (nullptr: unset).
SmPartitionRequest parse_sm_partition(const char* sms, const char* group);

}  // namespace hap
