// The cost model: per-device compute time of a node under a sharding signature, collective times
// priced with latency + bytes / bottleneck-link bandwidth for the padded and grouped methods (and
// per node for hierarchical all-reduces), and per-device memory. Every cost is "forward + backward"
// of one training step.
#pragma once
#include <utility>
#include <vector>

#include "synth/cluster.h"
#include "synth/graph.h"
#include "synth/program.h"

namespace hap::synth {

// A cost that is affine in one segment's ratio vector r per device:
// max_d (coef[d] * r[d] + fixed[d] where r[d] > 0) + constant_s. Compute on shards and padded
// collectives have this form (compute's `fixed` the device's kernel overheads, paid by a device
// that gets any of the work); replicated compute and grouped collectives are constants. The LP
// over ratios reads these terms.
struct LinearCost {
  std::vector<double> coef;   // per device; empty for a constant
  std::vector<double> fixed;  // per device, with coef; empty for none
  double constant_s = 0;
  double eval(const std::vector<double>& r) const;
};

// The cost model's price of one forward collective over P devices on one link, as two terms:
// time_s = latency_terms * latency_s + byte_terms / bandwidth_bytes_per_s. `bytes` is the logical
// tensor's size, `max_share` the largest device's share of it (1/P when even; unused by the
// methods whose cost does not depend on the ratios). CostModel::communication prices every
// collective this way (plus the backward adjoint where a gradient flows); hap-profile fits a
// link's latency and bandwidth to measured times with the same terms, so the figures it writes
// mean what the planner reads them as.
struct CollectiveTerms {
  double latency_terms = 0;
  double byte_terms = 0;
};
CollectiveTerms collective_terms(InstrKind kind, CollectiveMethod method, int num_devices,
                                 double bytes, double max_share);

class CostModel {
 public:
  // `optimizer_state_slots`: tensors of optimizer state per parameter tensor, each the size of the
  // parameter (AdamW 2, SGD with momentum 1, plain SGD 0): a stored parameter costs the parameter,
  // its gradient and these in memory.
  // `overlap_grad_comm`: whether the executor overlaps its gradient all-reduces with the
  // backward pass (parallel::ExecutorOptions), which step_time() prices.
  CostModel(const Graph& graph, const Cluster& cluster, int optimizer_state_slots = 2,
            bool overlap_grad_comm = true);
  bool overlap_grad_comm() const { return overlap_grad_comm_; }

  const Graph& graph() const { return graph_; }
  const Cluster& cluster() const { return cluster_; }
  int num_devices() const { return static_cast<int>(cluster_.devices.size()); }

  // The sharding signatures of a node (from the op registry); index -1 is all-Replicated.
  const std::vector<ops::ShardSignature>& signatures(int node) const { return sigs_[node]; }
  Prop input_prop(int node, int sig, size_t input) const;
  Prop output_prop(int node, int sig, size_t output) const;
  // Whether a signature splits the work over devices (some output not Replicated).
  bool splits_work(int node, int sig) const;
  // Whether tensor t needs a gradient (it depends on a parameter through differentiable ops).
  bool requires_grad(int tensor) const { return requires_grad_[tensor]; }

