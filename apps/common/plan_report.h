// Human-readable and JSON reports of a synthesized DistributedProgram (hap-plan's output).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "synth/cost_model.h"
#include "synth/program.h"

namespace hap::app {

// Stable fingerprints, so a saved plan can be matched to the model and cluster it was made for.
std::string graph_fingerprint(const synth::Graph& g);
std::string cluster_fingerprint(const synth::Cluster& c);

// The plan report: ratios, the strategy per layer, collectives with bytes and methods, predicted
// time and memory per device. `baselines` are other strategies' programs on the same cluster,
// for the predicted speed-ups.
std::string plan_report(const synth::CostModel& cm, const synth::DistributedProgram& p,
                        const std::vector<synth::DistributedProgram>& baselines);

nlohmann::json plan_to_json(const synth::CostModel& cm, const synth::DistributedProgram& p);

// Reads a plan written by plan_to_json back for this model and cluster. Throws ConfigError naming
// the file when it is not a plan, was made for another model or cluster (fingerprints differ),
// or holds ratios that are not one positive share per device summing to 1. The returned
// program is re-costed with its ratios.
synth::DistributedProgram load_plan(const std::string& path, const synth::CostModel& cm);

}  // namespace hap::app
