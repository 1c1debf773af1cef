#include "train/from_config.h"

#include "models/zoo.h"

namespace hap::train {

std::shared_ptr<nn::Model> build_model(const RunConfig& config, bool shapes_only) {
  const nn::ModelEntry& entry = nn::find_model(config.model.name);
  if (!shapes_only)
    return nn::build_model(entry, config.model.options, config.train.batch_size, config.train.seed);
  MetaGuard meta;
  return nn::build_model(entry, config.model.options, config.train.batch_size, config.train.seed);
}

std::shared_ptr<Dataset> open_dataset(const RunConfig& config, const nn::Model& model) {
  return open_dataset(find_dataset(config.data.name), config.data.options,
                      model.inputs(config.train.batch_size), config.train.seed);
}

}  // namespace hap::train
