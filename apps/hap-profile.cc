// hap-profile: measure a cluster and write the cluster file hap-plan and hap-train read.
//   mpirun -np N hap-profile --out cluster.yaml [--config run.yaml] [--name NAME]
//          [--node-name NAME] [--type TYPE] [--busy-ms MS] [--pool-tolerance X] [--quick]
//          [--raw FILE.json]
//
// Every rank measures its compute rate (GEMM at several sizes, and one training step of the
// config's model on its share of the batch; the step's rate is the device's flops_per_s) and its
// usable memory; ranks of one kind (type, device, quota or SMs) pool those measurements into one
// set of figures (--pool-tolerance). The ranks are grouped into nodes by hostname (or --node-name /
// HAP_NODE_NAME); each node's ranks then time all_reduce, all_gather, reduce_scatter and all_to_all
// at several sizes, with even and uneven shards and both methods (padded, grouped), and so do all
// ranks together when there are several nodes. Each group's link is fitted to its timings with the
// cost model's own formulas (parallel/profile.h). With one rank only compute is profiled.
//
// Rank 0 shows progress on stderr and writes the file at the end, through a temporary file and
// a rename: an interrupted profile leaves no file behind. Under scripts/hap-emulate, the
// emulated device's name, type, node and cpu_quota or sm_count come from the environment
// (HAP_DEVICE_NAME, HAP_DEVICE_TYPE, HAP_NODE_NAME, HAP_CPU_QUOTA, HAP_EMULATE_SMS and
// HAP_EMULATE_SM_GROUP), so the file can be emulated again as is.
//
// GPU ranks (--set train.device=cuda): each rank takes the GPU a training run would give it and
// measures there: GEMMs in f32 and bf16, the model's step on the GPU (its kernel shares from
// separate profiled steps, since the profiler waits for the device around each op), the GPU's
// free memory shared among the ranks on it (or its allocator cap), and the collectives on GPU
// tensors through the backend training would use (parallel.backend: NCCL, or MPI staged through
// the host). Not yet run on a GPU.
// Exit codes: 0 written, 1 run-time error, 2 bad input.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "parallel/communicator.h"
#include "train/cluster_profile.h"
#include "train/config.h"
#include "train/output_path.h"

namespace {

using hap::parallel::Communicator;

// An interrupted profile leaves no file behind.
void remove_partial_output_and_exit(int sig) {
  hap::remove_partial_output();
  _exit(128 + sig);
}

// The shipped configs/gpt.yaml, found from the binary rather than the working directory: the
// installed copy (<prefix>/share/hap/configs) beside an installed binary, else the source tree's.
std::string default_config_path() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed =
        exe.parent_path().parent_path() / "share" / "hap" / "configs" / "gpt.yaml";
    if (std::filesystem::exists(installed, ec)) return installed.string();
  }
  return std::string(HAP_SOURCE_DIR) + "/configs/gpt.yaml";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"hap-profile: measure the cluster the MPI ranks run on and write its cluster file"};
  hap::train::ProfileOptions opt;
  std::string config_path = default_config_path();
  std::vector<std::string> overrides;
  cli.add_option("--out", opt.out_path, "the cluster file to write (YAML)")->required();
  cli.add_option("--config", config_path,
                 "run config whose model is timed (default: the shipped configs/gpt.yaml)");
  cli.add_option("--set", overrides, "override a key of that config (repeatable)");
  cli.add_option("--name", opt.name, "the cluster's name (default: the --out file's stem)");
  cli.add_option("--node-name", opt.node_name,
                 "this rank's node (default: HAP_NODE_NAME or the hostname)");
  cli.add_option("--type", opt.type,
                 "device type written to the file (default: HAP_DEVICE_TYPE or cpu)");
  cli.add_option("--raw", opt.raw_path, "also write every measurement as JSON");
  cli.add_flag("--quick", opt.quick, "fewer sizes and repetitions (a smoke test, not a profile)");
  cli.add_option("--busy-ms", opt.busy_ms,
                 "compute this long before each timed collective, as in training (0: from idle)")
      ->check(CLI::Range(0.0, 10000.0));
  cli.add_option("--pool-tolerance", opt.pool_tolerance,
                 "ranks of one kind (type, device, quota or SMs) pool their compute measurements "
                 "where each one's step is within a factor 1 + this of their median (default "
                 "0.25; 0: every rank keeps its own figures)")
      ->check(CLI::Range(0.0, 1000.0));
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  std::signal(SIGINT, remove_partial_output_and_exit);
  std::signal(SIGTERM, remove_partial_output_and_exit);

  hap::parallel::MpiSession mpi(&argc, &argv);
  Communicator world = Communicator::world();
  try {
    // Rank 0 writes the files, on its own file system: it checks, and every rank stops alike.
    std::string bad;
    if (world.rank() == 0)
      for (const auto& [flag, path] :
           {std::pair<const char*, std::string>{"--out", opt.out_path}, {"--raw", opt.raw_path}})
        if (bad.empty() && !path.empty())
          if (const std::string reason = hap::train::unwritable_reason(path); !reason.empty())
            bad = std::string(flag) + " '" + path + "': cannot write: " + reason;
    if (world.allreduce(static_cast<int64_t>(bad.empty() ? 0 : 1), hap::parallel::ReduceOp::Max) !=
        0)
      throw hap::train::ConfigError(world.rank() == 0 ? bad : "rank 0 cannot write its output");
    const hap::train::RunConfig config =
        hap::train::load_run_config(config_path, {overrides.begin(), overrides.end()});
    hap::train::profile_cluster(config, opt, world);
  } catch (const hap::train::ConfigError& e) {
    // Same inputs on every rank: every rank stops alike.
    if (world.rank() == 0) std::fprintf(stderr, "hap-profile: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hap-profile: rank %d: error: %s\n", world.rank(), e.what());
    world.abort_all(1);
  }
  return 0;
}