  // Activation recomputation (DistributedProgram::recompute): the nodes of the segments marked
  // run their forward again in backward (their compute costs 1 + the forward's share more, all
  // of it in the backward pass), and what is read only inside one such segment is not kept for
  // backward (held only while that segment is recomputed: program_memory() adds the largest).
  // The forward collectives of a recomputed segment's instructions run again in backward too
  // (parallel::Executor::plan_recomputation): recompute_factor() prices them so.
  void set_recompute(const std::vector<int>& node_segment, const std::vector<bool>& segments);
  bool recomputed(int node) const { return !recomputed_.empty() && recomputed_[node]; }
  bool segment_recomputed(int segment) const {
    return segment >= 0 && static_cast<size_t>(segment) < recomputed_segments_.size() &&
           recomputed_segments_[static_cast<size_t>(segment)];
  }
  // What a communication instruction's forward + backward price is multiplied by where its
  // forward runs again in the backward pass: a collective (all-gather, reduce-scatter,
  // all-reduce, all-to-all, reshard) of a recomputed segment (Instruction::segment, as the
  // executor reads it), except a bucketed parameter gather, whose gathered copy the
  // recomputation reads. Its forward run is priced as its adjoint is (step_time: half of the
  // price where the tensor needs a gradient): 1.5 with a gradient, 2 without; 1 elsewhere.
  double recompute_factor(const Instruction& in) const;
  // Whether a copy of tensor t a program makes is kept from the forward to the backward pass: it
  // needs a gradient and is not read only inside one recomputed segment.
  bool kept_for_backward(int tensor) const {
    return requires_grad_[tensor] && (dropped_.empty() || !dropped_[tensor]);
  }
  // The recomputed segment whose recomputation holds tensor t again (-1: none).
  int recomputed_segment(int tensor) const {
    return dropped_.empty() || !dropped_[tensor] ? -1 : dropped_segment_[tensor];
  }
  // Kernel calls of a node in one step: its forward, its backward where a gradient flows through
  // it, and its forward again where it is recomputed. Each costs the device's kernel_overhead_s.
  int kernel_calls(int node) const { return kernel_calls_[node] + (recomputed(node) ? 1 : 0); }
  // The kernel calls of the whole graph in one step (what hap-profile divides a step's fixed
  // time by).
  int step_kernel_calls() const;
  // The part of a node's time on a device that does not shrink with its share: its kernel calls
  // at the device's kernel_overhead_s.
  double fixed_compute_s(int node, int device) const {
    return kernel_calls(node) * cluster_.devices[device].kernel_overhead_s;
  }
  // FLOPs of forward + backward of a node.
  double step_flops(int node) const { return step_flops_[node]; }
  // Bytes read and written by forward + backward of a node.
  double step_bytes(int node) const { return step_bytes_[node]; }
  // The part of a node's forward + backward time that is its backward (by FLOPs, or bytes for
  // ops without FLOPs; 0 for a node no gradient flows through; a recomputed node's forward run
  // again in backward counts as backward).
  double backward_fraction(int node) const;

  // Compute time as a linear cost in the ratios (what the ratio LP reads): device_compute_s per
  // unit of share plus, where kernel overheads are profiled, fixed_compute_s on every device with
  // a share (a node that splits nothing costs the slowest device's whole time and overhead).
  LinearCost compute(int node, int sig) const;
  // The collectives the node's op makes itself under signature `sig` in one step (OpDef::
  // own_collectives: the row-split cross-entropy's sum of target counts, the vocabulary split's
  // gather of log-sum-exps and its adjoint), at the bottleneck link's figures: a time every
  // device spends, which does not shrink with its share. compute() includes it; the per-device
  // compute times (compute_device_s) do not, and recost() adds it to each device's.
  double own_collectives_s(int node, int sig) const;
  // The part of own_collectives_s in the backward pass: the backward's own, and the forward's
  // again where the node is recomputed.
  double own_collectives_backward_s(int node, int sig) const;
  // Each device's share of a node's work under ratios r: its whole-row shard of the split
  // dimension over that dimension's length (r itself where the signature splits nothing). With
  // fewer rows than devices some get none and others a row each, whatever the ratios.
  // With a granule (synth/shard_layout.h: the program's shards of that dimension come in whole
  // multiples of it), the shards are whole granules.
  std::vector<double> compute_shares(int node, int sig, const std::vector<double>& r,
                                     int64_t granule = 1) const;
  // The tensor and dimension a signature splits a node's work along: the first Sharded output's,
  // else the first Sharded input's (a row-parallel product's contraction); {-1, -1} for none.
  std::pair<int, int64_t> split_dim(int node, int sig) const;
  // Compute time under ratios r on whole-row shards: compute(node, sig) at compute_shares, the
  // slowest device's of compute_device_s.
  double compute_s(int node, int sig, const std::vector<double>& r, int64_t granule = 1) const;
  // Each device's compute time under ratios r on whole-row shards: its share's time plus its
  // kernel overheads where it has a share (the whole node's where the signature splits nothing).
  std::vector<double> compute_device_s(int node, int sig, const std::vector<double>& r,
                                       int64_t granule = 1) const;
  // The same from each device's share of a splitting signature's work (compute_shares' result,
  // which a caller pricing many nodes on the same shards may compute once).
  std::vector<double> compute_device_s_at(int node, const std::vector<double>& share) const;
  // Seconds of forward + backward of the whole of `node` on `device`: its FLOPs at the device's
  // FLOP/s plus, where the device's memory bandwidth is known, its bytes at that bandwidth (what
  // makes element-wise ops, norms and copies cost more than their few FLOPs suggest); the part
  // that scales with the device's share (fixed_compute_s not included).
  double device_compute_s(int node, int device) const;
  // The optimizer step of a parameter stored as `stored` (Replicated or Sharded): its elements on
  // each device times the device's update_s_per_param (zero where that is not profiled).
  LinearCost update(int tensor, const Prop& stored) const;
  // Cost of converting tensor t (full logical size) from `from` to `to` with `method`; the
  // instruction kind follows from the two properties. Backward adjoints are included; regather
  // (an AllGather whose copy backward gathers again, Instruction::regather) adds that gather.
  LinearCost communication(InstrKind kind, int tensor, CollectiveMethod method,
                           bool regather = false) const;
  // Sufficient factor broadcasting at a node under signature sig (InstrKind::FactorBroadcast):
  // allowed for a product whose backward reads only its inputs, under a signature with no
  // Partial input or output, every parameter input Replicated and some other input Sharded.
  bool factor_broadcast_allowed(int node, int sig) const;
  // Its backward cost: an all-gather (by `method`) of every Sharded input but the parameters and
  // of every Sharded output's gradient (one for all of them where they are split along dims of
  // one length and have one dtype, as the executor packs them), and the parameters' gradient
  // products on the whole batch
  // on every device, priced at the slowest one (the node's compute still counts its share of
  // them: an overestimate by at most that share).
  LinearCost factor_broadcast(int node, int sig, CollectiveMethod method) const;
  // The better method (padded vs grouped gathers) under ratios r, and its cost.
  CollectiveMethod best_factor_broadcast(int node, int sig, const std::vector<double>& r,
                                         double* cost_s) const;
  // The better method for a collective under ratios r (padded, grouped and, where available,
  // hierarchical; for an all-reduce, flat vs hierarchical), and its cost.
  CollectiveMethod best_method(InstrKind kind, int tensor, const std::vector<double>& r,
                               double* cost_s) const;

