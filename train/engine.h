// What train::Trainer's one loop runs a step with (internal to train/): the model itself on this
// process (make_local_engine), or the synthesized program through the SPMD executor on MPI ranks
// (make_spmd_engine). The loop, the schedule, clipping, logging and checkpoints are the
// Trainer's; an Engine only knows where the parameters live and how a step computes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"
#include "models/optim.h"
#include "train/trainer.h"

namespace hap::train {

class Engine {
 public:
  virtual ~Engine() = default;

  // The tensors the optimizer updates on this rank (all of each parameter, or its shard), with
  // their full names, in the model's order.
  virtual const std::vector<std::pair<std::string, Tensor>>& parameters() const = 0;

  // The forward of training step `step` on batch `step` of the train split, drawing dropout
  // from (seed, the step's streams); keeps what backward() needs and returns the global loss.
  virtual double forward(uint64_t step, uint64_t random_seed) = 0;
  // Gradients of the last forward on this rank's parameters (summed over ranks where they are
  // replicated).
  virtual void backward() = 0;
  // The L2 norm of all gradients of the logical parameters.
  virtual double grad_norm() const = 0;
  // One optimizer update of what this rank stores, its gradients times `grad_scale` (clipping).
  virtual void update(optim::Optimizer& optimizer, double grad_scale) = 0;
  // The global loss of validation batch `index`, without dropout or gradients; random ops that
  // stay on in evaluation (a masked-LM's masking) draw from (seed, step 0's streams).
  virtual double eval_loss(uint64_t index, uint64_t random_seed) = 0;

  // The model's buffers (running statistics) by full name, whole, the same on every rank; a
  // checkpoint reads them and a resume writes them in place (copy_from).
  virtual const std::vector<std::pair<std::string, Tensor>>& buffers() const = 0;

  // Checkpoints hold logical tensors: the full tensor of a local one laid out like parameter
  // `name` (a collective on ranks: every rank calls it, in the same order), and this rank's part
  // of a full one.
  virtual Tensor logical(const std::string& name, const Tensor& local) const = 0;
  virtual Tensor local_part(const std::string& name, const Tensor& full,
                            const Shape& local_shape) const = 0;

  // Rank 0 or the one process; the largest value over ranks (a step's time is its slowest
  // rank's); wait for every rank.
  virtual bool lead() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual double max_over_ranks(double value) const = 0;
  virtual void barrier() const = 0;
  // Every rank's `s`, in rank order (a collective on ranks).
  virtual std::vector<std::string> gather_strings(const std::string& s) const = 0;
  // What this rank's track in a --trace timeline is called ("rank 2: P100-1").
  virtual std::string track_name() const = 0;
  // Where the run trains, for its description ("one process on cuda:0", "4 ranks on cuda, their
  // collectives over nccl").
  virtual std::string placement() const = 0;

  // Starts timing kernels (and collectives); prints where `steps` profiled steps of `seconds`
  // went (rank 0 prints).
  virtual void start_profile() = 0;
  virtual void print_profile(double seconds, int64_t steps) = 0;

  // On ranks: the program and its cost model; null on one process.
  virtual const synth::DistributedProgram* program() const { return nullptr; }
  virtual const synth::CostModel* cost_model() const { return nullptr; }

  // A rank the program leaves out (synth::DistributedProgram::devices) trains nothing:
  // wait_for_the_others() returns once every rank that trains has called finish() (which they
  // do once, after their last step or before stopping on a signal). No-ops elsewhere.
  virtual bool left_out() const { return false; }
  virtual void wait_for_the_others() {}
  virtual void finish() {}
};

// One process trains on the CPU or on a GPU it sees: anything else is an error naming the device
// and why (no GPU visible, no such index, or no CUDA backend in this build). (trainer.cc)
void check_training_device(Device device);
// The GPU a rank trains on: with train.device=cuda:N, node-local rank k takes
// cuda:((N + k) mod the GPUs it sees), so ranks spread over a node's GPUs and share them when
// there are more ranks than GPUs (their collectives then go through the host; the trainer allows
// that only as gpu_sharing_error says). Collective over `comm`. (trainer.cc)
Device rank_device(Device device, const parallel::Communicator& comm);
// The GPUs this process sees for `device`'s kind (0 for the CPU or without a CUDA backend).
int visible_gpus(Device device);
// Whether this rank is one of a mixed GPU cluster emulated on one GPU (HAP_EMULATE_SMS set by
// scripts/hap-emulate), whose ranks share the GPU by design.
bool gpu_cluster_emulated();
// Why `node_ranks` GPU ranks of one node may not train on its `visible` GPUs ("" when they may):
// more ranks than GPUs, not emulated, and parallel.share_gpus off. No GPU at all is left to the
// device check, which names why.
std::string gpu_sharing_error(int node_ranks, int visible, bool emulated, bool share_gpus);
// Why NCCL may not carry the collectives of this run's GPU ranks ("" where it may): a cluster
// emulated on one GPU (`emulated`: gpu_cluster_emulated) runs each rank in a green context of
// some of the GPU's SMs, and NCCL launches its kernels in the GPU's primary context, on every SM,
// unordered with the rank's own kernels. parallel.backend=auto then takes MPI; nccl is an error.
std::string nccl_refusal(bool emulated);
// What carries the collectives of ranks on `device` (parallel.backend): MPI for CPU ranks; for
// GPU ranks NCCL (one GPU per rank), MPI staged through the host, or auto. Collective over `comm`.
// (spmd_engine.cc)
parallel::Communicator communicator_for(Device device, CommBackend backend,
                                        parallel::Communicator comm);

std::unique_ptr<Engine> make_local_engine(std::shared_ptr<nn::Model> model,
                                          std::shared_ptr<Dataset> data, const TrainConfig& config);
std::unique_ptr<Engine> make_spmd_engine(std::shared_ptr<nn::Model> model,
                                         std::shared_ptr<Dataset> data, const TrainConfig& config,
                                         parallel::Communicator comm,
                                         DistributedOptions distributed);

// Checks that `batch` holds exactly the declared inputs with `rows` rows (the shapes of
// `inputs` with the batch dim replaced); throws naming the dataset's mistake.
void check_batch(const nn::Batch& batch, const std::vector<nn::InputSpec>& inputs,
                 int64_t row_begin, int64_t row_end);

}  // namespace hap::train
