// Profiling a real (or emulated) cluster: what hap-profile runs on every rank. Each rank
// measures its compute (GEMM rates, and a training step of the config's model on its share of
// the batch, split by the kernel profiler into FLOP/s for products and memory bandwidth for the
// rest), its optimizer update per parameter and its usable memory; each node's ranks, then all
// ranks, time the collectives at several sizes (even and uneven shards, padded and grouped), and
// each group's link is fitted with the cost model's own formulas (parallel/profile.h). Rank 0
// writes the cluster file, atomically, and checks that it loads.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"
#include "parallel/communicator.h"
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
};

// Collective over `world`. Throws ConfigError (on every rank alike) when the ranks of a node are
// not contiguous.
void profile_cluster(const RunConfig& config, const ProfileOptions& options,
                     const parallel::Communicator& world);

// Random inputs of the declared shapes: floats N(0, 1), integer inputs uniform in
// [0, num_classes) (or {0, 1}). The same values for the same (inputs, seed).
nn::Batch synthetic_batch(const std::vector<nn::InputSpec>& inputs, uint64_t seed);

}  // namespace hap::train
