// The SPMD executor: runs a DistributedProgram on one rank. Parameters are this rank's shards,
// inputs are this rank's rows, computations run the graph's ops on local shards, and
// communication instructions run the differentiable collectives, so that backward() on the local
// loss yields this rank's local gradients (gradient convention: parallel/autograd_collectives.h).
//
// The executor is generic: an op whose attributes or shards need adapting to one rank (a
// reshape's target, a mean's count, a dropout mask's slice, a vocabulary-parallel loss) says how
// in its registry entry (OpDef::local, ops/local.h), which the executor calls with a ShardContext;
// it never switches on op kinds. Shard lengths come from synth::ShardLayout, as the cost model's.
// The program's own gradient all-reduce and update instructions run with their methods.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "synth/graph.h"
#include "synth/program.h"
#include "synth/shard_layout.h"

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

// How backward() carries the program's gradient all-reduces.
struct ExecutorOptions {
  // true: each bucket's all-reduce starts as soon as the backward pass has completed its
  // gradients and runs while the backward pass goes on (on a communicator of its own, one
  // bucket at a time, advanced between backward ops); false: all of them after the backward
  // pass. The sums are the same, bit for bit.
  bool overlap_grad_comm = true;
  // The most bytes of one bucket (synth::kGradBucketBytes, which the cost model assumes).
  int64_t bucket_bytes = synth::kGradBucketBytes;
  // The most bytes of one bucket of parameter all-gathers at the start of forward()
  // (synth::kGatherBucketBytes): smaller than the gradients' so that the first layers' gathers
  // end early and the later ones run while those layers compute (with overlap_grad_comm).
  int64_t gather_bucket_bytes = synth::kGatherBucketBytes;
  // true: the all-gathers of parameters stored Sharded and kept for backward (ZeRO storage,
  // synth::Instruction::regather false) run in buckets started at the start of forward(), one
  // collective per bucket (with overlap_grad_comm, nonblocking: each completes where the
  // forward pass first reads one of its parameters, while the layers before compute), and
  // their gradients' reduce-scatters in backward()'s buckets beside the all-reduces
  // (overlapped like them); false: one differentiable all-gather each where the
  // program reads the parameter, its reduce-scatter where the backward pass reaches it. The
  // results are the same, bit for bit.
  bool bucket_parameter_gathers = true;
};

// What the last backward() did with its gradient buckets (for tests and the run log).
struct BackwardStats {
  int buckets = 0;                  // all-reduces and reduce-scatters started
  int scatter_buckets = 0;          // of them, reduce-scatters of parameters stored Sharded
  int started_during_backward = 0;  // of them, started before the backward pass had ended
};

class Executor {
 public:
  // Checks that the program is for a world of this size.
  Executor(const synth::Graph& graph, const synth::DistributedProgram& program, Communicator comm,
           const ExecutorOptions& options = {});

  // Creates this rank's parameters (leaves that require grad) from `source`.
  void materialize_parameters(const TensorSource& source);
  // name -> this rank's parameter tensor (its shard, or all of it when Replicated), in graph
  // order.
  const std::vector<std::pair<std::string, Tensor>>& parameters() const { return params_; }
  Prop storage(const std::string& name) const;

  // The model's buffers (the graph's State tensors, by name): every rank holds all of each, and
  // a training forward() updates them in place by the graph's state updates (a collective: the
  // full value of each updated statistic). Every State tensor must be given before forward().
  void set_states(const std::vector<std::pair<std::string, Tensor>>& states);
  const std::vector<std::pair<std::string, Tensor>>& states() const { return states_; }

  // Runs the program's forward on this rank's inputs and returns the local loss, a Partial
  // (the global loss is the sum over ranks) ready for backward().
  Tensor forward(const TensorSource& inputs, const ForwardOptions& options = {});
  // Backward of the local loss from forward(), and the program's gradient all-reduce
  // instructions: in reverse program order (the order the backward pass completes gradients),
  // consecutive ones of one method and dtype share one all-reduce of up to
  // options.bucket_bytes (a bucket), as data-parallel frameworks do, overlapped with the backward
  // pass unless options say not. The sums are the same element by element (rank order) whatever
  // the buckets and the overlap.
  void backward(const Tensor& local_loss);
  const BackwardStats& last_backward() const { return backward_stats_; }
  // The program's update instructions: `step` gets, once, the local tensors of the parameters
  // they name, in program order (an optimizer's fused update over exactly those).
  void update(const std::function<void(const std::vector<Tensor>& params)>& step) const;
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

  // Runs of recomputed segments' instructions (DistributedProgram::recompute), each run under
  // autograd::checkpoint.
  size_t recomputed_runs() const { return regions_.size(); }
  // Values of the last forward still in the executor's value map (for checks: the loss and the
  // state updates' values; every other value leaves after its last forward reader).
  size_t values_held() const;
  const Communicator& comm() const { return comm_; }
  const synth::ShardLayout& layout() const { return layout_; }

