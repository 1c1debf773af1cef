// Training on MPI ranks: plan (or check the plan) for the cluster, then run the synthesized
// program with the SPMD executor, each rank holding its shards and reading its rows of the batch.
#pragma once
#include "apps/common/config.h"
#include "apps/common/trainer.h"
#include "parallel/communicator.h"
#include "synth/cluster.h"
#include "synth/synthesizer.h"

namespace hap::app {

// The synthesizer's options for a run config's parallel section.
synth::SynthesisOptions synthesis_options(const ParallelConfig& p);

// The message of a synthesis error for the user: when the search ran out of states, it also names
// the key and the options that raise the budget.
std::string synthesis_error_message(const std::string& what, const ParallelConfig& p);

struct DistTrainOptions {
  synth::SynthesisOptions synthesis;
  std::string plan_json;  // write the plan here (rank 0); "" = none
  std::string plan_file;  // run this plan (from hap-plan --json) instead of synthesizing
  std::string checkpoint_path;  // write a checkpoint of logical tensors at the end ("" = none)
  std::string resume_path;      // resume from a checkpoint (from any plan, or one process)
  int64_t stop_after = -1;      // stop after this step (the schedule still spans train.steps)
  bool quiet = false;
  // Print, at the end, where each rank's step time went: op kernels and each collective (time per
  // step and calls per step), the rest being the executor, autograd and waiting outside MPI.
  bool profile = false;
};

// Every rank calls this with the same arguments. Throws hap::Error (ConfigError for a world size
// that does not match the cluster) identically on every rank where the inputs are the cause.
TrainSummary train_distributed(const TrainRunConfig& config, const synth::Cluster& cluster,
                               const DistTrainOptions& options, const parallel::Communicator& comm);

}  // namespace hap::app
