// Synthesis time and predicted step times. Part 1: GPT (d=768, 12 heads, vocab 50257, T=128,
// global batch 8 x devices, so that 48 layers still fit in 16 GiB P100s under the memory model)
// with 12, 24 and 48 layers on 4, 8, 16 and 64 mixed devices (V100 and P100 nodes, one core). Part
// 2: predicted step time of hap against dp-ev, dp-cp and tp on the shipped clusters, with the ratio
// to the compute lower bound. Writes bench/results/synthesis.json.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "ops/threads.h"
#include "synth/synthesizer.h"
#include "train/cluster_config.h"
#include "train/config.h"
#include "train/from_config.h"
#include "train/trace.h"

namespace {

using namespace hap;

// N devices in nodes of up to 8: the first quarter V100 nodes, the rest P100 (the paper's mix).
synth::Cluster mixed_cluster(int n) {
  synth::Cluster c;
  c.name = "v100-p100-x" + std::to_string(n);
  c.inter_node = {1.3e9, 2e-5};
  int per_node = std::min(8, std::max(1, n / 2));
  int v100 = std::max(1, n / 4);
  for (int start = 0, node = 0; start < n; start += per_node, ++node) {
    std::vector<synth::Device> devs;
    for (int i = start; i < std::min(n, start + per_node); ++i) {
      bool fast = i < v100;
      devs.push_back({"d" + std::to_string(i), fast ? "v100" : "p100", fast ? 3.86e12 : 2.15e12,
                      fast ? int64_t{32} << 30 : int64_t{16} << 30, -1});
    }
    c.add_node("node" + std::to_string(node), {1e10, 1e-5}, devs);
  }
  c.validate();
  return c;
}

// GPT-2 small's shape with `layers` blocks, traced for a global batch of `batch` x 128 tokens.
synth::Graph gpt_graph(int layers, int64_t batch) {
  nn::GPTConfig c;
  c.vocab_size = 50257;
  c.block_size = 128;
  c.n_layer = layers;
  c.n_head = 12;
  c.n_embd = 768;
  std::shared_ptr<nn::GPT> model;
  {
    MetaGuard meta;
    model = std::make_shared<nn::GPT>(c);
  }
  return train::trace_model(*model, batch);
}

// Three GPU types, `n` devices in nodes of 8 over 100 Gbit/s: 8 A100, then V100 and T4 halves.
synth::Cluster three_type_cluster(int n) {
  synth::Cluster c;
  c.name = "a100-v100-t4-x" + std::to_string(n);
  c.inter_node = {1.25e10, 1e-5};
  const int v100_end = 8 + (n - 8) / 2;
  for (int start = 0, node = 0; start < n; start += 8, ++node) {
    std::vector<synth::Device> devs;
    for (int i = start; i < std::min(n, start + 8); ++i) {
      if (i < 8)
        devs.push_back({"a100-" + std::to_string(i), "a100", 1.5e13, int64_t{80} << 30, -1});
      else if (i < v100_end)
        devs.push_back({"v100-" + std::to_string(i), "v100", 7e12, int64_t{32} << 30, -1});
      else
        devs.push_back({"t4-" + std::to_string(i), "t4", 4e12, int64_t{16} << 30, -1});
    }
    c.add_node("node" + std::to_string(node), {1e11, 5e-6}, devs);
  }
  c.validate();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"Synthesis time and predicted step times"};
  std::string out = std::string(HAP_SOURCE_DIR) + "/bench/results/synthesis.json";
  std::vector<int> layer_counts = {12, 24, 48}, device_counts = {4, 8, 16, 64};
  cli.add_option("--out", out, "results JSON");
  cli.add_option("--layers", layer_counts, "layer counts");
  cli.add_option("--devices", device_counts, "device counts");
  bool show_steps = false;
  cli.add_flag("--show-steps", show_steps,
               "print each synthesis step of hap (what it searched, states, step time, seconds)");
  int select_devices = 256;
  cli.add_option("--selection-devices", select_devices,
                 "devices of the three-type cluster for the device-selection case (0: skip)");
  CLI11_PARSE(cli, argc, argv);
  hap::set_num_threads(1);

