// Program synthesis: best-first search over Hoare-triple instructions, from the available
// properties of inputs and parameters to the loss. Nodes are visited in a topological order that
// keeps few tensors live (narrow_order); a step picks a sharding signature for the next node
// (and, with ZeRO storage, how a parameter it reads first is stored), converts each input to the
// property the signature requires (the cheapest collective, method chosen per collective), and
// adds the computation. States are memoised on (next node, the
// properties held for every live tensor), and a child is dropped when a recent state of its group
// (same node, same live tensors and segments) dominates it: holds every property it holds, costs no
// more, uses no more memory. The heuristic prices chains of the remaining nodes at their best run
// (computation, leaves stored, conversions between chained nodes by cheapest conversion path):
// admissible, not always consistent (a state reached again more cheaply is expanded again), so
// the first complete program popped is optimal. A state that cannot fit whatever follows (its
// memory plus the least the remaining nodes must add) is dropped as out of memory.
#pragma once
#include <cstdint>
#include <vector>

#include "synth/cost_model.h"

namespace hap::synth {

// Which programs a strategy may use. HAP uses everything; the baselines are restrictions of the
// same search space.
struct SearchSpace {
  bool shard_inputs = true;             // inputs may be read as shards (batch/sequence parallel)
  bool inputs_must_shard_dim0 = false;  // data parallel: inputs are read split on dim 0
  bool shard_parameters = true;         // parameters may be stored Sharded (tensor parallel, ZeRO)
  bool allow_slice = true;              // Replicated -> Sharded by a local slice
  // Megatron tensor parallelism (the tp baseline) uses neither of these two.
  bool allow_reduce_scatter = true;  // Partial -> Sharded(d)
  bool allow_all_to_all = true;      // Sharded(a) -> Sharded(b)
  // Sharded(d) -> Replicated of anything but a parameter. Megatron's tensor parallelism gathers
  // no activation: column-parallel products feed row-parallel ones, whose Partial sums are
  // all-reduced (the tp baseline forbids it, and allows it only where no such program exists).
  bool allow_activation_all_gather = true;
  // Tensor parallelism proper (the tp baseline): the weight of every Linear/MatMul is stored
  // Sharded (column- or row-parallel), never Replicated.
  bool linear_weights_must_shard = false;
  // Expert parallelism (the dp-ep baseline): expert weights (parameters of 3 or more dims used as
  // a matrix product's second operand) are stored Sharded(0), whatever shard_parameters says.
  bool expert_weights_must_shard = false;
  // ZeRO storage: a parameter that a node reads whole may instead be stored Sharded(0) (with its
  // gradient and optimizer state) and all-gathered for the read, the gathered copy kept for
  // backward or gathered again there (Instruction::regather; not for a parameter a view op
  // reads, whose views would hold the gathered copy). Needs shard_parameters; only parameters
  // with at least one row per device.
  bool zero_storage = false;
  // With zero_storage: every parameter it may store Sharded(0) that a node reads whole is stored
  // so (ZeRO-3 for all of them), never Replicated (nor with its factors broadcast).
  bool zero_storage_everywhere = false;
  // Sufficient factor broadcasting: at a product whose parameters it alone reads (stored
  // Replicated), the parameters' gradients may be computed whole on every device from the
  // all-gathered input and output gradient (InstrKind::FactorBroadcast) instead of all-reducing
  // each device's partial gradient.
  bool factor_broadcast = false;
  int64_t max_states = 2'000'000;  // expansion budget; exceeding it is an error
  bool dominance_pruning = true;   // drop children a recent state of their group dominates
  // Visit nodes in narrow_order (few tensors live at once) rather than program order.
  bool narrow_order = true;
  // Where memory binds, also run the memory-aware pass after a fast pass that found a program
  // (off: only when it found none; the synthesizer's intermediate rounds).
  bool memory_exact = true;
  // Where the fast pass finds no program that fits, give up at once (no memory-aware pass, and
  // an error that does not search again to say by how much the fastest program is short):
  // searches whose failure is only a candidate lost (the synthesizer's ladder of tighter limits).
  bool quick_out_of_memory = false;
  // Where no program fits, search once more without limits to say by how much the fastest one is
  // short (off: the error names the device that ran out first; for searches whose failure only
  // rules a candidate out, its message unread).
  bool explain_out_of_memory = true;
};

// The search expanded SearchSpace::max_states states without reaching the loss.
class SearchBudgetError : public Error {
 public:
  using Error::Error;
};

struct SearchResult {
  std::vector<Instruction> instructions;
  std::vector<Prop> storage;  // per graph tensor: how a parameter or input is held
  double cost_s = 0;
  int64_t states_expanded = 0;
  int64_t states_dominated = 0;  // children dropped because a state held in memory dominates them
  std::vector<double> device_memory_bytes;
  // A state that ran out of memory could have led to a cheaper program than this one (the fast
  // pass's memo may have kept a path that later ran out over one that fits): only a memory-aware
  // pass can say (search_program runs it unless SearchSpace::memory_exact is off).
  bool memory_may_matter = false;
};

// ratios[segment][device]; node_segment[node]. Throws hap::Error when no program fits every
// device's memory (naming the device and the shortfall of the closest program).
SearchResult search_program(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                            const std::vector<int>& node_segment, const SearchSpace& space);

// The memory-aware pass alone, looking for a program cheaper than `bound` under these ratios;
// false if it finds none (or reaches space.max_states first). out->states_expanded is set either
// way.
bool search_leaner_program(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                           const std::vector<int>& node_segment, const SearchSpace& space,
                           double bound, SearchResult* out);

// The search's lower bound of the cost of any program under these ratios (its heuristic at the
// start: chains of nodes priced at their best run, see Expander::heuristic). Never above the
// optimum; for tests.
double search_lower_bound(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                          const std::vector<int>& node_segment, const SearchSpace& space);

// The obviously-correct reference: every combination of signatures, depth first, no memo and no
// heuristic. Exponential; for tests on small graphs only.
SearchResult exhaustive_search(const CostModel& cm, const std::vector<std::vector<double>>& ratios,
                               const std::vector<int>& node_segment, const SearchSpace& space);

// Per-device memory of a finished program under the given ratios. A reshard priced at zero
// (its two segments' shards agree) holds nothing new, unless every_reshard_moves (the ratio LP,
// under whose ratios it may move).
std::vector<double> program_memory(const CostModel& cm, const std::vector<Instruction>& instrs,
                                   const std::vector<Prop>& storage,
                                   const std::vector<std::vector<double>>& ratios,
                                   bool every_reshard_moves = false);

}  // namespace hap::synth
