// The typed configuration of a training run (`hap-train --config run.yaml --set key=value`).
//
// A run file has the sections `model`, `data`, `train` and (optional) `parallel`; the model and
// the dataset are registered entries chosen by `name`, each with its own typed options.
// load_run_config() reads it with
// yaml-cpp, applies the `--set` overrides to the YAML tree, and validates everything once, so the
// rest of the app works with typed, in-range values and never looks a key up by name.
//
// Paths inside a run file (`data.path`, `train.log_file`) are used as written: a relative path is
// resolved against the current working directory of the process, not against the directory of
// the config file. Loading a config never touches the filesystem for them; the data loader and
// the logger report a path that does not exist.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "models/options.h"
#include "synth/synthesizer.h"

namespace hap::train {

// A config file that cannot be used. The message names the file, the key path, the offending value
// and what was expected, e.g.
//   configs/gpt.yaml: train.steps: expected an integer >= 1, got 0
class ConfigError : public hap::Error {
 public:
  using hap::Error::Error;
};

// For an app's top-level catch (...): prints the exception being handled as
// "PROG: config error: ..." (a ConfigError: exit code 2), "PROG: error: ..." (any other
// hap::Error), an out-of-memory message, or "PROG: internal error: ..." (anything else), and
// returns the exit code (2 for config errors, else 1). Messages longer than 2000 characters (a
// huge value quoted whole) keep their start and end, with how much was cut between.
int report_current_exception(const char* prog);
// `message` shortened to about `limit` characters: its start and end, and the count cut.
std::string cut_message(const std::string& message, size_t limit);

// The optimizers a training run can use (the YAML spelling is in to_string).
enum class Optimizer { kAdamW, kSgd };
std::string_view to_string(Optimizer optimizer);

// `model`: a model of the zoo (models/zoo.h) by name, and its options, checked against the
// entry's declared options (types, ranges, required keys, its cross-key check with the batch
// size) at load time.
struct ModelConfig {
  std::string name = "gpt";
  nn::Options options;
};

// `data`: a registered dataset (train/dataset.h) by name, and its options, checked likewise.
struct DataConfig {
  std::string name = "bytes";
  nn::Options options;
};

// Keys without a default here are required in the YAML file.
struct TrainConfig {
  std::int64_t batch_size = 0;  // examples per step (the global batch); required, in [1, 2^31)
  std::int64_t steps = 0;       // optimizer steps; required, >= 1
  Optimizer optimizer = Optimizer::kAdamW;  // required
  double lr = 0.0;                          // peak learning rate; required, > 0
  double min_lr = 0.0;                      // final learning rate, in [0, lr]; defaults to lr
  std::int64_t warmup_steps = 0;            // in [0, steps]
  double weight_decay = 0.0;                // >= 0
  double beta1 = 0.9;                       // AdamW, in [0, 1)
  double beta2 = 0.95;                      // AdamW, in [0, 1)
  double eps = 1e-8;                        // AdamW, > 0
  double momentum = 0.9;                    // SGD, in [0, 1)
  double grad_clip = 1.0;         // maximum global gradient norm, >= 0; 0 turns clipping off
  std::uint64_t seed = 1337;      // initialisation, dropout and the order of batches
  std::int64_t log_every = 10;    // steps between training-loss log lines, >= 1
  std::int64_t eval_every = 100;  // steps between evaluations, >= 1
  std::int64_t eval_batches = 8;  // batches per evaluation, >= 1
  std::string log_file;           // JSONL metrics log; empty means no log
  // Periodic checkpoints: every checkpoint_every steps (0: none) a checkpoint
  // checkpoint_dir/step_<8 digits>.safetensors, keeping the newest keep_checkpoints of them; one is
  // also written when the run ends or stops early. hap-train --resume auto resumes from the newest.
  std::int64_t checkpoint_every = 0;  // >= 0; > 0 needs checkpoint_dir
  std::string checkpoint_dir;
  std::int64_t keep_checkpoints = 3;  // >= 1
  int threads = 0;  // CPU threads, >= 0; 0 means all cores (one process) or one per rank (ranks)
  // Where this process trains: cpu, cuda (cuda:0) or cuda:N. On ranks (--cluster), node-local
  // rank k takes cuda:((N + k) mod the GPUs visible); ranks sharing a GPU communicate through the
  // host.
  Device device = Device::cpu();
  // The precision of the forward's compute: f32, or bf16 mixed precision (ops::AutocastGuard):
  // products in bf16 with f32 accumulation and bf16 activations out of them, norms, softmax and
  // the loss in f32, parameters, gradients and optimizer state in f32 (docs/architecture.md).
  DType precision = DType::F32;
};

// How to train on several ranks (used with hap-train --cluster, or hap-plan).
enum class CommBackend { kAuto, kNccl, kMpi };

struct ParallelConfig {
  synth::Strategy strategy = synth::Strategy::Hap;
  synth::SegmentMode segments = synth::SegmentMode::PerBlock;
  // States the program search may expand per round (synth::SynthesisOptions::max_states), >= 1000.
  std::int64_t search_budget = 2'000'000;
  // The watchdog: seconds a collective may wait for the other ranks before every rank that can
  // still run stops with an error naming it and the step (4 times as long in the first step,
  // which also warms up); 0 waits forever.
  double collective_timeout_s = 300;
  // What carries GPU ranks' collectives: nccl (one GPU per rank), mpi (through host memory; ranks
  // may share a GPU), or auto (nccl where every rank has a GPU of its own and NCCL loads, else
  // mpi). CPU ranks always use MPI; nccl there is an error.
  CommBackend backend = CommBackend::kAuto;
  // Whether GPU ranks of one node may share its GPUs when there are more ranks than GPUs (without
  // the emulator): off, such a run is an error, since each rank of a cluster file stands for a
  // GPU of its own, with the speed and memory the file gives; on (tests, debugging), ranks take
  // cuda:((N + node-local rank) mod GPUs) and share those GPUs' SMs and memory. A mixed GPU
  // cluster emulated on one GPU (scripts/hap-emulate, sm_count devices) shares it either way.
  bool share_gpus = false;
  // Whether gradient all-reduces run while the backward pass goes on (bucketed, as soon as
  // their gradients are complete) or after it; the planner prices the one chosen. The same
  // numbers either way.
  bool overlap_grad_comm = true;
  // The devices to train on, by name, comma-separated ("v100-0,v100-1"); empty: hap may leave
  // devices out where that is predicted faster (select_devices), the baselines use all. Ranks of
  // devices left out wait for the others.
  std::string devices;
  bool select_devices = true;
  // Whether all-reduces may run hierarchically on clusters of several nodes (a reduce-scatter
  // inside each node, an all-reduce across nodes, an all-gather inside each node), chosen per
  // all-reduce where the planner prices it cheaper than the flat one. Same numbers up to float
  // reassociation.
  bool hierarchical_collectives = true;
  // Activation recomputation (synth::Recompute): auto recomputes activations in backward only
  // where no program fits in memory without it, in as many segments as the fastest plan that
  // fits needs; off never (where only that would fit, the plan is an error saying so); all in
  // every segment.
  synth::Recompute recompute = synth::Recompute::Auto;
  // ZeRO storage (synth::ZeroStorage), hap only: parameters stored sharded with their gradients
  // and optimizer state, all-gathered for use (and again in backward where that saves the
  // memory) and their gradients reduce-scattered. auto where no program fits without it (tried
  // before recomputation) or a device is 90% full and it is predicted faster; on tried in every
  // plan, kept where predicted faster; off never; all for every parameter read whole. On
  // clusters whose devices differ in speed, auto and on also try all (each device then updates
  // its share), kept where predicted faster.
  synth::ZeroStorage zero_storage = synth::ZeroStorage::Auto;
  // Sufficient factor broadcasting (synth::FactorBroadcast), hap only: a product's weight
  // gradient computed whole on every device from its all-gathered input and output gradient
  // instead of all-reduced. auto where the search prices it cheaper and the step with it is
  // predicted faster than without; off never.
  synth::FactorBroadcast factor_broadcast = synth::FactorBroadcast::Auto;
};
std::string_view to_string(synth::SegmentMode segments);  // "per-block", "single"
std::string_view to_string(CommBackend backend);          // "auto", "nccl", "mpi"

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;  // optional section
  std::string source_file;  // the config path as passed to load_run_config
};