  // Hierarchical collectives (parallel/hierarchical.h): allowed by default; where allowed, an
  // all-reduce on a cluster of several nodes, one of them with several devices, is priced both
  // flat (a ring over every device at the bottleneck link) and hierarchical (a reduce-scatter
  // inside each node at its link, an all-reduce across nodes, an all-gather inside each node),
  // and the cheaper is chosen; all-gathers and reduce-scatters likewise (hierarchical_time). The
  // link between nodes is read as what one node sends to the others at a time: the lanes of the
  // middle phase share it.
  void set_hierarchical(bool allowed) { hierarchical_allowed_ = allowed; }
  // Whether the cluster has a hierarchical form distinct from the flat one (several nodes, one
  // of them with several devices), and whether, besides, it is allowed.
  bool hierarchical_possible() const;
  bool hierarchical_available() const { return hierarchical_allowed_ && hierarchical_possible(); }
  // The hierarchical form's lanes: the smallest node's number of devices.
  int hierarchy_lanes() const;
  // One all-reduce of `bytes` over every device in the given form (Hierarchical or a flat one),
  // split into its latency and its bandwidth parts.
  struct AllReduceTime {
    double latency_s = 0;
    double bytes_s = 0;
    double total_s() const { return latency_s + bytes_s; }
  };
  AllReduceTime all_reduce_time(double bytes, CollectiveMethod method) const;
  // One hierarchical all-gather or reduce-scatter (kind) of a tensor of `bytes` over every
  // device (parallel/hierarchical.h): two passes inside the nodes at their links, one across
  // them at the link between nodes, priced at even shares (a constant in the ratios).
  AllReduceTime hierarchical_time(InstrKind kind, double bytes) const;
  // The forms an all-gather or reduce-scatter may take: grouped, padded and, where available,
  // hierarchical.
  std::vector<CollectiveMethod> gather_methods() const;
  // The latency part of one collective pass over every device (what a bucket of many tensors
  // pays once): an all-gather's or a reduce-scatter's in `method`, or a gradient all-reduce's.
  double collective_latency_s(InstrKind kind, CollectiveMethod method) const;
  // The share of a gradient all-reduce's latency each parameter's GradAllReduce pays in its
  // cost_s (communication(): all of them as if in one bucket).
  double grad_all_reduce_latency_share_s(CollectiveMethod method) const {
    return collective_latency_s(InstrKind::GradAllReduce, method) / std::max(1, num_params_);
  }
  // The form of every gradient all-reduce (one per program, so that buckets are not split):
  // Hierarchical where available and cheaper for a full bucket (kGradBucketBytes), else Grouped.
  CollectiveMethod grad_all_reduce_method() const;
  // Whether a reshard of tensor t (Sharded along dim) between two segments' ratio vectors moves
  // anything: false when both give the same whole-row shard lengths (the executor then hands
  // the same shard on, so it costs neither time nor memory).
  bool reshard_moves(int tensor, int dim, const std::vector<double>& from_r,
                     const std::vector<double>& to_r, int64_t granule = 1) const;
  // The reshard's time: zero when nothing moves, otherwise what the executor does, an
  // all-gather under from_r (its better method goes to *method) and a free slice.
  double reshard_s(int tensor, int dim, const std::vector<double>& from_r,
                   const std::vector<double>& to_r, CollectiveMethod* method = nullptr,
                   int64_t granule = 1) const;
  // A linear stand-in for the ratio LP: bytes / bandwidth per unit of ratio change (the LP
  // cannot express the step from zero to a whole all-gather).
  double reshard_coef(int tensor) const;
  double latency_s() const { return link_.latency_s; }
  // The share of the overlapped channels' link time that passes while the devices compute (the
  // least of the links' Link::overlap): step_time() moves them at this share of their pace then.
  double overlap() const { return link_.overlap; }
  // Bytes held per byte of a stored parameter: itself, its gradient and the optimizer's state.
  double param_state_factor() const { return param_state_factor_; }

