// hap-plan: synthesize (and explain) a distributed program offline, for any cluster size.
//   hap-plan --config configs/gpt.yaml --cluster configs/clusters/hap-paper.yaml
//            [--strategy hap|dp-ev|dp-cp|tp|dp-ep] [--segments per-block|single] [--json FILE]
//            [--search-budget STATES] [--set key.path=value]...
//   hap-plan --config configs/gpt.yaml --dump-graph
//   hap-plan --cluster FILE --describe-cluster   (the validated cluster as JSON: scripts read it)
// Exit codes: 0 planned, 1 no feasible plan or another run-time error, 2 bad input (config,
// cluster, options, a --json path that cannot be written).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "synth/synthesizer.h"
#include "train/cluster_config.h"
#include "train/config.h"
#include "train/core_rate.h"
#include "train/from_config.h"
#include "train/output_path.h"
#include "train/plan_io.h"
#include "train/plan_report.h"
#include "train/trace.h"

int main(int argc, char** argv) {
  CLI::App cli{"hap-plan: synthesize a ratio-sharded SPMD program for a model on a cluster"};
  std::string config_path, cluster_path, strategy, segments, json_path, search_budget;
  std::vector<std::string> overrides;
  bool dump_graph = false, describe_cluster = false;
  cli.add_option("--config", config_path, "run config (YAML): the model and the global batch");
  cli.add_option("--cluster", cluster_path, "cluster description (YAML)");
  cli.add_option("--strategy", strategy,
                 "hap, dp-ev, dp-cp, tp or dp-ep (default: the config's parallel.strategy)");
  cli.add_option("--segments", segments,
                 "per-block or single (default: the config's parallel.segments)");
  cli.add_option("--search-budget", search_budget,
                 "states the program search may expand per round (default: the config's "
                 "parallel.search_budget, 2000000)");
  cli.add_option("--set", overrides, "override a config key (repeatable)");
  cli.add_option("--json", json_path, "write the plan as JSON");
  cli.add_flag("--dump-graph", dump_graph, "print the traced graph");
  cli.add_flag("--describe-cluster", describe_cluster,
               "print the validated --cluster as JSON (one device per rank) and exit");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e) == 0 ? 0 : 2;
  }
  // An empty value would silently mean "not given".
  for (const auto& [option, value] :
       {std::pair<const char*, const std::string*>{"--config", &config_path},
        {"--cluster", &cluster_path},
        {"--strategy", &strategy},
        {"--segments", &segments},
        {"--json", &json_path},
        {"--search-budget", &search_budget}}) {
    if (cli.count(option) > 0 && value->empty()) {
      std::fprintf(stderr, "hap-plan: %s: expected a non-empty value, got ''\n", option);
      return 2;
    }
  }
  if (describe_cluster) {
    if (cluster_path.empty()) {
      std::fprintf(stderr, "hap-plan: --describe-cluster needs --cluster FILE\n");
      return 2;
    }
    try {
      hap::train::ClusterLoadInfo loaded;
      nlohmann::json j =
          hap::train::cluster_to_json(hap::train::load_cluster_config(cluster_path, {}, &loaded));
      // Scripts pass these on (HAP_CORE_FLOPS) so that ranks under CPU quotas never measure.
      if (loaded.core_flops_per_s > 0) {
        j["core_flops_per_s"] = loaded.core_flops_per_s;
        j["core_flops_source"] = hap::train::core_rate().source;
      }
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    } catch (...) {
      return hap::train::report_current_exception("hap-plan");
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "hap-plan: --config FILE is required\n");
    return 2;
  }
  if (!dump_graph && cluster_path.empty()) {
    std::fprintf(stderr, "hap-plan: --cluster FILE is required to plan (or pass --dump-graph)\n");
    return 2;
  }
  // Checked before planning, which can take minutes, rather than after.
  if (!json_path.empty()) {
    if (const std::string reason = hap::train::unwritable_reason(json_path); !reason.empty()) {
      std::fprintf(stderr, "hap-plan: cannot write --json '%s': %s\n", json_path.c_str(),
                   reason.c_str());
      return 2;
    }
  }
  std::vector<hap::train::ConfigOverride> config_overrides(overrides.begin(), overrides.end());
  if (!strategy.empty())
    config_overrides.emplace_back("parallel.strategy=" + strategy, "--strategy " + strategy);
  if (!segments.empty())
    config_overrides.emplace_back("parallel.segments=" + segments, "--segments " + segments);
  if (!search_budget.empty())
    config_overrides.emplace_back("parallel.search_budget=" + search_budget,
                                  "--search-budget " + search_budget);
  try {
    const hap::train::RunConfig config = hap::train::load_run_config(config_path, config_overrides);
    const hap::synth::Graph graph =
        hap::train::trace_model(*hap::train::build_model(config, /*shapes_only=*/true),
                                config.train.batch_size, config.train.precision);
    if (dump_graph) std::printf("%s", graph.str().c_str());
    if (cluster_path.empty()) return 0;
    hap::train::ClusterLoadInfo loaded;
    hap::synth::Cluster cluster = hap::train::load_cluster_config(cluster_path, {}, &loaded);
    if (loaded.core_flops_per_s > 0)
      std::printf("%s\n", hap::train::core_rate_line(cluster_path, loaded).c_str());

    hap::synth::SynthesisOptions opt = hap::train::synthesis_options(config);
    opt.devices = hap::train::pinned_devices(config.parallel, cluster);
    hap::synth::Strategy strat = opt.strategy;
    hap::synth::DistributedProgram plan;
    try {
      plan = hap::synth::synthesize(graph, cluster, opt);
    } catch (const hap::synth::OptionsError&) {
      throw;  // options that contradict the model: a config error (exit 2), below
    } catch (const hap::Error& e) {
      std::fprintf(stderr, "hap-plan: error: %s\n",
                   hap::train::synthesis_error_message(e.what(), config.parallel).c_str());
      return 1;
    }
    std::vector<hap::synth::DistributedProgram> baselines;
    for (auto s : {hap::synth::Strategy::DpEv, hap::synth::Strategy::DpCp, hap::synth::Strategy::Tp,
                   hap::synth::Strategy::DpEp}) {
      if (s == strat) continue;
      // dp-ep differs from dp-ev only where there are expert weights to split.
      if (s == hap::synth::Strategy::DpEp && !hap::synth::has_expert_weights(graph)) continue;
      hap::synth::SynthesisOptions b = opt;
      b.strategy = s;
      try {
        baselines.push_back(hap::synth::synthesize(graph, cluster, b));
      } catch (const hap::Error& e) {
        std::printf("note: baseline %s has no feasible program: %s\n", hap::synth::strategy_name(s),
                    hap::train::synthesis_error_message(e.what(), config.parallel).c_str());
      }
    }
    // The program's cost model is that of the devices it runs on.
    const hap::synth::Cluster plan_cluster =
        plan.devices.empty() ? cluster : cluster.subset(plan.devices);
    hap::synth::CostModel cm(graph, plan_cluster, opt.optimizer_state_slots, opt.overlap_grad_comm);
    cm.set_hierarchical(opt.hierarchical_collectives);
    cm.set_recompute(plan.node_segment, plan.recompute);
    std::printf("%s", hap::train::plan_report(cm, plan, baselines).c_str());
    if (!json_path.empty()) {
      hap::train::save_plan(json_path, cm, plan);
      std::printf("wrote %s\n", json_path.c_str());
    }
    return 0;
  } catch (...) {
    return hap::train::report_current_exception("hap-plan");
  }
}