  nlohmann::json timing = nlohmann::json::array();
  std::printf(
      "synthesis time (hap strategy, one core), with and without dominance pruning\n"
      "%8s %8s %10s %12s %10s %14s %14s\n",
      "layers", "devices", "synth s", "states", "step s", "no-dom synth s", "no-dom states");
  for (int L : layer_counts)
    for (int N : device_counts) {
      const synth::Graph graph = gpt_graph(L, 8 * N);
      synth::Cluster c = mixed_cluster(N);
      synth::DistributedProgram p;
      try {
        p = synth::synthesize(graph, c, synth::SynthesisOptions{});
      } catch (const hap::Error& e) {
        std::printf("%8d %8d %10s  %s\n", L, N, "-", e.what());
        timing.push_back({{"layers", L}, {"devices", N}, {"error", e.what()}});
        continue;
      }
      if (show_steps)
        for (const auto& st : p.steps)
          std::printf("   step %-70.70s %9lld %10.4f %7.3f s %s\n", st.what.c_str(),
                      static_cast<long long>(st.states), st.cost_s, st.seconds, st.outcome.c_str());
      synth::SynthesisOptions memo_only;
      memo_only.dominance_pruning = false;
      const synth::DistributedProgram q = synth::synthesize(graph, c, memo_only);
      std::printf("%8d %8d %10.3f %12lld %10.4f %14.3f %14lld\n", L, N, p.synthesis_s,
                  static_cast<long long>(p.states_expanded), p.predicted_step_s, q.synthesis_s,
                  static_cast<long long>(q.states_expanded));
      std::fflush(stdout);
      timing.push_back({{"layers", L},
                        {"devices", N},
                        {"synthesis_s", p.synthesis_s},
                        {"states", p.states_expanded},
                        {"rounds", p.search_iterations},
                        {"predicted_step_s", p.predicted_step_s},
                        {"graph_nodes", graph.nodes.size()},
                        {"without_dominance",
                         {{"synthesis_s", q.synthesis_s},
                          {"states", q.states_expanded},
                          {"predicted_step_s", q.predicted_step_s}}}});
    }

