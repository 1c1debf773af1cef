// Profiling a real cluster (hap-profile): this rank's GEMM rate, timed collectives on a group of
// ranks, and the link (latency, bandwidth) that best explains those times under the cost
// model's own pricing of each collective (synth::collective_terms), so a profiled cluster file
// predicts what was measured.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "synth/program.h"

namespace hap::parallel {

// The median of a non-empty sample (the mean of the middle two of an even count).
double median(std::vector<double> v);

// Median seconds of `reps` runs of an n x n x n matmul of `dtype` (f32 or bf16) on `device` (after
// one warm-up; on a GPU each run waits for the device), and the rate 2 n^3 / median.
struct GemmRate {
  int64_t n = 0;
  double median_s = 0;
  double flops_per_s = 0;
  DType dtype = DType::F32;
};
GemmRate profile_gemm(int64_t n, int reps, Device device = Device::cpu(), DType dtype = DType::F32);

// One timed collective on a group: every rank of the group calls it with its own shard.
struct CollectiveSample {
  synth::InstrKind kind =
      synth::InstrKind::AllReduce;  // AllReduce, AllGather, ReduceScatter, AllToAll
  CollectiveMethod method = CollectiveMethod::Grouped;
  int group_size = 0;
  double bytes = 0;      // the logical tensor
  double max_share = 0;  // the largest rank's share of it
  bool uneven = false;
  double seconds = 0;  // median over repetitions of the slowest rank's time
};

// Times `kind` on `comm` for an f32 tensor of `bytes` (rounded to whole rows of 256 floats, at
// least one row per rank) on `device` (GPU ranks: their tensors on their GPU, through whatever
// backend `comm` has, each call waited for) sharded by `ratios` (one per rank of comm).
// Collective over comm.
// With busy_s > 0 the rank computes for busy_s seconds of wall time (from a common barrier; each
// rank passes its own) before each timed call, as in training, where collectives come right after
// compute (a CPU quota partly spent when the call starts, a GPU's clocks as training leaves them).
// A sample is the time from the last rank's arrival at the call to the last rank's return: a rank
// that arrives late (more compute, or a quota's throttling) is compute, which the cost model
// prices per device, not a cost of the collective.
CollectiveSample time_collective(const Communicator& comm, synth::InstrKind kind,
                                 CollectiveMethod method, double bytes,
                                 const std::vector<double>& ratios, int reps, double busy_s = 0,
                                 Device device = Device::cpu());

// One collective for time_collectives: as time_collective's arguments.
struct CollectiveSpec {
  synth::InstrKind kind = synth::InstrKind::AllReduce;
  CollectiveMethod method = CollectiveMethod::Grouped;
  double bytes = 0;
  std::vector<double> ratios;
};

// time_collective for each of `specs`, interleaved: `reps` rounds, each timing every collective
// once, so that a slow spell of a shared machine moves one repetition of many samples rather
// than every repetition of one; after_round(r) after round r (progress). Collective over comm.
std::vector<CollectiveSample> time_collectives(const Communicator& comm,
                                               const std::vector<CollectiveSpec>& specs, int reps,
                                               double busy_s = 0, Device device = Device::cpu(),
                                               const std::function<void(int)>& after_round = {});

// How much of a collective passes while its ranks compute (synth::Link::overlap): every rank
// starts an all-reduce of `bytes` (f32, through the backend training uses for its gradient
// buckets) and computes small products, testing the collective after each as the executor does
// between the backward pass's ops, about as long as the collective alone takes, then waits for
// it. With c the collective alone, w the products alone and t the two together (medians over
// `reps`, each the slowest rank's, every rank starting from a common barrier), the collective
// moves at `overlap` of its pace while the products run, as synth::step_time prices it:
// t = w + c - overlap * w, so overlap = (c + w - t) / w, clamped to [0, 1] (1: it moves at full
// pace beside the products, 0: not at all).
struct OverlapSample {
  double bytes = 0;
  double collective_s = 0;
  double compute_s = 0;
  double together_s = 0;
  double overlap = 1;
};
OverlapSample time_overlap(const Communicator& comm, double bytes, int reps,
                           Device device = Device::cpu());

// The link that best explains the samples: latency_s >= 0 and bandwidth > 0 minimising the sum
// of squared relative errors of latency_terms * latency_s + byte_terms / bandwidth against the
// measured seconds. Throws hap::Error for fewer than two samples.
struct LinkFit {
  double bandwidth_bytes_per_s = 0;
  double latency_s = 0;
  double rms_relative_error = 0;  // of the fitted prediction over the samples
};
LinkFit fit_link(const std::vector<CollectiveSample>& samples);

// Bytes this rank may use: the smaller of the node's available memory (MemAvailable) divided by
// `ranks_on_node` and the limit of the rank's memory cgroup, if any. On a GPU (`device` cuda:N,
// `ranks_on_node` then the ranks sharing it): the GPU's free memory divided among them, or the
// allocator's cap (HAP_CUDA_MEMORY_CAP) where that is smaller.
int64_t usable_memory_bytes(int ranks_on_node, Device device = Device::cpu());

}  // namespace hap::parallel
