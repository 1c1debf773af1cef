// The synthesizer's output: a DistributedProgram = instructions (computations on local shards
// and communications between properties) + the ratios they were costed with + the method of
// every collective, with the predicted time and memory of each device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/sharding.h"

namespace hap::synth {

using ops::Prop;
using ops::PropKind;

using ops::CollectiveMethod;
using ops::method_name;

// The most bytes the executor's gradient all-reduces put in one bucket (parallel/executor.h);
// the cost model prices the overlap of the backward pass with buckets of this size.
constexpr int64_t kGradBucketBytes = int64_t{4} << 20;
// The most bytes of one bucket of the parameter all-gathers the executor starts at the start of
// the forward pass (ZeRO storage kept for backward); the cost model prices them so.
constexpr int64_t kGatherBucketBytes = int64_t{1} << 20;

enum class InstrKind : uint8_t {
  Compute,        // run graph node `node` under signature `signature` on local shards
  AllGather,      // Sharded(d) -> Replicated
  ReduceScatter,  // Partial -> Sharded(d)
  AllReduce,      // Partial -> Replicated
  AllToAll,       // Sharded(a) -> Sharded(b)
  Slice,          // Replicated -> Sharded(d), local (its backward gathers the gradient)
  Reshard,        // Sharded(d) under one segment's ratios -> Sharded(d) under another's
  GradAllReduce,  // backward only: sum the gradient of a Replicated tensor over ranks
  ToPartial,      // Replicated -> Partial: one rank keeps the value, the others zeros (local)
  Update,         // the optimizer step of parameter `tensor` on what each device stores (local)
  // Backward only, after the Compute of `node` (under `signature`): sufficient factor
  // broadcasting. The gradients of the node's parameters (stored Replicated, read by it alone)
  // are computed whole on every rank from its inputs and output gradients all-gathered in
  // backward (`method`), instead of summing each rank's Partial gradient with a GradAllReduce.
  // `tensor`: the node's first parameter.
  FactorBroadcast,
};
const char* instr_name(InstrKind k);

struct Instruction {
  InstrKind kind = InstrKind::Compute;
  int node = -1;         // Compute: graph node id
  int signature = -1;    // Compute, FactorBroadcast: index into the op's signatures; -1 = all R
  int tensor = -1;       // communication: graph tensor id
  Prop from, to;         // communication: properties before and after
  int segment = 0;       // whose ratios size the shards
  int from_segment = 0;  // Reshard: the producer's segment
  CollectiveMethod method = CollectiveMethod::None;
  // AllGather of a parameter stored sharded (ZeRO storage): the gathered copy is not kept for
  // the backward pass, which gathers it again where a reader's backward needs it (ZeRO-3;
  // autograd::rematerializable). false: the copy is kept from forward to backward.
  bool regather = false;
  double cost_s = 0;  // forward + backward time predicted for this instruction
};

// One step of the synthesis, for the plan report: a search round under some ratios, the
// memory-aware pass, or a baseline checked as a candidate.
struct SynthesisStep {
  std::string what;     // e.g. "start by-flops, round 2", "memory-aware pass", "candidate dp-ep"
  int64_t states = 0;   // states it expanded
  double cost_s = -1;   // predicted step time of what it found (< 0: found nothing)
  double seconds = 0;   // wall time it took
  std::string outcome;  // "" or why it found nothing (over budget, out of memory)
};

struct DistributedProgram {
  std::string strategy;  // hap, dp-ev, dp-cp, tp, dp-ep
  // The cluster's ranks the program runs on, ascending; empty: all of them. The ratios, the
  // costs and everything below are those of that subset (Cluster::subset): a rank left out gets
  // no work and takes no part in the program's collectives. `devices_note` says why.
  std::vector<int> devices;
  std::string devices_note;
  // Per rank of the program (in the order of `devices`, or of the cluster when empty): the index
  // of its node in the cluster. Hierarchical all-reduces (CollectiveMethod::Hierarchical) group
  // the ranks by it; empty when the program has none.
  std::vector<int> nodes;
  std::vector<Instruction> instructions;    // in execution order
  std::vector<std::vector<double>> ratios;  // [segment][device], each row sums to 1
  std::vector<int> node_segment;            // graph node id -> segment
  std::vector<Prop> storage;                // graph tensor id -> how parameters/inputs are held
  // Per segment: true where the executor keeps none of the segment's activations for backward
  // and recomputes them there (autograd::checkpoint); empty: none.
  std::vector<bool> recompute;
  // The step as the executor runs it (synth::step_time): compute_s + communication_s -
  // shared_latency_s (latency that bucketed collectives pay once for all their members, which
  // communication_s counts per member) - hidden_communication_s (communication hidden behind
  // computation: gradient all-reduces behind the backward pass, parameter gathers behind the
  // forward pass).
  double predicted_step_s = 0;
  double compute_s = 0, communication_s = 0, hidden_communication_s = 0, shared_latency_s = 0;
  std::vector<double> device_compute_s;     // per device: its own compute time
  std::vector<double> device_memory_bytes;  // per device: predicted peak
  double synthesis_s = 0;
  int search_iterations = 0;
  int64_t states_expanded = 0;
  std::string note;  // non-empty when the program is a fallback (hap over its search budget)
  // hap: the program found without memory limits did not fit, so memory shaped this one.
  bool memory_bound = false;
  // The predicted step of the program found without memory limits (where memory_bound, one that
  // did not fit; else this program's): what memory costs this one is the difference.
  double unlimited_step_s = 0;
  std::vector<SynthesisStep> steps;  // how the synthesis went, in order
};

// A 64-bit hash (FNV-1a) of what a rank executes: every instruction's kind, node, signature,
// tensor, properties, segments and method, the exact bits of every ratio, the node segments and
// the storage of every tensor and the devices it runs on. Two programs with equal hashes run alike
// (up to a collision); predicted costs and timings are left out.
uint64_t program_hash(const DistributedProgram& p);

}  // namespace hap::synth