// One override of a config key, "section.key=value", and the command-line argument it came from,
// which messages about its value name. A plain string is a `--set` argument; an app option that
// sets a key (hap-plan --strategy dp-ev) passes its own spelling.
struct ConfigOverride {
  // Implicit, so that "train.steps=9" and the strings of --set convert.
  ConfigOverride(std::string assignment_text)
      : assignment(std::move(assignment_text)), argument("--set " + assignment) {}
  ConfigOverride(const char* assignment_text) : ConfigOverride(std::string(assignment_text)) {}
  ConfigOverride(std::string assignment_text, std::string argument_text)
      : assignment(std::move(assignment_text)), argument(std::move(argument_text)) {}

  std::string assignment;  // "parallel.strategy=dp-ev"
  std::string argument;    // "--set parallel.strategy=dp-ev", "--strategy dp-ev"
};

// Reads and validates the run file at `path`. Each override's value is parsed as a YAML scalar and
// replaces the file's value before validation, so it is checked exactly like a value in the file;
// a message about it says "(value from <argument>)". Throws ConfigError on the first problem.
RunConfig load_run_config(const std::string& path,
                          const std::vector<ConfigOverride>& overrides = {});

// A short multi-line human summary, for the start of a run.
std::string describe(const RunConfig& config);

// Every field, with the YAML spelling of enums, for the metrics log.
nlohmann::json to_json(const RunConfig& config);

// The synthesizer's options for a run: its parallel section, and the optimizer state the memory
// model counts.
synth::SynthesisOptions synthesis_options(const RunConfig& config);
// The ranks of `cluster` that parallel.devices names (ascending; empty when it is empty). Throws
// ConfigError naming parallel.devices for a name the cluster lacks, one named twice, or a list
// with no name in it.
std::vector<int> pinned_devices(const ParallelConfig& p, const synth::Cluster& cluster);
// The rank of the device named `name` in `cluster`, or -1.
int device_rank(const synth::Cluster& cluster, const std::string& name);

// The message of a synthesis error for the user: when the search ran out of states, it also names
// the key and the options that raise the budget.
std::string synthesis_error_message(const std::string& what, const ParallelConfig& p);

}  // namespace hap::train
