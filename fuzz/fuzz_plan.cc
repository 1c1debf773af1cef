// Fuzzes the plan file reader, hap::train::load_plan (train/plan_io.h), for the model and cluster
// of fuzz/plan_model.h (the seed plans were written for them by save_plan, so mutations get past
// the fingerprints). A plan that loads must also save and load again as the same plan: the JSON
// of the reloaded program equals the JSON of the loaded one.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "fuzz/plan_model.h"
#include "train/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const hap::synth::CostModel& cm = hap::fuzz::plan_cost_model();
  hap::fuzz::read_input("plan.json", data, size, [&](const std::string& path) {
    const hap::synth::DistributedProgram p = hap::train::load_plan(path, cm);
    const std::string saved = hap::fuzz::scratch_path("plan-saved.json");
    hap::train::save_plan(saved, cm, p);
    const hap::synth::DistributedProgram back = hap::train::load_plan(saved, cm);
    if (hap::train::plan_to_json(cm, back) != hap::train::plan_to_json(cm, p)) {
      hap::fuzz::property_failed("a loaded plan saved and loaded again is another plan");
    }
  });
  return 0;
}
