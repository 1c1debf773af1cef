#include "train/dataset.h"

#include <deque>
#include <mutex>

#include "train/text_corpus.h"

namespace hap::train {

namespace {

struct Registry {
  std::mutex mutex;
  std::deque<DatasetEntry> entries;  // a deque: find_dataset's references survive registrations
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    // The built-in datasets, one line each.
    reg->entries.push_back(bytes_dataset_entry());
    return reg;
  }();
  return *r;
}

}  // namespace

const DatasetEntry& find_dataset(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string names;
  for (const DatasetEntry& e : r.entries) {
    if (e.name == name) return e;
    names += (names.empty() ? "'" : ", '") + e.name + "'";
  }
  HAP_CHECK(false, "no dataset named '", name, "' is registered (registered: ", names, ")");
  throw InternalError("unreachable");
}

std::vector<std::string> dataset_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const DatasetEntry& e : r.entries) out.push_back(e.name);
  return out;
}

void register_dataset(DatasetEntry entry) {
  HAP_CHECK(!entry.name.empty(), "register_dataset: the dataset name is empty");
  HAP_CHECK(entry.open != nullptr, "register_dataset: dataset '", entry.name,
            "' has no open function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const DatasetEntry& e : r.entries)
    HAP_CHECK(e.name != entry.name, "register_dataset: a dataset named '", entry.name,
              "' is already registered");
  r.entries.push_back(std::move(entry));
}

std::shared_ptr<Dataset> open_dataset(const DatasetEntry& entry, const nn::Options& options,
                                      const std::vector<nn::InputSpec>& inputs,
                                      std::uint64_t seed) {
  nn::check_options(entry.options, options);
  return entry.open(options, inputs, seed);
}

}  // namespace hap::train
