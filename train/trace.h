// The traced single-device graph of one training step of a Model: what the synthesizer plans.
#pragma once
#include <cstdint>

#include "models/model.h"
#include "synth/graph.h"

namespace hap::train {

// Traces model.loss() on shape-only inputs of the declared shapes for `batch_size` examples, in
// training mode at random step 0 (so dropout's streams are the module indices; the executor adds
// each step's offset). No data is read or allocated: a model built under a MetaGuard traces at
// any size. `precision` BF16 traces under mixed precision (ops::AutocastGuard), as
// train.precision: bf16 trains: the casts are nodes of the graph.
synth::Graph trace_model(nn::Model& model, std::int64_t batch_size, DType precision = DType::F32);

}  // namespace hap::train
