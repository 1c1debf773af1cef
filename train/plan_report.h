// The human-readable report of a synthesized DistributedProgram (hap-plan's output, and what
// hap-train prints on rank 0 before training on ranks).
#pragma once
#include <string>
#include <vector>

#include "synth/cost_model.h"
#include "synth/program.h"

namespace hap::train {

// The plan report: ratios, the strategy per layer, collectives with bytes and methods, predicted
// time and memory per device. `baselines` are other strategies' programs on the same cluster,
// for the predicted speed-ups.
std::string plan_report(const synth::CostModel& cm, const synth::DistributedProgram& p,
                        const std::vector<synth::DistributedProgram>& baselines);

}  // namespace hap::train
