#include "models/zoo.h"

#include "models/bert.h"
#include "models/gpt.h"
#include "models/named_registry.h"
#include "models/vgg.h"
#include "models/vit.h"

namespace hap::nn {

namespace {

NamedRegistry<ModelEntry>& registry() {
  // The built-in models, one line each.
  static auto* r = new NamedRegistry<ModelEntry>("model", [] {
    return std::vector<ModelEntry>{bert_model_entry(), bert_moe_model_entry(), gpt_model_entry(),
                                   vgg_model_entry(), vit_model_entry()};
  });
  return *r;
}

}  // namespace

const ModelEntry& find_model(const std::string& name) { return registry().find(name); }
std::vector<std::string> model_names() { return registry().names(); }

void register_model(ModelEntry entry) {
  HAP_CHECK(entry.build != nullptr, "register_model: model '", entry.name,
            "' has no build function");
  registry().add(std::move(entry));
}

std::shared_ptr<Model> build_model(const ModelEntry& entry, const Options& options,
                                   std::int64_t batch_size, std::uint64_t seed) {
  check_options(entry.options, options);
  if (entry.check) entry.check(options, batch_size);
  return entry.build(options, seed);
}

}  // namespace hap::nn
