#include "models/zoo.h"

#include <deque>
#include <mutex>

#include "models/gpt.h"

namespace hap::nn {

namespace {

struct Registry {
  std::mutex mutex;
  std::deque<ModelEntry> entries;  // a deque: find_model's references survive registrations
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    // The built-in models, one line each.
    reg->entries.push_back(gpt_model_entry());
    return reg;
  }();
  return *r;
}

}  // namespace

const ModelEntry& find_model(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string names;
  for (const ModelEntry& e : r.entries) {
    if (e.name == name) return e;
    names += (names.empty() ? "'" : ", '") + e.name + "'";
  }
  HAP_CHECK(false, "no model named '", name, "' is registered (registered: ", names, ")");
  throw InternalError("unreachable");
}

std::vector<std::string> model_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const ModelEntry& e : r.entries) out.push_back(e.name);
  return out;
}

void register_model(ModelEntry entry) {
  HAP_CHECK(!entry.name.empty(), "register_model: the model name is empty");
  HAP_CHECK(entry.build != nullptr, "register_model: model '", entry.name,
            "' has no build function");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const ModelEntry& e : r.entries)
    HAP_CHECK(e.name != entry.name, "register_model: a model named '", entry.name,
              "' is already registered");
  r.entries.push_back(std::move(entry));
}

std::shared_ptr<Model> build_model(const ModelEntry& entry, const Options& options,
                                   std::int64_t batch_size, std::uint64_t seed) {
  check_options(entry.options, options);
  if (entry.check) entry.check(options, batch_size);
  return entry.build(options, seed);
}

}  // namespace hap::nn
