// program_hash: what every rank checks before running a plan. Equal programs hash alike; a change
// in any instruction field, in one bit of a ratio, in a node's segment or in a tensor's storage
// changes it; predicted costs and timings do not.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "synth/program.h"

namespace hap::synth {
namespace {

DistributedProgram sample() {
  DistributedProgram p;
  p.strategy = "hap";
  Instruction c;
  c.kind = InstrKind::Compute;
  c.node = 0;
  c.signature = 1;
  Instruction g;
  g.kind = InstrKind::AllGather;
  g.tensor = 3;
  g.from = Prop::sharded(0);
  g.to = Prop::replicated();
  g.method = CollectiveMethod::Padded;
  p.instructions = {c, g};
  p.ratios = {{0.5, 0.3, 0.2}};
  p.node_segment = {0, 0};
  p.storage = {Prop::replicated(), Prop::sharded(1), Prop::replicated(), Prop::partial()};
  return p;
}

TEST(ProgramHash, EqualProgramsHashAlikeWhateverTheirPredictions) {
  DistributedProgram a = sample(), b = sample();
  b.predicted_step_s = 42;
  b.synthesis_s = 3;
  b.instructions[0].cost_s = 7;
  b.note = "a note";
  EXPECT_EQ(program_hash(a), program_hash(b));
}

TEST(ProgramHash, AnyFieldThatChangesWhatRunsChangesIt) {
  const uint64_t base = program_hash(sample());
  const std::vector<std::function<void(DistributedProgram&)>> edits = {
      [](DistributedProgram& p) { p.instructions[0].signature = 2; },
      [](DistributedProgram& p) { p.instructions[0].node = 1; },
      [](DistributedProgram& p) { p.instructions[1].kind = InstrKind::ReduceScatter; },
      [](DistributedProgram& p) { p.instructions[1].tensor = 4; },
      [](DistributedProgram& p) { p.instructions[1].from = Prop::sharded(1); },
      [](DistributedProgram& p) { p.instructions[1].to = Prop::partial(); },
      [](DistributedProgram& p) { p.instructions[1].method = CollectiveMethod::Grouped; },
      [](DistributedProgram& p) { p.instructions[1].segment = 1; },
      [](DistributedProgram& p) { p.instructions[1].from_segment = 1; },
      [](DistributedProgram& p) { p.ratios[0][0] = std::nextafter(0.5, 1.0); },  // one bit
      [](DistributedProgram& p) { std::swap(p.ratios[0][1], p.ratios[0][2]); },
      [](DistributedProgram& p) { p.node_segment[1] = 1; },
      [](DistributedProgram& p) { p.storage[1] = Prop::sharded(0); },
      [](DistributedProgram& p) { std::swap(p.instructions[0], p.instructions[1]); },
      [](DistributedProgram& p) { p.instructions.pop_back(); },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    DistributedProgram p = sample();
    edits[i](p);
    EXPECT_NE(program_hash(p), base) << "edit " << i;
  }
}

}  // namespace
}  // namespace hap::synth
