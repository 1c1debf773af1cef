// The model zoo: models registered by name, each with its typed options and a factory. A run
// config's `model.name` selects an entry; its other `model.*` keys are the entry's options, read
// and validated against entry.options before anything is built (train/config.h).
//
// Adding a model: one file in models/ that defines it and a `ModelEntry <name>_model_entry()`,
// plus one line in models/zoo.cc. A program may also register its own with register_model().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/options.h"

namespace hap::nn {

struct ModelEntry {
  std::string name;     // "gpt": the value of model.name
  std::string summary;  // one line, for listings
  std::vector<OptionSpec> options;
  // Constraints between options, and between options and the global batch size (so that no
  // tensor of a step overflows); throws OptionError naming the option to report. May be empty.
  std::function<void(const Options& options, std::int64_t batch_size)> check;
  // Builds the model with its parameters drawn with `seed` (Module::reset_parameters) and its
  // dropout bound to `seed` (set_random_seed). Under a MetaGuard the parameters are shape-only.
  std::function<std::shared_ptr<Model>(const Options& options, std::uint64_t seed)> build;
  // The dataset a run config uses when its data section names none (train/dataset.h).
  std::string data = "bytes";
};

// The entry called `name`; throws hap::Error listing the registered names.
const ModelEntry& find_model(const std::string& name);
// Every registered name, in registration order (the built-in ones first).
std::vector<std::string> model_names();
// Adds an entry (a name may be registered once).
void register_model(ModelEntry entry);

// Builds `entry` after checking `options` (types, ranges, required keys, entry.check with the
// batch size): what a program does without a config file.
std::shared_ptr<Model> build_model(const ModelEntry& entry, const Options& options,
                                   std::int64_t batch_size, std::uint64_t seed);

}  // namespace hap::nn
