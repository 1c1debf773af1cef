// Fuzzes the CIFAR-10 binary reader, hap::train::read_cifar (train/image_data.h), with CIFAR-10's
// 10 classes. What reads must hold one label below 10 and 3072 pixel bytes per record.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "train/image_data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("cifar.bin", data, size, [&](const std::string& path) {
    const hap::train::CifarRecords r = hap::train::read_cifar({path}, 10);
    if (r.size() * hap::train::kCifarRecordBytes != static_cast<std::int64_t>(size) ||
        static_cast<std::int64_t>(r.pixels.size()) != r.size() * hap::train::kCifarImageBytes) {
      hap::fuzz::property_failed("CIFAR records that do not match the file's size");
    }
    for (std::uint8_t label : r.labels) {
      if (label >= 10) hap::fuzz::property_failed("a CIFAR label outside [0, 10)");
    }
  });
  return 0;
}
