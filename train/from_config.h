// A training run's parts from its RunConfig: the model of the zoo and the dataset it names.
// What hap-train and hap-plan do, available to any program.
#pragma once
#include <memory>

#include "models/model.h"
#include "train/config.h"
#include "train/dataset.h"

namespace hap::train {

// The configured model, its parameters drawn with train.seed. With shapes_only, it is built
// under a MetaGuard: no parameter is allocated or drawn (planning, or ranks that draw only their
// shards).
std::shared_ptr<nn::Model> build_model(const RunConfig& config, bool shapes_only = false);

// The configured dataset, opened for the model's inputs at train.batch_size, batches ordered by
// train.seed.
std::shared_ptr<Dataset> open_dataset(const RunConfig& config, const nn::Model& model);

}  // namespace hap::train
