// Fuzzes the safetensors reader, hap::load_safetensors (models/safetensors.h), with its checksum
// verification. What loads must also save (save_safetensors, with the same metadata) and load
// again as the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "fuzz/same_tensors.h"
#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("tensors.safetensors", data, size, [](const std::string& path) {
    hap::TensorMetadata metadata;
    const hap::NamedTensors tensors = hap::load_safetensors(path, &metadata);
    const std::string saved = hap::fuzz::scratch_path("saved.safetensors");
    hap::save_safetensors(saved, tensors, metadata);
    hap::TensorMetadata metadata_back;
    const hap::NamedTensors back = hap::load_safetensors(saved, &metadata_back);
    if (!hap::fuzz::same_tensors(tensors, back) || metadata != metadata_back) {
      hap::fuzz::property_failed("a safetensors file saved and loaded again differs");
    }
  });
  return 0;
}
