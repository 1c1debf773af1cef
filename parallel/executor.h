// The SPMD executor: runs a DistributedProgram on one rank. Parameters are this rank's shards,
// inputs are this rank's rows, computations run the graph's ops on local shards, and
// communication instructions run the differentiable collectives, so that backward() on the local
// loss yields this rank's local gradients (gradient convention: parallel/autograd_collectives.h).
//
// Every instruction kind is supported (a reshard between segments' ratios gathers, then slices);
// ops whose attributes hold global sizes are localised here (reshape, expand, mean and
// cross-entropy with global counts, dropout/attention-dropout slices, vocabulary-parallel
// embedding). An op signature the executor cannot localise is an error naming the op.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "parallel/communicator.h"
#include "synth/graph.h"
#include "synth/program.h"

namespace hap::parallel {

using ops::Prop;

// Produces the local part of a named logical tensor: `local_shape` elements at `slice` (an empty
// slice means the whole tensor).
using TensorSource = std::function<Tensor(const std::string& name, const Shape& local_shape,
                                          const LogicalSlice& slice)>;

// How forward() draws randomness and whether it trains.
struct ForwardOptions {
  // Added to the stream of every random op recorded in the graph (a model's per-step dropout
  // streams; see nn::kRandomStreamsPerStep).
  uint64_t random_offset = 0;
  // Replaces the seed the graph's random ops were traced with (a run resumed from a checkpoint
  // draws with the checkpoint's seed).
  std::optional<uint64_t> random_seed;
  // false: dropout (and attention dropout) is the identity, as in eval().
  bool training = true;
};

class Executor {
 public:
  // Checks that every rank holds the same program (size of the world = devices of the plan).
  Executor(const synth::Graph& graph, const synth::DistributedProgram& program, Communicator comm);

  // Creates this rank's parameters (leaves that require grad) from `source`.
  void materialize_parameters(const TensorSource& source);
  // name -> this rank's parameter tensor (its shard, or all of it when Replicated).
  const std::vector<std::pair<std::string, Tensor>>& parameters() const { return params_; }
  Prop storage(const std::string& name) const;

  // Runs the program's forward on this rank's inputs and returns the local loss, a Partial
  // (the global loss is the sum over ranks) ready for backward().
  Tensor forward(const TensorSource& inputs, const ForwardOptions& options = {});
  // Backward of the local loss from forward(): every rank's local gradients, then one all-reduce
  // per bucket (up to 32 MiB of one dtype, in parameter order) of the Replicated parameters'
  // Partial gradients, as data-parallel frameworks do, instead of one per parameter. The sums
  // are the same element by element (rank order) either way.
  void backward(const Tensor& local_loss);
  // The global loss (sum of the local ones), identical on every rank.
  double global_loss(const Tensor& local_loss) const;
  // The L2 norm of all gradients, counting Replicated parameters once.
  double global_grad_norm() const;
  // Scales every local gradient (global-norm clipping).
  void scale_grads(double factor) const;
  // The full logical gradient (or value) of a parameter, on every rank (for checks).
  Tensor gathered_grad(const std::string& name) const;
  Tensor gathered_value(const std::string& name) const;
  // The full logical tensor of a local tensor laid out like parameter `name` (e.g. an optimizer
  // state slot), on every rank.
  Tensor gathered_like(const std::string& name, const Tensor& local) const;
  // Where this rank's part of parameter `name` sits in the logical tensor (empty: all of it).
  LogicalSlice slice_of(const std::string& name) const;

  const Communicator& comm() const { return comm_; }

 private:
  struct Shard {
    int64_t offset = 0, length = 0;
  };
  void compute_granules();
  std::vector<int64_t> lengths(int tensor, const Prop& p, int segment) const;
  Tensor leaf_value(int tensor, const Prop& p, int segment, const TensorSource* inputs);
  Tensor run_compute(const synth::Instruction& in);
  Tensor gather(const Tensor& local, int tensor, const Prop& p, int segment) const;
  // cross_entropy with logits Sharded(1) (the vocabulary) and targets Replicated: this rank's
  // Partial addend of the loss.
  Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_offset, int64_t ignore_index) const;

  const synth::Graph& graph_;
  const synth::DistributedProgram& program_;
  Communicator comm_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::map<std::string, int> param_tensor_;  // name -> graph tensor
  std::map<int, Tensor> param_local_;        // graph tensor -> local leaf
  std::map<int, int> param_segment_;         // graph tensor -> segment its shard lengths use
  // Per tensor and dim, the granule its shards come in: a dim made by merging [B, T] into
  // [B * T] is split in whole rows of T, so that it lines up with the unmerged tensors.
  std::vector<std::vector<int64_t>> granule_;
  // Values of the current forward: graph tensor -> property -> local tensor.
  std::vector<std::map<std::string, Tensor>> values_;
};

}  // namespace hap::parallel
