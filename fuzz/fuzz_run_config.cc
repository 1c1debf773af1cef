// Fuzzes the run config reader, hap::train::load_run_config (train/config.h). The input is a run
// file; each line "#set SECTION.KEY=VALUE" in it (a YAML comment, so the file stays a run file) is
// also passed as a --set override, so that overrides are fuzzed with the file they apply to. A
// config that loads is also summarised and logged (describe, to_json), as hap-train does.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/harness.h"
#include "train/config.h"

namespace {

constexpr std::string_view kOverrideMark = "#set ";
constexpr std::size_t kMaxOverrides = 8;

std::vector<hap::train::ConfigOverride> overrides_in(std::string_view text) {
  std::vector<hap::train::ConfigOverride> out;
  std::size_t start = 0;
  while (start < text.size() && out.size() < kMaxOverrides) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (line.starts_with(kOverrideMark)) out.emplace_back(std::string(line.substr(5)));
    start = end + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<hap::train::ConfigOverride> overrides =
      overrides_in(std::string_view(reinterpret_cast<const char*>(data), size));
  hap::fuzz::read_input("run.yaml", data, size, [&](const std::string& path) {
    const hap::train::RunConfig config = hap::train::load_run_config(path, overrides);
    const std::string summary = hap::train::describe(config);
    const std::string logged = hap::train::to_json(config).dump();
    if (summary.empty() || logged.empty()) hap::fuzz::property_failed("an empty config summary");
    hap::train::synthesis_options(config);
  });
  return 0;
}
