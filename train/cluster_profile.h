// Profiling a real (or emulated) cluster: what hap-profile runs on every rank. Each rank
// measures its compute (GEMM rates, and a training step of the config's model on its share of
// the batch, split by the kernel profiler into FLOP/s for products and memory bandwidth for the
// rest, and again on a second size, which sets apart a fixed cost per kernel call), its optimizer
// update per parameter and its usable memory; each node's ranks, then all ranks, time the
// collectives at several sizes (even and uneven shards, padded and grouped), and
// each group's link is fitted with the cost model's own formulas (parallel/profile.h). Rank 0
// writes the cluster file, atomically, and checks that it loads.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "ops/sharding.h"
#include "parallel/communicator.h"
#include "synth/program.h"
#include "train/config.h"

namespace hap::train {

struct ProfileOptions {
  std::string out_path;   // the cluster file to write
  std::string name;       // the cluster's name ("" = the file's stem)
  std::string node_name;  // this rank's node ("" = HAP_NODE_NAME or the hostname)
  std::string type;       // device type written to the file ("" = HAP_DEVICE_TYPE or cpu)
  std::string raw_path;   // also write every measurement as JSON ("" = no)
  bool quick = false;     // fewer sizes and repetitions (a smoke test, not a profile)
  double busy_ms = 20;    // compute this long before each timed collective, as in training
  // Ranks of one kind pool their compute measurements where each one's step is within a factor
  // 1 + pool_tolerance of their median (pooled_kinds); 0: every rank keeps its own figures.
  double pool_tolerance = 0.25;
};

// One timed collective of the profile: its kind and method, even or uneven shards, and the
// whole tensor's bytes.
struct CollectiveMeasurement {
  synth::InstrKind kind;
  ops::CollectiveMethod method;
  bool uneven;
  double bytes;
};

// A collective gets figures of its own only from this many samples; with fewer, the link's fit
// over all its collectives prices it. Two parameters fitted to 4 noisy times swung by up to 10x
// between profiles minutes apart: emu-2node's lanes (4 sizes each) fitted all_gather 3.0e8 B/s
// and 2.8 ms, then 1.1e8 B/s and 0.5 ms, and reduce_scatter 6.6 ms, where their fits over all
// 12 samples gave 1.20-1.28e8 B/s and 0.23-0.46 ms in all three.
constexpr size_t kMinSamplesPerCollective = 8;

// What each node's ranks, then all ranks, time: every collective in both methods (all-reduce in
// one), even and uneven shards, at 4 sizes from 4 KiB to 4 MiB (2 with --quick).
std::vector<CollectiveMeasurement> measurement_plan(bool quick);

// The lanes between nodes (synth::Cluster::lanes): the collectives the hierarchical forms run
// across nodes (all-reduce, padded all-gather and reduce-scatter), even shares. The groups'
// plan measures each collective in several forms at 4 sizes; the lanes run one form each, so
// they take twice the sizes, 4 KiB to 8 MiB: kMinSamplesPerCollective samples per collective,
// which gives each its own fit. (With 4 sizes each, emu-2node's lanes were priced by one fit over
// all 12 samples: 1.6e8 B/s in one profile, 1.1e8 in the next, where the link is 1.25e8.)
std::vector<CollectiveMeasurement> lanes_plan(bool quick);

// Collective over `world`. Throws ConfigError (on every rank alike) when the ranks of a node are
// not contiguous.
void profile_cluster(const RunConfig& config, const ProfileOptions& options,
                     const parallel::Communicator& world);

// The fixed part of a step's time read as fixed + rows * per_row through (rows, seconds)
// measurements: the least-squares line's value at zero rows (through two, the line through
// them); 0 where fewer than two row counts are given, a row count is not positive or a time not
// finite and > 0, or the time does not grow with the rows (then the step is read as proportional
// to its rows); never more than the smallest time. hap-profile divides it over the step's kernel
// calls (kernel_overhead_s).
double fit_fixed_step_s(const std::vector<std::pair<int64_t, double>>& points);

// Which ranks pool their compute measurements (hap-profile): ranks of one kind (equal `keys`:
// device type, device description, quota or SMs) share one group, and their steps are fitted
// together, except a rank whose step on the even share (`even_step_s`) is more than a factor
// 1 + `tolerance` from its kind's median (either way) or not a positive number, which keeps a
// group of its own: a device unlike its declared type. Groups are numbered by their first rank.
std::vector<int> pooled_kinds(const std::vector<std::string>& keys,
                              const std::vector<double>& even_step_s, double tolerance);

// The rows a rank measures its step at a second time, having measured it on `rows` of a batch of
// `batch`: its operating point where that is given (> 0) and differs, else twice the rows where
// the batch holds them, else half; 0 where none is possible (one row of a batch of one).
int64_t second_profile_rows(int64_t rows, int64_t operating, int64_t batch);

// Random inputs of the declared shapes: floats N(0, 1), integer inputs uniform in
// [0, num_classes) (or {0, 1}). The same values for the same (inputs, seed).
nn::Batch synthetic_batch(const std::vector<nn::InputSpec>& inputs, uint64_t seed);

}  // namespace hap::train