  // Bytes a device holds for tensor t with property p under ratios r (for memory).
  double held_bytes(int tensor, const Prop& p, double share) const;

  // Compute lower bound of the whole step: total FLOPs / total FLOP/s.
  double compute_lower_bound_s() const;

 private:
  const Graph& graph_;
  const Cluster& cluster_;
  Link link_;  // bottleneck link over all devices
  std::vector<std::vector<ops::ShardSignature>> sigs_;
  // Per node, per signature: own_collectives_s's forward and backward parts (empty: none).
  std::vector<std::vector<std::pair<double, double>>> own_s_;
  std::vector<bool> requires_grad_;
  std::vector<double> bytes_;              // per tensor: its whole size (read per search state)
  std::vector<bool> recomputed_;           // per node (empty: none)
  std::vector<bool> recomputed_segments_;  // per segment (empty: none)
  std::vector<bool> dropped_;              // per tensor (empty: none)
  std::vector<int> dropped_segment_;       // per tensor
  std::vector<double> step_flops_;
  std::vector<double> step_bytes_;
  std::vector<int> kernel_calls_;  // per node, recomputation aside
  int num_params_ = 0;             // parameter tensors of the graph
  double param_state_factor_ = 4.0;
  bool overlap_grad_comm_ = true;
  bool hierarchical_allowed_ = true;
};

// Whether an instruction is the all-gather of a parameter stored Sharded and kept for backward,
// which the executor runs in a bucket at the start of the forward pass, its gradient's
// reduce-scatter in a bucket of the backward pass (parallel::ExecutorOptions::
// bucket_parameter_gathers; the executor also asks that it gathers from how the parameter is
// stored, as every program the search makes does).
bool bucketed_parameter_gather(const Graph& graph, const Instruction& in);

// Whether the devices wait for each other at an instruction: a collective (in forward, or in
// backward where its adjoint moves a gradient), which holds the link. Between two such, each
// device runs its compute on its own, one kernel after another: the time of that stretch is its
// slowest device's sum, not the sum of each kernel's slowest device (they differ where devices'
// kernel overheads differ, or their FLOP/s and bytes/s in other proportions).
bool synchronizes(const CostModel& cm, const Instruction& in);

// The predicted time of one training step of a costed program (instruction costs set, as by
// synth::recost), in the executor's order: every instruction's forward part in program order,
// then every backward part in reverse order; the gradient all-reduces (and the reduce-scatters of
// bucketed parameter gathers, half of their cost) go, in the executor's buckets (reverse program
// order, one collective, method and dtype per bucket, up to kGradBucketBytes), to a channel of
// their own, one bucket at a time, each starting once the backward pass has completed its
// gradients (a parameter's gradient is complete after the backward of the first instruction that
// reads it); the optimizer's updates run after both. The bucketed parameter gathers (their
// all-gather half; kGatherBucketBytes a bucket) run one after another on a channel from the
// start of the forward pass, an instruction that first reads one of a bucket's parameters
// waiting for that bucket. A bucket pays one latency for all of its members. The channels share
// the link with the passes' own collectives (reshards, the adjoints of collectives in backward),
// which come first, the pass waiting on them: a channel moves only while its pass computes (or
// waits on that channel) and after. Without overlap the gathers run before the forward pass and
// the gradient channel starts when the backward pass ends.
struct StepTime {
  double step_s = 0;
  // Communication that computation hides: gradient all-reduces (and reduce-scatters) behind
  // the backward pass, bucketed parameter gathers behind the forward pass.
  double hidden_s = 0;
  // Latency the instructions' costs count once per tensor that a bucket pays once for all of
  // its members (the forward pass's parameter gathers, the backward pass's reduce-scatters and
  // gradient all-reduces): step_s = the sum of the costs - shared_latency_s - hidden_s.
  double shared_latency_s = 0;
};
StepTime step_time(const CostModel& cm, const std::vector<Instruction>& instrs);

}  // namespace hap::synth
