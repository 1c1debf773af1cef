// ZeRO storage applied by hand to a finished program, for tests: what ZeRO-3 data parallelism
// does to a data-parallel program.
#pragma once
#include "ops/op.h"
#include "synth/graph.h"
#include "synth/program.h"

namespace hap::test_util {

// Every parameter that `p` stores Replicated with a gradient all-reduce, that no view op reads
// and that has at least one row per device, stored Sharded(0) instead (under the segment of the
// all-reduce): the all-reduce becomes an all-gather of the shards in its place (before the first
// reader; its backward reduce-scatters the gradient), gathered again in backward where
// `regather`, and the parameter's update runs on its shard. Returns how many parameters changed.
inline int apply_zero_storage(const synth::Graph& g, synth::DistributedProgram& p, bool regather) {
  const int devices = static_cast<int>(p.ratios.at(0).size());
  std::vector<bool> zero(g.tensors.size(), false);
  int changed = 0;
  for (synth::Instruction& in : p.instructions) {
    if (in.kind != synth::InstrKind::GradAllReduce) continue;
    const synth::GraphTensor& t = g.tensors[static_cast<size_t>(in.tensor)];
    if (t.role != synth::TensorRole::Parameter || t.shape.empty() || t.shape[0] < devices) continue;
    bool viewed = false;
    for (int c : t.consumers) viewed = viewed || ops::op_def(g.nodes[c].kind).moves_data;
    if (viewed) continue;
    in.kind = synth::InstrKind::AllGather;
    in.from = synth::Prop::sharded(0);
    in.to = synth::Prop::replicated();
    in.from_segment = in.segment;
    in.method = synth::CollectiveMethod::Grouped;
    in.regather = regather;
    p.storage[static_cast<size_t>(in.tensor)] = synth::Prop::sharded(0);
    zero[static_cast<size_t>(in.tensor)] = true;
    ++changed;
  }
  for (synth::Instruction& in : p.instructions)
    if (in.kind == synth::InstrKind::Update && zero[static_cast<size_t>(in.tensor)])
      in.from = in.to = synth::Prop::sharded(0);
  return changed;
}

}  // namespace hap::test_util
