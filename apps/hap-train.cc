// hap-train: train a model from a YAML run config.
//   hap-train --config configs/gpt.yaml [--set key.path=value]... [--resume CKPT] [--save CKPT]
// Exit codes: 0 done, 1 run-time error (data, divergence, I/O), 2 bad config or command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/common/config.h"
#include "apps/common/trainer.h"

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
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = cli.exit(e);
    return code == 0 ? 0 : 2;
  }
  hap::app::TrainRunConfig config;
  try {
    config = hap::app::load_train_config(config_path, overrides);
  } catch (const hap::app::ConfigError& e) {
    std::fprintf(stderr, "hap-train: config error: %s\n", e.what());
    return 2;
  }
  if (!options.quiet) std::printf("%s\n", hap::app::describe(config).c_str());
  try {
    hap::app::TrainSummary s = hap::app::train(config, options);
    if (!options.quiet)
      std::printf("hap-train: done: %ld steps, loss %.4f -> %.4f, val loss %.4f, median %.1f ms/step\n",
                  static_cast<long>(s.steps_run), s.first_loss, s.last_loss, s.last_val_loss, s.median_step_ms);
    return 0;
  } catch (const hap::app::ConfigError& e) {
    std::fprintf(stderr, "hap-train: config error: %s\n", e.what());
    return 2;
  } catch (const hap::Error& e) {
    std::fprintf(stderr, "hap-train: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hap-train: internal error: %s\n", e.what());
    return 1;
  }
}