  // Predicted step times on the shipped clusters: the default GPT on the emulated CPU clusters,
  // GPT-2 small (12 layers) with batch 32 x devices on the GPU clusters.
  struct Case {
    std::string cluster;
    bool gpu;
  };
  std::vector<Case> cases = {
      {"emu-mixed4", false}, {"emu-2node", false}, {"hap-paper", true}, {"modern-mix", true}};
  nlohmann::json predicted = nlohmann::json::array();
  std::printf("\npredicted step time per strategy\n%-12s %10s %10s %10s %10s %10s %8s\n", "cluster",
              "hap", "dp-ev", "dp-cp", "tp", "bound", "hap/bnd");
  for (const Case& k : cases) {
    synth::Cluster c = train::load_cluster_config(std::string(HAP_SOURCE_DIR) +
                                                  "/configs/clusters/" + k.cluster + ".yaml");
    const train::RunConfig run =
        train::load_run_config(std::string(HAP_SOURCE_DIR) + "/configs/gpt.yaml", {});
    const int layers = k.gpu ? 12 : static_cast<int>(run.model.options.integer("n_layer"));
    const int64_t batch = k.gpu ? 32 * c.size() : run.train.batch_size;
    const synth::Graph graph =
        k.gpu ? gpt_graph(layers, batch)
              : train::trace_model(*train::build_model(run, /*shapes_only=*/true), batch);
    synth::CostModel cm(graph, c);
    nlohmann::json row = {{"cluster", k.cluster},
                          {"devices", c.size()},
                          {"layers", layers},
                          {"global_batch", batch},
                          {"compute_lower_bound_s", cm.compute_lower_bound_s()}};
    std::printf("%-12s", k.cluster.c_str());
    for (auto s : {synth::Strategy::Hap, synth::Strategy::DpEv, synth::Strategy::DpCp,
                   synth::Strategy::Tp}) {
      synth::SynthesisOptions o;
      o.strategy = s;
      try {
        synth::DistributedProgram p = synth::synthesize(graph, c, o);
        row[synth::strategy_name(s)] = {{"predicted_step_s", p.predicted_step_s},
                                        {"compute_s", p.compute_s},
                                        {"communication_s", p.communication_s},
                                        {"synthesis_s", p.synthesis_s}};
        std::printf(" %10.4f", p.predicted_step_s);
      } catch (const hap::Error& e) {
        row[synth::strategy_name(s)] = {{"error", e.what()}};
        std::printf(" %10s", "infeasible");
      }
    }
    double hap_s = row["hap"].value("predicted_step_s", 0.0);
    row["hap_over_lower_bound"] = hap_s / cm.compute_lower_bound_s();
    std::printf(" %10.4f %8.3f\n", cm.compute_lower_bound_s(), hap_s / cm.compute_lower_bound_s());
    predicted.push_back(row);
  }
  // Device selection: GPT-2 small at global batch 16 on 256 devices of three types. hap (which
  // may leave devices out) against hap made to use all of them and hap pinned to each subset of
  // the k fastest devices (k = 1, 2, 4, ..., and the 8 A100s).
  nlohmann::json selection;
  if (select_devices > 0) {
    const synth::Cluster c = three_type_cluster(select_devices);
    const synth::Graph graph = gpt_graph(12, 16);
    std::printf("\ndevice selection: GPT-2 small, global batch 16, on %s\n", c.name.c_str());
    const synth::DistributedProgram hap = synth::synthesize(graph, c, synth::SynthesisOptions{});
    synth::SynthesisOptions all;
    all.select_devices = false;
    const synth::DistributedProgram on_all = synth::synthesize(graph, c, all);
    std::printf("  hap: %.4f s on %zu devices (synthesis %.2f s); %s\n", hap.predicted_step_s,
                hap.devices.empty() ? static_cast<size_t>(c.size()) : hap.devices.size(),
                hap.synthesis_s, hap.devices_note.c_str());
    std::printf("  hap on all %d: %.4f s (synthesis %.2f s)\n", c.size(), on_all.predicted_step_s,
                on_all.synthesis_s);
    nlohmann::json subsets = nlohmann::json::array();
    double best_subset = std::numeric_limits<double>::infinity();
    for (int k = 1; k < c.size(); k *= 2) {
      std::vector<int> fastest;  // the devices are listed fastest first
      for (int d = 0; d < k; ++d) fastest.push_back(d);
      synth::SynthesisOptions pinned;
      pinned.devices = fastest;
      try {
        const synth::DistributedProgram p = synth::synthesize(graph, c, pinned);
        best_subset = std::min(best_subset, p.predicted_step_s);
        subsets.push_back({{"devices", k}, {"predicted_step_s", p.predicted_step_s}});
        std::printf("  hap pinned to the %d fastest: %.4f s\n", k, p.predicted_step_s);
      } catch (const hap::Error& e) {
        subsets.push_back({{"devices", k}, {"error", e.what()}});
        std::printf("  hap pinned to the %d fastest: no program (%s)\n", k, e.what());
      }
    }
    selection = {
        {"cluster", c.name},
        {"devices", c.size()},
        {"global_batch", 16},
        {"hap",
         {{"predicted_step_s", hap.predicted_step_s},
          {"devices_used", hap.devices.empty() ? c.size() : static_cast<int>(hap.devices.size())},
          {"note", hap.devices_note},
          {"synthesis_s", hap.synthesis_s}}},
        {"hap_on_all", {{"predicted_step_s", on_all.predicted_step_s}}},
        {"hap_pinned_to_fastest", subsets},
        {"hap_over_best_subset", hap.predicted_step_s / best_subset},
        {"speedup_over_all", on_all.predicted_step_s / hap.predicted_step_s}};
    std::printf("  hap / best pinned subset: %.3f; hap's speed-up over all devices: %.1fx\n",
                hap.predicted_step_s / best_subset, on_all.predicted_step_s / hap.predicted_step_s);
  }
  nlohmann::json doc = {{"benchmark", "synthesis"},
                        {"threads", 1},
                        {"synthesis_time", timing},
                        {"predicted_step", predicted},
                        {"device_selection", selection}};
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
