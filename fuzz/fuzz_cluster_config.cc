// Fuzzes the cluster file reader, hap::train::load_cluster_config (train/cluster_config.h). A
// cluster that loads must pass Cluster::validate() (as the header promises) and is also turned
// into the JSON scripts/hap-emulate reads and into a plan fingerprint.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "train/cluster_config.h"
#include "train/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("cluster.yaml", data, size, [](const std::string& path) {
    // Compute in cores takes a fixed per-core rate: no measurement, no cache written.
    const hap::synth::Cluster cluster =
        hap::train::load_cluster_config(path, [] { return 1.5e11; });
    try {
      cluster.validate();
    } catch (const hap::Error& e) {
      hap::fuzz::property_failed(std::string("a loaded cluster fails validate(): ") + e.what());
    }
    const std::string json = hap::train::cluster_to_json(cluster).dump();
    const std::string fingerprint = hap::train::cluster_fingerprint(cluster);
    if (json.empty() || fingerprint.size() != 16) {
      hap::fuzz::property_failed("a cluster without JSON or fingerprint");
    }
  });
  return 0;
}
