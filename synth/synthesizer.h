// The program synthesizer: alternates the best-first program search (with ratios fixed) and a
// linear program over the ratios (with the program fixed), while the predicted step time
// improves. Baseline strategies are restrictions of the same search.
#pragma once
#include <string>
#include <vector>

#include "synth/cost_model.h"
#include "synth/search.h"

namespace hap::synth {

class ShardLayout;  // synth/shard_layout.h

// dp-ep: DeepSpeed-MoE's expert parallelism: even data parallelism, except that expert weights
// (parameters used as the batched weight of a matrix product, [E, ...]) are stored split evenly
// along the experts (dim 0), with all-to-all between the batch split and the expert split.
enum class Strategy { Hap, DpEv, DpCp, Tp, DpEp };
const char* strategy_name(Strategy s);
// "hap", "dp-ev", "dp-cp", "tp", "dp-ep"; throws hap::Error listing the valid names.
Strategy parse_strategy(const std::string& name);
// Whether the graph has expert weights (what dp-ep splits): a parameter of 3 or more dims used as
// the second operand of a matrix product.
bool has_expert_weights(const Graph& graph);

// How nodes are grouped into segments, each with its own ratio vector. PerBlock: one segment per
// numbered module ("blocks.3", "layers.7") plus segment 0 for everything else.
enum class SegmentMode { PerBlock, Single };

// Activation recomputation (DistributedProgram::recompute). Auto: where no program fits in memory
// without it, or (hap) where memory shaped the program found without it and made it slower than
// the one found without limits by more than recomputing the least segment would cost (then the
// faster is kept), on as many segments as the fastest plan that fits needs (those that keep the
// most bytes per FLOP they would run again first; counts bisected from all down to the fewest
// that fit, then searched between those and all; with ZeRO storage of every parameter too);
// Off: never (where only recomputation would fit, the error says so); All: every segment (or
// those SynthesisOptions::recompute_segments marks).
enum class Recompute { Auto, Off, All };

// ZeRO storage (SearchSpace::zero_storage), hap only: parameters stored Sharded(0) with their
// gradients and optimizer state, all-gathered for use (the copy kept for backward or gathered
// again there) and their gradients reduce-scattered. Auto: where no program fits in memory
// without it (tried before recomputation), or where the plan without it fills a device to 90%
// and the plan with it is predicted faster; On: planned with it too wherever, the faster kept;
// Off: never (where only that would fit, the error says so); All: every parameter that a node
// reads whole stored so (SearchSpace::zero_storage_everywhere). On a cluster whose devices
// differ in speed, Auto and On also plan with All and keep that where predicted faster: each
// device then updates (and takes the gradient norm of) its share of those parameters instead
// of all of them at its own speed.
enum class ZeroStorage { Auto, Off, On, All };

// Sufficient factor broadcasting (SearchSpace::factor_broadcast, InstrKind::FactorBroadcast),
// hap only. Auto: the search may choose it; where its program does, the program without it is
// planned too and the faster by predicted step time kept (the gradient all-reduces it replaces
// may hide behind the backward pass, which the search's own pricing does not see). Off: never.
enum class FactorBroadcast { Auto, Off };

// The options ask for what cannot be: recomputation or ZeRO storage off for a model that fits
// only with it.
class OptionsError : public Error {
 public:
  using Error::Error;
};

struct SynthesisOptions {
  Strategy strategy = Strategy::Hap;
  SegmentMode segments = SegmentMode::PerBlock;
  int max_iterations = 8;  // search <-> LP rounds
  int64_t max_states = 2'000'000;
  bool dominance_pruning = true;  // SearchSpace::dominance_pruning (off: memoisation only)
  // Optimizer state tensors per parameter (the memory model's; see CostModel): AdamW's 2 by
  // default; train::optimizer_state_slots gives a run's.
  int optimizer_state_slots = 2;
  // Whether the executor overlaps gradient all-reduces with the backward pass (the cost model's
  // step_time prices it; parallel::ExecutorOptions).
  bool overlap_grad_comm = true;
  // Whether all-reduces may take the hierarchical form on clusters of several nodes
  // (CostModel::set_hierarchical: chosen where it is priced cheaper than the flat one).
  bool hierarchical_collectives = true;
  // The devices (cluster ranks) to plan on; empty: hap chooses (see select_devices), the
  // baselines take all.
  std::vector<int> devices;
  // hap only, with no devices pinned: also plan on subsets of the fastest devices (the k fastest
  // for k a power of two, and whole device classes), each judged first by its dp-cp program, the
  // best of them with hap too where its dp-cp is within 5% of hap on all devices, and leave the
  // others out where that is predicted faster (DistributedProgram::devices).
  bool select_devices = true;
  Recompute recompute = Recompute::Auto;
  std::vector<bool> recompute_segments;  // with All: the segments to recompute (empty: all)
  ZeroStorage zero_storage = ZeroStorage::Auto;
  FactorBroadcast factor_broadcast = FactorBroadcast::Auto;
  // Where no program fits, say by how much the fastest one is short (SearchSpace::
  // explain_out_of_memory: one more search). The synthesizer turns it off for the plans it only
  // tries (a recomputation count, a device subset, a storage candidate), whose errors it reads
  // no further than "out of memory".
  bool explain_out_of_memory = true;
};

// Sets p.nodes to each device's node in `cluster` (the program's own devices) where the program
// has a hierarchical all-reduce; leaves it empty otherwise.
void record_nodes(DistributedProgram& p, const Cluster& cluster);

// Segment of every node and the number of segments.
std::vector<int> assign_segments(const Graph& graph, SegmentMode mode, int* num_segments);

// The ratios minimising the predicted time of a fixed program (collective methods fixed), subject
// to each device's memory, solved with COIN-OR CLP. Every ratio is at least `min_share`
// (no zero-length shards). Returns false when the LP is infeasible.
bool optimize_ratios(const CostModel& cm, const std::vector<Instruction>& instrs,
                     const std::vector<Prop>& storage, int num_segments, double min_share,
                     std::vector<std::vector<double>>* ratios);

// Recomputes every instruction's cost under `ratios`, keeping each collective's method, and
// returns the predicted step time (step_time: the gradient all-reduces the backward pass hides
// are not counted). `granules`: the program's ShardLayout (built from `instrs`, under any
// ratios: only its granules are read), where the caller prices one program under many ratios.
double recost(const CostModel& cm, std::vector<Instruction>& instrs,
              const std::vector<std::vector<double>>& ratios,
              const ShardLayout* granules = nullptr);

// Each device's compute in one step under `ratios`: its time on every node it computes
// (CostModel::compute_device_s on whole-granule shards, kernel overheads included) and its
// optimizer updates (DistributedProgram::device_compute_s).
std::vector<double> device_compute_times(const CostModel& cm,
                                         const std::vector<Instruction>& instrs,
                                         const std::vector<std::vector<double>>& ratios);

DistributedProgram synthesize(const Graph& graph, const Cluster& cluster,
                              const SynthesisOptions& options);

}  // namespace hap::synth
