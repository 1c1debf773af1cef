// From a run config to the model and its traced single-device graph (what the synthesizer reads).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "apps/common/config.h"
#include "models/gpt.h"
#include "synth/graph.h"

namespace hap::app {

nn::GPTConfig gpt_config(const TrainRunConfig& config);

struct TracedModel {
  std::shared_ptr<nn::GPT> model;
  synth::Graph graph;
};

// Builds the configured model with shape-only parameters (MetaGuard) and traces one training
// step's forward (loss) on the global batch [train.batch_size, train.seq_len]; no data is
// allocated or touched, so any model size can be planned.
// dropout_seed: the model's random seed if not the config's train.seed (a resumed run takes the
// checkpoint's, as the single-process trainer does).
TracedModel trace_model(const TrainRunConfig& config, std::optional<uint64_t> dropout_seed = std::nullopt);

}  // namespace hap::app
