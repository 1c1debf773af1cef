// hap-train: train a model from a YAML run config, on one process or on a cluster.
//   hap-train --config configs/gpt.yaml [--set key.path=value]... [--resume CKPT] [--save CKPT]
//   mpirun -np N hap-train --config configs/gpt.yaml --cluster configs/clusters/X.yaml
//          [--set parallel.strategy=hap|dp-ev|dp-cp|tp|dp-ep] [--plan FILE] [--plan-json FILE]
// Exit codes: 0 done, 1 run-time error (data, divergence, I/O), 2 bad config or command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "parallel/mpi.h"
#include "train/cluster_config.h"
#include "train/config.h"
#include "train/core_rate.h"
#include "train/from_config.h"
#include "train/output_path.h"
#include "train/plan_io.h"
#include "train/plan_report.h"
#include "train/trainer.h"

namespace {

using namespace hap::train;

int run_distributed(int argc, char** argv, const RunConfig& config, const std::string& cluster_path,
                    const std::string& plan_json, const std::string& plan_file,
                    const FitOptions& fit) {
  hap::parallel::MpiSession mpi(&argc, &argv);
  hap::parallel::Communicator comm = hap::parallel::Communicator::world();
  const bool lead = comm.rank() == 0;
  try {
    // Errors up to the Trainer come from the same inputs on every rank, so every rank stops alike.
    // A cluster file in cores takes rank 0's per-core rate, so that every rank plans alike.
    auto rank0_core_rate = [&]() {
      double rate = 0;
      std::string error;
      if (lead) {
        try {
          rate = core_rate().flops_per_s;
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      error = comm.broadcast_string(error, 0);
      if (!error.empty()) throw ConfigError(error);
      return comm.allgather(rate)[0];
    };
    ClusterLoadInfo loaded;
    hap::synth::Cluster cluster = load_cluster_config(cluster_path, rank0_core_rate, &loaded);
    if (lead && !fit.quiet && loaded.core_flops_per_s > 0)
      std::printf("%s\n", core_rate_line(cluster_path, loaded).c_str());
    hap::synth::SynthesisOptions synthesis = synthesis_options(config);
    synthesis.devices = pinned_devices(config.parallel, cluster);
    DistributedOptions dist{std::move(cluster),
                            std::move(synthesis),
                            plan_file,
                            config.parallel.collective_timeout_s,
                            config.parallel.backend,
                            config.parallel.share_gpus};
    if (!plan_json.empty())
      if (const std::string reason = unwritable_reason(plan_json); !reason.empty())
        throw ConfigError("--plan-json '" + plan_json + "': cannot write: " + reason);
    if (lead && !fit.quiet) std::printf("%s\n", describe(config).c_str());
    auto model = build_model(config, /*shapes_only=*/true);  // each rank draws only its shards
    Trainer trainer(model, open_dataset(config, *model), config.train, comm, std::move(dist));
    if (lead && !fit.quiet)
      std::printf("%s\n", plan_report(*trainer.cost_model(), *trainer.program(), {}).c_str());
    if (lead && !plan_json.empty()) save_plan(plan_json, *trainer.cost_model(), *trainer.program());
    if (trainer.left_out() && !fit.quiet)
      std::printf("hap-train: rank %d is left out by the plan (%s); it waits for the others\n",
                  comm.rank(), trainer.program()->devices_note.c_str());
    TrainSummary s = trainer.fit(fit);
    if (trainer.is_lead() && !fit.quiet)
      std::printf("hap-train: done on %d ranks: %s\n", trainer.world_size(),
                  summary_text(s).c_str());
    return 0;
  } catch (const ConfigError& e) {
    if (lead) std::fprintf(stderr, "hap-train: config error: %s\n", e.what());
    return 2;
  } catch (const StopRequested& e) {
    // Every rank stopped after the same step; rank 0 wrote the checkpoint.
    if (lead) std::fprintf(stderr, "hap-train: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    // Possibly on this rank only: end every rank now rather than leave them in a collective.
    std::fprintf(stderr, "hap-train: rank %d: error: %s\n", comm.rank(),
                 synthesis_error_message(e.what(), config.parallel).c_str());
    comm.abort_all(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"hap-train: train a model as a YAML run config describes"};
  std::string config_path, cluster_path, plan_json, plan_file;
  std::vector<std::string> overrides;
  FitOptions fit;
  cli.add_option("--config", config_path, "run config (YAML)")->required();
  cli.add_option("--set", overrides, "override a config key: --set train.steps=100 (repeatable)");
  cli.add_option("--resume", fit.resume_path,
                 "resume from a checkpoint written by --save, or 'auto': the newest in "
                 "train.checkpoint_dir (a fresh start when it holds none)");
  cli.add_option("--save", fit.checkpoint_path, "write a checkpoint at the end");
  cli.add_option("--stop-after", fit.stop_after,
                 "stop after this step (with --save: resume later)");
  cli.add_flag("--quiet", fit.quiet, "no progress lines");
  cli.add_flag("--profile", fit.profile,
               "at the end, print where the step time went (op kernels; with --cluster also each "
               "collective, per rank)");
  std::string trace_steps;
  cli.add_option("--trace", fit.trace_path,
                 "write a Chrome trace / Perfetto timeline (JSON) of --trace-steps: every op, "
                 "collective and wait of every rank, one track per rank");
  cli.add_option("--trace-steps", trace_steps,
                 "the steps --trace records: N or FIRST-LAST, numbered as the progress lines "
                 "(default: the second step run)");
  cli.add_option("--cluster", cluster_path,
                 "train on MPI ranks: the cluster they form (YAML); the config's parallel section "
                 "(--set parallel.strategy=hap|dp-ev|dp-cp|tp|dp-ep) says how");
  cli.add_option("--plan-json", plan_json, "with --cluster: write the plan (rank 0)");
  cli.add_option("--plan", plan_file, "with --cluster: run this plan (from hap-plan --json)");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  RunConfig config;
  try {
    config = load_run_config(config_path, {overrides.begin(), overrides.end()});
  } catch (...) {
    return report_current_exception("hap-train");
  }
  fit.run_config = to_json(config);
  if (fit.resume_path == "auto") {
    if (config.train.checkpoint_dir.empty()) {
      std::fprintf(stderr,
                   "hap-train: config error: --resume auto: train.checkpoint_dir is not set (the "
                   "folder to resume from)\n");
      return 2;
    }
    fit.resume_path = newest_checkpoint(config.train.checkpoint_dir);
    if (!fit.quiet && hap::parallel::launcher_rank() <= 0)  // under mpirun or srun: rank 0 says it
      std::printf(
          "hap-train: --resume auto: %s\n",
          fit.resume_path.empty()
              ? ("no checkpoint in " + config.train.checkpoint_dir + ": starting fresh").c_str()
              : ("resuming from " + fit.resume_path).c_str());
  }
  // A checkpoint that cannot be written is found now, not after the last step.
  if (!fit.checkpoint_path.empty())
    if (const std::string reason = unwritable_reason(fit.checkpoint_path); !reason.empty()) {
      std::fprintf(stderr, "hap-train: config error: --save '%s': cannot write: %s\n",
                   fit.checkpoint_path.c_str(), reason.c_str());
      return 2;
    }
  if (!trace_steps.empty()) {
    long long first = 0, last = 0;
    char dash = 0, extra = 0;
    const int n = std::sscanf(trace_steps.c_str(), "%lld%c%lld%c", &first, &dash, &last, &extra);
    if (n == 1) last = first;
    if (!(n == 1 || (n == 3 && dash == '-')) || first < 1 || last < first ||
        last > config.train.steps) {
      std::fprintf(stderr,
                   "hap-train: config error: --trace-steps '%s': expected N or FIRST-LAST with "
                   "1 <= FIRST <= LAST <= train.steps (%ld)\n",
                   trace_steps.c_str(), static_cast<long>(config.train.steps));
      return 2;
    }
    if (fit.trace_path.empty()) {
      std::fprintf(stderr, "hap-train: config error: --trace-steps needs --trace FILE\n");
      return 2;
    }
    fit.trace_first = first - 1;
    fit.trace_last = last - 1;
  }
  if (!fit.trace_path.empty())
    if (const std::string reason = unwritable_reason(fit.trace_path); !reason.empty()) {
      std::fprintf(stderr, "hap-train: config error: --trace '%s': cannot write: %s\n",
                   fit.trace_path.c_str(), reason.c_str());
      return 2;
    }
  // SIGTERM, SIGINT, SIGUSR1: finish the step, write a checkpoint, exit 128 + the signal.
  install_stop_signals();
  if (!cluster_path.empty()) {
    try {
      return run_distributed(argc, argv, config, cluster_path, plan_json, plan_file, fit);
    } catch (const std::exception& e) {
      // Before MPI came up (run_distributed handles everything after): this process alone.
      std::fprintf(stderr, "hap-train: error: %s\n", e.what());
      return 1;
    }
  }
  if (!plan_file.empty() || !plan_json.empty()) {
    std::fprintf(stderr, "hap-train: %s needs --cluster (the cluster the plan is for)\n",
                 plan_file.empty() ? "--plan-json" : "--plan");
    return 2;
  }
  try {
    if (!fit.quiet) std::printf("%s\n", describe(config).c_str());
    auto model = build_model(config);
    Trainer trainer(model, open_dataset(config, *model), config.train);
    TrainSummary s = trainer.fit(fit);
    if (!fit.quiet) std::printf("hap-train: done: %s\n", summary_text(s).c_str());
    return 0;
  } catch (const StopRequested& e) {
    std::fprintf(stderr, "hap-train: %s\n", e.what());
    return e.exit_code();
  } catch (...) {
    return report_current_exception("hap-train");
  }
}