 private:
  class NodeContext;
  // A value of the forward: (graph tensor, prop_key of its property).
  using Key = std::pair<int, int>;
  using Values = std::vector<std::map<int, Tensor>>;  // graph tensor -> prop_key -> local value
  using Segments = std::vector<std::map<int, int>>;   // ... -> segment of its shard lengths
  // A run of one recomputed segment's forward instructions [first, end) (backward's and the
  // optimizer's between them skipped): run under autograd::checkpoint, its `inputs` (the values
  // it reads that come from before it) in, its `outputs` (those read after it) out.
  struct Region {
    size_t first = 0, end = 0;
    std::vector<Key> inputs, outputs;
    std::vector<int> input_segment;  // the segment reading each input first
  };
  std::vector<Key> reads(const synth::Instruction& in) const;
  std::vector<Key> writes(const synth::Instruction& in) const;
  void plan_recomputation();
  void run_instruction(const synth::Instruction& in, Values& values, Segments& segments,
                       const TensorSource* inputs, const ForwardOptions& options);
  void run_recomputed(const Region& r, const TensorSource& inputs, const ForwardOptions& options);
  // Marks a node's outputs so that its parameters' gradients come from the whole factors
  // (InstrKind::FactorBroadcast, autograd::gather_factors): its Sharded inputs and output
  // gradients all-gathered in backward with `method`.
  void factors(const synth::GraphNode& n, const NodeContext& ctx, const std::vector<Tensor>& args,
               const std::vector<Tensor>& outs, ops::CollectiveMethod method);
  std::vector<int64_t> lengths(int tensor, const Prop& p, int segment) const;
  Tensor leaf_value(int tensor, const Prop& p, int segment, const TensorSource* inputs);
  Tensor gather(const Tensor& local, int tensor) const;
  // The full logical value of a tensor of the current forward, on every rank (a collective).
  Tensor full_value(int tensor) const;
  void apply_state_updates();
  int param_tensor(const std::string& name) const;
  class GradBuckets;
  void plan_buckets();
  // Whether the executor runs this instruction's all-gather in a bucket (ExecutorOptions::
  // bucket_parameter_gathers): a parameter's, from how it is stored to Replicated, kept.
  bool bucketed_gather(const synth::Instruction& in) const;
  // The bucketed all-gathers, started at the start of forward() (nonblocking where the backend
  // and overlap_grad_comm allow, on the overlap communicator, one after another), each completed
  // into whole_ where forward() first reads one of its parameters (complete_gathers) or as the
  // forward pass goes (advance_gathers).
  void gather_parameters();
  void complete_gathers(size_t through);  // buckets up to and including `through`
  void advance_gathers();                 // those done by now, in order, without blocking
  // The communicator of the collectives overlapped with computation (made once, collectively).
  const Communicator& overlap_comm();

  const synth::Graph& graph_;
  const synth::DistributedProgram& program_;
  Communicator comm_;
  ExecutorOptions options_;
  Communicator grad_comm_;  // the overlapped all-reduces' own (made at the first backward)
  // Gradient buckets, in launch order: each a list of parameter tensors (graph ids).
  std::vector<std::vector<int>> buckets_;
  std::vector<ops::CollectiveMethod> bucket_methods_;  // per bucket: its all-reduce's form
  // Per bucket: a reduce-scatter of parameters stored Sharded (their whole_ copies' gradients)
  // rather than an all-reduce of Replicated ones.
  std::vector<bool> bucket_scatters_;
  // The bucketed all-gathers (bucketed_gather), in program order of their first gather: buckets
  // of parameter tensors, each with its method.
  std::vector<std::vector<int>> gather_buckets_;
  std::vector<ops::CollectiveMethod> gather_methods_;
  std::map<int, size_t> gather_bucket_of_;  // parameter tensor -> its gather bucket
  // This forward's gather buckets in flight: packed buffers and the collective; the first
  // gathers_done_ have been unpacked into whole_.
  struct GatherInFlight {
    ManyGather buffers;
    std::unique_ptr<PendingCollective> op;
  };
  std::vector<std::unique_ptr<GatherInFlight>> gathers_;
  size_t gathers_done_ = 0;
  double gather_waited_s_ = 0, gather_bytes_ = 0;
  // The whole copies the last forward() read of those parameters (leaves that require grad:
  // backward() reduce-scatters their gradients into the stored shards' and drops them).
  std::map<int, Tensor> whole_;
  bool buckets_planned_ = false;
  BackwardStats backward_stats_;
  synth::ShardLayout layout_;
  std::vector<std::vector<ops::ShardSignature>> sigs_;  // per node
  std::vector<std::pair<std::string, Tensor>> params_;
  std::map<std::string, int> param_tensor_;  // name -> graph tensor
  std::map<int, Tensor> param_local_;        // graph tensor -> local leaf
  std::map<int, int> param_segment_;         // graph tensor -> segment its shard lengths use
  Device device_ = Device::cpu();            // where this rank's parameters live
  std::vector<std::pair<std::string, Tensor>> states_;
  std::map<int, Tensor> state_value_;  // graph tensor -> the full buffer
  // Values of the current forward: graph tensor -> property (prop_key) -> local tensor, and the
  // segment whose shard lengths a Sharded value has.
  Values values_;
  Segments value_segment_;
  std::vector<Region> regions_;  // in program order
  // Per instruction: the values forward() drops after it (each value after its last forward
  // reader, the loss and the state updates' values aside).
  std::vector<std::vector<Key>> release_after_;
  // Nodes whose parameters' gradients come from broadcast factors (InstrKind::FactorBroadcast):
  // node -> the method of the gathers.
  std::map<int, ops::CollectiveMethod> factor_method_;
};

}  // namespace hap::parallel
