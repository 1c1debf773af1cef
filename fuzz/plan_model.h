// The model and cluster the plan target reads plans for (and fuzz_write_seeds writes its seed
// plans for): a small two-block MLP with a residual branch, on three uneven devices in two nodes,
// so that plans hold every kind of instruction the synthesizer emits, several segments, and
// collectives inside and between nodes, in a few KB of JSON.
#pragma once

#include "synth/cost_model.h"

namespace hap::fuzz {

// Built on first use and kept for the life of the process (the cost model refers to them).
const synth::Graph& plan_graph();
const synth::Cluster& plan_cluster();
const synth::CostModel& plan_cost_model();

}  // namespace hap::fuzz
