// Trainer: trains any nn::Model on a Dataset, on this process alone or on every rank of an MPI
// communicator, with one loop for both: learning-rate schedule (warmup + cosine), global-norm
// clipping, evaluation, progress lines and the JSONL metrics log, checkpoints of logical tensors
// (resumable on any plan, cluster or process count).
//
// On ranks, the model is traced (shapes only), a DistributedProgram is synthesized for the
// cluster (or read from a plan file), checked identical on every rank, and run by the SPMD
// executor: each rank holds only its shards of the parameters, reads only its rows of each batch
// and computes on its shards; the loss and the gradients are those of the single process.
//
//   auto model = hap::nn::build_model(hap::nn::find_model("gpt"), options, batch, seed);
//   auto data = hap::train::open_dataset(hap::train::find_dataset("bytes"), data_options,
//                                        model->inputs(batch), seed);
//   hap::train::Trainer trainer(model, data, train_config);           // one process
//   hap::train::Trainer trainer(model, data, train_config, comm, {cluster, synthesis});  // ranks
//   hap::train::TrainSummary s = trainer.fit();
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/timeline.h"
#include "models/model.h"
#include "models/optim.h"
#include "parallel/communicator.h"
#include "synth/cost_model.h"
#include "synth/synthesizer.h"
#include "train/config.h"
#include "train/dataset.h"

namespace hap::train {

// Stop requests: install_stop_signals() makes SIGTERM, SIGINT and SIGUSR1 ask the training loop
// to stop after the current step (another one, kStopRepeatWindowNs or more after the first, ends
// the process at once; sooner, it is the same request delivered twice, as `timeout` does to its
// child and the child's process group). fit() then writes a checkpoint (into
// train.checkpoint_dir, or to FitOptions::checkpoint_path) and throws StopRequested; on ranks a
// signal to any rank stops every rank after the same step.
inline constexpr int64_t kStopRepeatWindowNs = 1'000'000'000;
void install_stop_signals();
// The signal that asked to stop (0: none).
int stop_signal();
// For tests: as if `signo` had arrived (0 clears it).
void request_stop(int signo);

class StopRequested : public Error {
 public:
  StopRequested(const std::string& what, int signo) : Error(what), signo_(signo) {}
  int signo() const { return signo_; }
  int exit_code() const { return 128 + signo_; }

 private:
  int signo_;
};

struct FitOptions {
  std::string resume_path;      // checkpoint to resume from ("" = fresh start)
  std::string checkpoint_path;  // checkpoint written at the end ("" = none)
  int64_t stop_after = -1;      // stop after this step (the schedule still spans train.steps)
  bool quiet = false;           // no progress lines on stdout
  // At the end, print where the step time went: op kernels, and on ranks each collective.
  bool profile = false;
  // A Chrome trace / Perfetto timeline of steps trace_first..trace_last (0-based, inclusive; -1:
  // the second step run, and one step) of every rank, written to trace_path ("" = none).
  std::string trace_path;
  int64_t trace_first = -1;
  int64_t trace_last = -1;
  // The run's whole configuration for the log's first record (to_json of a RunConfig); null
  // leaves it out.
  nlohmann::json run_config;
};

// The newest checkpoint train.checkpoint_dir holds (step_<8 digits>.safetensors, or .hapt as
// earlier versions wrote, with the highest step), or "" when it holds none (or does not exist).
std::string newest_checkpoint(const std::string& dir);
// The periodic checkpoint of `step` in `dir`.
std::string checkpoint_file(const std::string& dir, int64_t step);

struct TrainSummary {
  int64_t steps_run = 0;
  double first_loss = 0;
  double last_loss = 0;
  double last_val_loss = -1;  // -1 when no evaluation ran
  double median_step_ms = 0;  // on ranks: of the slowest rank's step times
};

// "N steps, loss a -> b, val loss v, median m ms/step" (parts without data left out).
std::string summary_text(const TrainSummary& s);

// The median of step times (the upper one for an even count); 0 for none.
double median_of(std::vector<double> values);

// AdamW or SGD as the config says, with weight decay on parameters of dim >= 2 only.
std::unique_ptr<optim::Optimizer> make_optimizer(
    const TrainConfig& t, const std::vector<std::pair<std::string, Tensor>>& named);

// Optimizer state tensors per parameter of the optimizer `t` configures (AdamW 2, SGD with
// momentum 1, plain SGD 0), asked of the optimizer itself: what the planner's memory model counts.
int optimizer_state_slots(const TrainConfig& t);

// Training on MPI ranks: the cluster the ranks form, and how to get the program they run.
struct DistributedOptions {
  synth::Cluster cluster;
  synth::SynthesisOptions synthesis;
  std::string plan_file;  // run this plan (written by hap-plan --json) instead of synthesizing
  double collective_timeout_s = 300;         // parallel.collective_timeout_s (0: wait forever)
  CommBackend backend = CommBackend::kAuto;  // parallel.backend: what carries GPU collectives
  bool share_gpus = false;                   // parallel.share_gpus: ranks may share a GPU
};

class Engine;

class Trainer {
 public:
  // On this process. The model's parameters are trained in place.
  Trainer(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data, TrainConfig config);
  // On every rank of `comm`, which must have one rank per device of the cluster; every rank
  // constructs its Trainer with the same arguments. A model built with data (not under a
  // MetaGuard) gives each rank the slices of its values; a shape-only one is drawn shard by shard
  // from its init rules and Module::init_seed(). Throws ConfigError (identically on every rank)
  // when the world size does not match the cluster or the plan file is for another model or
  // cluster.
  Trainer(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data, TrainConfig config,
          parallel::Communicator comm, DistributedOptions distributed);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from step 0 (or the checkpoint's step) to train.steps (or stop_after). Throws
  // hap::Error for a non-finite loss or gradient norm (naming the step) and for checkpoints that
  // do not fit the model. On ranks, every rank calls it.
  TrainSummary fit(const FitOptions& options = {});
  // The mean validation loss over train.eval_batches batches.
  double evaluate();

  // Rank 0, or the one process: the one that prints, logs and writes checkpoints.
  bool is_lead() const;
  // A rank the program leaves out (it trains nothing; fit() waits for the others).
  bool left_out() const;
  int world_size() const;
  // On ranks: the program every rank runs, with the graph and cost model it was made for; null
  // on one process.
  const synth::DistributedProgram* program() const;
  const synth::CostModel* cost_model() const;
  // The logical (full, unsharded) value of a parameter, on every rank (a collective on ranks).
  Tensor parameter(const std::string& name) const;
  std::vector<std::string> parameter_names() const;
  const TrainConfig& config() const { return config_; }

 private:
  void save_checkpoint(const std::string& path, int64_t step) const;
  // Into train.checkpoint_dir, keeping the newest train.keep_checkpoints.
  void save_periodic_checkpoint(int64_t step) const;
  int64_t load_checkpoint(const std::string& path);
  void write_trace(const std::string& path, const std::vector<timeline::Span>& spans) const;
  // The metadata every checkpoint of this run carries (models/serialize.h).
  std::map<std::string, std::string> run_metadata(const nlohmann::json& run_config) const;

  std::shared_ptr<nn::Model> model_;
  std::shared_ptr<Dataset> data_;
  TrainConfig config_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  uint64_t random_seed_ = 0;         // dropout's seed: the model's, or a resumed checkpoint's
  double collective_timeout_s_ = 0;  // on ranks: the watchdog's (DistributedOptions)
  // What every checkpoint of this run records besides the step (set by fit()).
  std::map<std::string, std::string> checkpoint_metadata_;
};

}  // namespace hap::train
