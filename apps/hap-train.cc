// hap-train: train a model from a YAML run config, on one process or on a cluster.
//   hap-train --config configs/gpt.yaml [--set key.path=value]... [--resume CKPT] [--save CKPT]
//   mpirun -np N hap-train --config configs/gpt.yaml --cluster configs/clusters/X.yaml
//          [--set parallel.strategy=hap|dp-ev|dp-cp|tp] [--plan FILE] [--plan-json FILE]
// Exit codes: 0 done, 1 run-time error (data, divergence, I/O), 2 bad config or command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/common/cluster_config.h"
#include "apps/common/config.h"
#include "apps/common/dist_trainer.h"
#include "apps/common/trainer.h"

namespace {

int run_distributed(int argc, char** argv, hap::app::TrainRunConfig config,
                    const std::string& cluster_path, const std::string& plan_json,
                    const std::string& plan_file, const hap::app::TrainOptions& train_options) {
  bool quiet = train_options.quiet;
  hap::parallel::MpiSession mpi(&argc, &argv);
  hap::parallel::Communicator comm = hap::parallel::Communicator::world();
  bool lead = comm.rank() == 0;
  hap::app::DistTrainOptions opt;
  opt.quiet = quiet;
  opt.plan_json = plan_json;
  opt.plan_file = plan_file;
  opt.checkpoint_path = train_options.checkpoint_path;
  opt.resume_path = train_options.resume_path;
  opt.stop_after = train_options.stop_after;
  opt.profile = train_options.profile;
  // Ranks usually share a machine's cores: train.threads 0 means one thread per rank here.
  if (config.train.threads == 0) config.train.threads = 1;
  try {
    // Errors up to here come from the same inputs on every rank, so every rank stops alike.
    hap::synth::Cluster cluster = hap::app::load_cluster_config(cluster_path);
    opt.synthesis = hap::app::synthesis_options(config.parallel);
    if (lead && !quiet) std::printf("%s\n", hap::app::describe(config).c_str());
    hap::app::TrainSummary s = hap::app::train_distributed(config, cluster, opt, comm);
    if (lead && !quiet)
      std::printf("hap-train: done on %d ranks: %s\n", comm.size(), hap::app::summary_text(s).c_str());
    return 0;
  } catch (const hap::app::ConfigError& e) {
    if (lead) std::fprintf(stderr, "hap-train: config error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Possibly on this rank only: end every rank now rather than leave them in a collective.
    std::fprintf(stderr, "hap-train: rank %d: error: %s\n", comm.rank(),
                 hap::app::synthesis_error_message(e.what(), config.parallel).c_str());
    comm.abort_all(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"hap-train: train a model as a YAML run config describes"};
  std::string config_path;
  std::vector<std::string> overrides;
  hap::app::TrainOptions options;
  cli.add_option("--config", config_path, "run config (YAML)")->required();
  cli.add_option("--set", overrides, "override a config key: --set train.steps=100 (repeatable)");
  cli.add_option("--resume", options.resume_path, "resume from a checkpoint written by --save");
  cli.add_option("--save", options.checkpoint_path, "write a checkpoint at the end");
  cli.add_option("--stop-after", options.stop_after, "stop after this step (with --save: resume later)");
  cli.add_flag("--quiet", options.quiet, "no progress lines");
  cli.add_flag("--profile", options.profile,
               "at the end, print where the step time went (op kernels; with --cluster also each "
               "collective, per rank)");
  std::string cluster_path, plan_json;
  cli.add_option("--cluster", cluster_path,
                 "train on MPI ranks: the cluster they form (YAML); the config's parallel section "
                 "(--set parallel.strategy=hap|dp-ev|dp-cp|tp) says how");
  cli.add_option("--plan-json", plan_json, "with --cluster: write the plan (rank 0)");
  std::string plan_file;
  cli.add_option("--plan", plan_file, "with --cluster: run this plan (from hap-plan --json)");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = cli.exit(e);
    return code == 0 ? 0 : 2;
  }
  hap::app::TrainRunConfig config;
  try {
    config = hap::app::load_train_config(config_path, {overrides.begin(), overrides.end()});
  } catch (...) {
    return hap::app::report_current_exception("hap-train");
  }
  if (!cluster_path.empty()) {
    try {
      return run_distributed(argc, argv, config, cluster_path, plan_json, plan_file, options);
    } catch (const std::exception& e) {
      // Before MPI came up (run_distributed handles everything after): this process alone.
      std::fprintf(stderr, "hap-train: error: %s\n", e.what());
      return 1;
    }
  }
  if (!plan_file.empty()) {
    std::fprintf(stderr, "hap-train: --plan needs --cluster (the cluster the plan was made for)\n");
    return 2;
  }
  if (!options.quiet) std::printf("%s\n", hap::app::describe(config).c_str());
  try {
    hap::app::TrainSummary s = hap::app::train(config, options);
    if (!options.quiet)
      std::printf("hap-train: done: %s\n", hap::app::summary_text(s).c_str());
    return 0;
  } catch (...) {
    return hap::app::report_current_exception("hap-train");
  }
}
