// Plan files: a synthesized DistributedProgram as JSON (hap-plan --json, hap-train --plan-json)
// and back, with fingerprints of the model graph and the cluster it was made for.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "synth/cost_model.h"
#include "synth/program.h"

namespace hap::train {

// Stable fingerprints, so a saved plan can be matched to the model and cluster it was made for.
std::string graph_fingerprint(const synth::Graph& g);
std::string cluster_fingerprint(const synth::Cluster& c);

nlohmann::json plan_to_json(const synth::CostModel& cm, const synth::DistributedProgram& p);
// Writes plan_to_json to `path`; throws hap::Error naming the path and the OS's reason.
void save_plan(const std::string& path, const synth::CostModel& cm,
               const synth::DistributedProgram& p);

// Reads a plan written by plan_to_json back for this model and cluster. Throws ConfigError naming
// the file when it is not a plan, was made for another model or cluster (fingerprints differ),
// or holds ratios that are not one positive share per device summing to 1. The returned
// program is re-costed with its ratios.
synth::DistributedProgram load_plan(const std::string& path, const synth::CostModel& cm);

// The ranks of `cluster` a plan file's program runs on (its "devices", by name; empty when it
// runs on all): load_plan then reads it with a cost model of cluster.subset() of them. Throws
// ConfigError naming the file for a name the cluster lacks.
std::vector<int> plan_devices(const std::string& path, const synth::Cluster& cluster);

}  // namespace hap::train
