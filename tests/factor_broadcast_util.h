// Sufficient factor broadcasting applied by hand to a finished program, for tests: what
// Poseidon's SFB does to a data-parallel program's fully connected layers.
#pragma once
#include <algorithm>
#include <iterator>

#include "ops/op.h"
#include "synth/graph.h"
#include "synth/program.h"

namespace hap::test_util {

// At every product of `p` whose parameters it alone reads, stored Replicated and read
// Replicated, under a signature with some other input Sharded and nothing Partial: the
// parameters' gradient all-reduces are dropped and a FactorBroadcast (gathers by `method`)
// follows the product's computation. Returns how many products changed.
inline int apply_factor_broadcast(const synth::Graph& g, synth::DistributedProgram& p,
                                  synth::CollectiveMethod method) {
  using synth::InstrKind;
  using synth::Prop;
  int changed = 0;
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const synth::Instruction in = p.instructions[i];
    if (in.kind != InstrKind::Compute || in.signature < 0) continue;
    const synth::GraphNode& n = g.nodes[static_cast<size_t>(in.node)];
    const ops::OpDef& def = ops::op_def(n.kind);
    if (!def.product || def.saves_outputs) continue;
    const ops::ShardSignature sig = synth::signatures_of(g, n)[static_cast<size_t>(in.signature)];
    bool ok = std::none_of(sig.outputs.begin(), sig.outputs.end(),
                           [](const Prop& q) { return q.kind == ops::PropKind::Partial; });
    int params = 0, sharded = 0;
    for (size_t k = 0; k < n.inputs.size() && ok; ++k) {
      const int t = n.inputs[k];
      if (t < 0) continue;
      const synth::GraphTensor& gt = g.tensors[static_cast<size_t>(t)];
      if (sig.inputs[k].kind == ops::PropKind::Partial) ok = false;
      if (gt.role != synth::TensorRole::Parameter) {
        sharded += sig.inputs[k].kind == ops::PropKind::Sharded ? 1 : 0;
        continue;
      }
      ++params;
      ok = ok && sig.inputs[k] == Prop::replicated() &&
           p.storage[static_cast<size_t>(t)] == Prop::replicated() &&
           std::all_of(gt.consumers.begin(), gt.consumers.end(), [&](int c) { return c == n.id; });
    }
    if (!ok || params == 0 || sharded == 0) continue;
    synth::Instruction f;
    f.kind = InstrKind::FactorBroadcast;
    f.node = n.id;
    f.signature = in.signature;
    f.segment = in.segment;
    f.method = method;
    for (int t : n.inputs)
      if (f.tensor < 0 && t >= 0 &&
          g.tensors[static_cast<size_t>(t)].role == synth::TensorRole::Parameter)
        f.tensor = t;
    std::vector<synth::Instruction>& v = p.instructions;
    for (size_t j = v.size(); j-- > 0;) {
      const int t = v[j].tensor;
      if (v[j].kind == InstrKind::GradAllReduce &&
          std::find(n.inputs.begin(), n.inputs.end(), t) != n.inputs.end()) {
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(j));
        if (j < i) --i;
      }
    }
    v.insert(v.begin() + static_cast<std::ptrdiff_t>(i) + 1, f);
    ++changed;
  }
  return changed;
}

}  // namespace hap::test_util
