#include "train/dataset.h"

#include "models/named_registry.h"
#include "train/image_data.h"
#include "train/text_corpus.h"
#include "train/token_data.h"

namespace hap::train {

namespace {

nn::NamedRegistry<DatasetEntry>& registry() {
  // The built-in datasets, one line each.
  static auto* r = new nn::NamedRegistry<DatasetEntry>("dataset", [] {
    return std::vector<DatasetEntry>{bytes_dataset_entry(), images_dataset_entry(),
                                     tokens_dataset_entry()};
  });
  return *r;
}

}  // namespace

const DatasetEntry& find_dataset(const std::string& name) { return registry().find(name); }
std::vector<std::string> dataset_names() { return registry().names(); }

void register_dataset(DatasetEntry entry) {
  HAP_CHECK(entry.open != nullptr, "register_dataset: dataset '", entry.name,
            "' has no open function");
  registry().add(std::move(entry));
}

std::shared_ptr<Dataset> open_dataset(const DatasetEntry& entry, const nn::Options& options,
                                      const std::vector<nn::InputSpec>& inputs,
                                      std::uint64_t seed) {
  nn::check_options(entry.options, options);
  return entry.open(options, inputs, seed);
}

}  // namespace hap::train
