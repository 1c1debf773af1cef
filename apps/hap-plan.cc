// hap-plan: synthesize (and explain) a distributed program offline, for any cluster size.
//   hap-plan --config configs/gpt.yaml --cluster configs/clusters/hap-paper.yaml
//            [--strategy hap|dp-ev|dp-cp|tp] [--segments per-block|single] [--json FILE]
//            [--search-budget STATES] [--set key.path=value]...
//   hap-plan --config configs/gpt.yaml --dump-graph
//   hap-plan --cluster FILE --describe-cluster   (the validated cluster as JSON: scripts read it)
// Exit codes: 0 planned, 1 no feasible plan or another run-time error, 2 bad input (config,
// cluster, options, a --json path that cannot be written).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/cluster_config.h"
#include "apps/common/config.h"
#include "apps/common/dist_trainer.h"
#include "apps/common/model_graph.h"
#include "apps/common/plan_report.h"
#include "synth/synthesizer.h"

namespace {

// The validated cluster, one device per rank, for scripts (scripts/hap-emulate) that must not
// parse cluster files themselves.
nlohmann::json cluster_to_json(const hap::synth::Cluster& cluster) {
  auto link = [](const hap::synth::Link& l) {
    return nlohmann::json{{"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s}, {"latency_s", l.latency_s}};
  };
  nlohmann::json j;
  j["name"] = cluster.name;
  j["devices"] = nlohmann::json::array();
  for (int r = 0; r < cluster.size(); ++r) {
    const hap::synth::Device& d = cluster.devices[r];
    j["devices"].push_back({{"rank", r},
                            {"name", d.name},
                            {"type", d.type},
                            {"node", d.node},
                            {"flops_per_s", d.flops_per_s},
                            {"memory_bytes", d.memory_bytes},
                            {"cpu_quota", d.cpu_quota}});
  }
  j["nodes"] = nlohmann::json::array();
  for (const hap::synth::Node& n : cluster.nodes)
    j["nodes"].push_back({{"name", n.name}, {"devices", n.devices}, {"link", link(n.link)}});
  if (cluster.num_nodes() > 1) j["inter_node"] = link(cluster.inter_node);
  return j;
}

// Why the file at `path` cannot be written (the OS's reason), or "" when it can.
std::string unwritable_reason(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return "it is a directory";
  const bool exists = fs::exists(path, ec);
  fs::path target = exists ? fs::path(path) : fs::path(path).parent_path();
  if (target.empty()) target = ".";
  if (!exists && fs::exists(target, ec) && !fs::is_directory(target, ec))
    return "'" + target.string() + "' is not a directory";
  if (::access(target.c_str(), W_OK) != 0) return std::strerror(errno);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"hap-plan: synthesize a ratio-sharded SPMD program for a model on a cluster"};
  std::string config_path, cluster_path, strategy, segments, json_path, search_budget;
  std::vector<std::string> overrides;
  bool dump_graph = false, describe_cluster = false;
  cli.add_option("--config", config_path, "run config (YAML): the model and the global batch");
  cli.add_option("--cluster", cluster_path, "cluster description (YAML)");
  cli.add_option("--strategy", strategy, "hap, dp-ev, dp-cp or tp (default: the config's parallel.strategy)");
  cli.add_option("--segments", segments, "per-block or single (default: the config's parallel.segments)");
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
      std::printf("%s\n", cluster_to_json(hap::app::load_cluster_config(cluster_path)).dump(2).c_str());
      return 0;
    } catch (...) {
      return hap::app::report_current_exception("hap-plan");
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
    if (const std::string reason = unwritable_reason(json_path); !reason.empty()) {
      std::fprintf(stderr, "hap-plan: cannot write --json '%s': %s\n", json_path.c_str(),
                   reason.c_str());
      return 2;
    }
  }
  std::vector<hap::app::ConfigOverride> config_overrides(overrides.begin(), overrides.end());
  if (!strategy.empty())
    config_overrides.emplace_back("parallel.strategy=" + strategy, "--strategy " + strategy);
  if (!segments.empty())
    config_overrides.emplace_back("parallel.segments=" + segments, "--segments " + segments);
  if (!search_budget.empty())
    config_overrides.emplace_back("parallel.search_budget=" + search_budget,
                                  "--search-budget " + search_budget);
  try {
    hap::app::TrainRunConfig config = hap::app::load_train_config(config_path, config_overrides);
    hap::app::TracedModel tm = hap::app::trace_model(config);
    if (dump_graph) std::printf("%s", tm.graph.str().c_str());
    if (cluster_path.empty()) return 0;
    hap::synth::Cluster cluster = hap::app::load_cluster_config(cluster_path);

    hap::synth::SynthesisOptions opt = hap::app::synthesis_options(config.parallel);
    hap::synth::Strategy strat = opt.strategy;
    hap::synth::DistributedProgram plan;
    try {
      plan = hap::synth::synthesize(tm.graph, cluster, opt);
    } catch (const hap::Error& e) {
      std::fprintf(stderr, "hap-plan: error: %s\n",
                   hap::app::synthesis_error_message(e.what(), config.parallel).c_str());
      return 1;
    }
    std::vector<hap::synth::DistributedProgram> baselines;
    for (auto s : {hap::synth::Strategy::DpEv, hap::synth::Strategy::DpCp, hap::synth::Strategy::Tp}) {
      if (s == strat) continue;
      hap::synth::SynthesisOptions b = opt;
      b.strategy = s;
      try {
        baselines.push_back(hap::synth::synthesize(tm.graph, cluster, b));
      } catch (const hap::Error& e) {
        std::printf("note: baseline %s has no feasible program: %s\n", hap::synth::strategy_name(s),
                    hap::app::synthesis_error_message(e.what(), config.parallel).c_str());
      }
    }
    hap::synth::CostModel cm(tm.graph, cluster);
    std::printf("%s", hap::app::plan_report(cm, plan, baselines).c_str());
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      if (out) out << hap::app::plan_to_json(cm, plan).dump(2) << "\n";
      if (out) out.close();
      if (!out) {
        std::fprintf(stderr, "hap-plan: cannot write --json '%s': %s\n", json_path.c_str(),
                     std::strerror(errno));
        return 1;
      }
      std::printf("wrote %s\n", json_path.c_str());
    }
    return 0;
  } catch (...) {
    return hap::app::report_current_exception("hap-plan");
  }
}
