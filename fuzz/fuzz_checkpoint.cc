// Fuzzes the checkpoint reader, hap::read_checkpoint (models/serialize.h): a safetensors
// checkpoint (checksums verified) or a .hapt checkpoint of the first format, told apart by the
// file's first bytes. A checkpoint that reads must also write (write_checkpoint) and read again
// with the same tensors, step and random counters.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "fuzz/same_tensors.h"
#include "models/serialize.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("checkpoint", data, size, [](const std::string& path) {
    const hap::Checkpoint c = hap::read_checkpoint(path);
    const std::string saved = hap::fuzz::scratch_path("saved-checkpoint.safetensors");
    hap::write_checkpoint(saved, c);
    const hap::Checkpoint back = hap::read_checkpoint(saved);
    if (!hap::fuzz::same_tensors(c.tensors, back.tensors) || back.step != c.step ||
        back.random_seed != c.random_seed || back.random_step != c.random_step) {
      hap::fuzz::property_failed("a checkpoint written and read again differs");
    }
  });
  return 0;
}
