// Fuzzes the .hapt reader, hap::load_tensors (models/serialize.h). What loads must also save
// (save_tensors) and load again as the same tensors.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "fuzz/same_tensors.h"
#include "models/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("tensors.hapt", data, size, [](const std::string& path) {
    const hap::NamedTensors tensors = hap::load_tensors(path);
    const std::string saved = hap::fuzz::scratch_path("saved.hapt");
    hap::save_tensors(saved, tensors);
    if (!hap::fuzz::same_tensors(tensors, hap::load_tensors(saved))) {
      hap::fuzz::property_failed("a .hapt file saved and loaded again differs");
    }
  });
  return 0;
}
