// hap-plan end to end: the graph dump, a plan with its report and JSON, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "synth/cluster.h"
#include "synth/cost_model.h"
#include "tests/factor_broadcast_util.h"
#include "tests/zero_storage_util.h"
#include "train/config.h"
#include "train/from_config.h"
#include "train/plan_io.h"
#include "train/plan_report.h"
#include "train/trace.h"

namespace {

namespace fs = std::filesystem;

std::string src(const std::string& rel) { return std::string(HAP_SOURCE_DIR) + "/" + rel; }

int run_plan(const std::string& args, std::string* out, std::string* err) {
  fs::path base = fs::temp_directory_path() / ("hap_plan_" + std::to_string(::getpid()));
  std::string o = base.string() + ".out", e = base.string() + ".err";
  int rc = std::system((std::string(HAP_PLAN_BIN) + " " + args + " > " + o + " 2> " + e).c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  *out = slurp(o);
  *err = slurp(e);
  fs::remove(o);
  fs::remove(e);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(PlanBinary, DumpGraphListsParametersAndOpsWithTheirModules) {
  std::string out, err;
  ASSERT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --dump-graph", &out, &err), 0)
      << err;
  EXPECT_NE(out.find("param %0(wte.weight):f32[256, 32]"), std::string::npos) << out;
  EXPECT_NE(out.find("blocks.1"), std::string::npos);
  EXPECT_NE(out.find("Attention"), std::string::npos);
  EXPECT_NE(out.find("CrossEntropy"), std::string::npos);
}

TEST(PlanBinary, PlansTheEmulatedClusterAndWritesJsonWithRatiosSummingToOne) {
  std::string out, err;
  std::string json =
      (fs::temp_directory_path() / ("hap_plan_" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                         src("configs/clusters/emu-mixed4.yaml") + " --json " + json,
                     &out, &err),
            0)
      << err;
  for (const char* s :
       {"ratios", "strategy per layer", "collectives per step", "predicted step time", "per device",
        "predicted speed-up of hap over: dp-ev", "synthesis time"})
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  std::ifstream in(json);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["strategy"], "hap");
  for (const auto& r : j["ratios"]) {
    double s = 0;
    for (double x : r) s += x;
    EXPECT_NEAR(s, 1.0, 1e-9);
  }
  EXPECT_GT(j["instructions"].size(), 0u);
  fs::remove(json);
}

// A link that passes only part of an overlapped collective while the devices compute (its
// profiled 'overlap'): the report says so, and the step is never predicted faster for it.
TEST(PlanBinary, TheReportSaysWhereLinksOverlapOnlyPartOfACollective) {
  std::ifstream in(src("configs/clusters/emu-mixed4.yaml"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string link = "link: {bandwidth_bytes_per_s: 5.0e9, latency_s: 5.0e-6}";
  ASSERT_NE(text.find(link), std::string::npos);
  const fs::path dir =
      fs::temp_directory_path() / ("hap_plan_overlap_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto cluster_with = [&](const std::string& name, const std::string& overlap) {
    std::string t = text;
    t.replace(t.find(link), link.size(),
              "link: {bandwidth_bytes_per_s: 5.0e9, latency_s: 5.0e-6" + overlap + "}");
    const std::string path = (dir / name).string();
    std::ofstream(path) << t;
    return path;
  };
  const std::string args = "--config " + src("configs/gpt-tiny.yaml") +
                           " --set parallel.strategy=dp-cp --set parallel.select_devices=false" +
                           " --cluster ";
  std::string whole, part, err;
  ASSERT_EQ(run_plan(args + cluster_with("whole.yaml", ""), &whole, &err), 0) << err;
  ASSERT_EQ(run_plan(args + cluster_with("part.yaml", ", overlap: 0.25"), &part, &err), 0) << err;
  EXPECT_EQ(whole.find("overlap:"), std::string::npos) << whole;
  EXPECT_NE(part.find("overlap: gradient buckets and parameter gathers move at 25% of their pace"),
            std::string::npos)
      << part;
  auto step_ms = [](const std::string& report) {
    const std::string key = "predicted step time: ";
    const size_t at = report.find(key);
    return at == std::string::npos ? -1.0 : std::stod(report.substr(at + key.size()));
  };
  EXPECT_GT(step_ms(whole), 0.0) << whole;
  EXPECT_GE(step_ms(part), step_ms(whole));
  fs::remove_all(dir);
}

TEST(PlanBinary, UnknownStrategyAndMissingClusterExitWith2) {
  std::string out, err;
  EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                         src("configs/clusters/emu-mixed4.yaml") + " --strategy zero",
                     &out, &err),
            2);
  EXPECT_NE(err.find("parallel.strategy"), std::string::npos) << err;
  EXPECT_NE(err.find("zero"), std::string::npos) << err;
  EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml"), &out, &err), 2);
  EXPECT_NE(err.find("--cluster"), std::string::npos) << err;
}

// Options that contradict the model (recomputation off where only recomputing fits): a config
// error naming the key, exit code 2, as hap-train gives.
TEST(PlanBinary, RecomputationOffWhereOnlyItFitsIsAConfigError) {
  const fs::path small =
      fs::temp_directory_path() / ("hap_small_memory_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(small) << "name: small-memory\nnodes:\n  - name: n\n"
                          "    link: {bandwidth_bytes_per_s: 1.0e10, latency_s: 1.0e-5}\n"
                          "    devices:\n"
                          "      - {name: a, type: t, flops_per_s: 1.0e12, memory_bytes: 800000}\n"
                          "      - {name: b, type: t, flops_per_s: 1.0e12, memory_bytes: 800000}\n";
  const std::string plan =
      "--config " + src("configs/gpt-tiny.yaml") + " --cluster " + small.string();
  std::string out, err;
  ASSERT_EQ(run_plan(plan, &out, &err), 0) << err;
  EXPECT_NE(out.find("recomputation: 3 of 3 segments"), std::string::npos) << out;
  EXPECT_EQ(run_plan(plan + " --set parallel.recompute=off", &out, &err), 2) << err;
  EXPECT_NE(err.find("hap-plan: config error: no program fits in memory"), std::string::npos)
      << err;
  EXPECT_NE(err.find("parallel.recompute: off forbids"), std::string::npos) << err;
  fs::remove(small);
}

TEST(PlanBinary, ClusterWithNoDevicesIsAConfigError) {
  std::string out, err;
  fs::path bad =
      fs::temp_directory_path() / ("hap_empty_cluster_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(bad) << "name: empty\nnodes: []\n";
  EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " + bad.string(),
                     &out, &err),
            2);
  EXPECT_NE(err.find(bad.string()), std::string::npos) << err;
  fs::remove(bad);
}

// Values far outside any real device used to reach the ratio LP, which aborted (exit 134).
TEST(PlanBinary, ImplausibleClusterFiguresExitWith2NamingTheKeyAndRange) {
  struct Case {
    std::string device, key, got;
  };
  const std::vector<Case> cases = {
      {"{type: cpu, flops_per_s: 1e-300, memory_bytes: 1GiB, count: 2}", "flops_per_s", "1e-300"},
      {"{type: cpu, flops_per_s: 1e308, memory_bytes: 1GiB, count: 2}", "flops_per_s", "1e308"},
      {"{type: cpu, flops_per_s: 1e10, memory_bytes: 1GiB, update_s_per_param: 1e30, count: 2}",
       "update_s_per_param", "1e30"},
      {"{type: cpu, flops_per_s: 1e10, memory_bytes: 1GiB, memory_bandwidth_bytes_per_s: 1e-30, "
       "count: 2}",
       "memory_bandwidth_bytes_per_s", "1e-30"},
  };
  fs::path bad =
      fs::temp_directory_path() / ("hap_implausible_" + std::to_string(::getpid()) + ".yaml");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.device);
    std::ofstream(bad) << "nodes:\n  - link: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}\n"
                       << "    devices:\n      - " << c.device << "\n";
    std::string out, err;
    EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " + bad.string(),
                       &out, &err),
              2)
        << err;
    EXPECT_NE(err.find(bad.string() + ": nodes[0].devices[0]." + c.key + ": expected "),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(" in ["), std::string::npos) << err;
    EXPECT_NE(err.find("got " + c.got), std::string::npos) << err;
  }
  fs::remove(bad);
}

TEST(PlanBinary, UnwritableJsonPathIsRefusedBeforePlanningWithTheReason) {
  std::string out, err;
  const std::string plan = "--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                           src("configs/clusters/emu-mixed4.yaml");
  EXPECT_EQ(run_plan(plan + " --json /nonexistent/dir/p.json", &out, &err), 2);
  EXPECT_NE(err.find("cannot write --json '/nonexistent/dir/p.json': the folder '/nonexistent/dir' "
                     "does not exist"),
            std::string::npos)
      << err;
  EXPECT_EQ(out.find("predicted step time"), std::string::npos) << "planned before refusing:\n"
                                                                << out;
  const std::string dir = fs::temp_directory_path().string();
  EXPECT_EQ(run_plan(plan + " --json " + dir, &out, &err), 2);
  EXPECT_NE(err.find("cannot write --json '" + dir + "': it is a directory"), std::string::npos)
      << err;
}

TEST(PlanBinary, EmptyOptionValuesAreRefused) {
  const std::string plan = "--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                           src("configs/clusters/emu-mixed4.yaml");
  for (const char* option : {"--json", "--strategy", "--segments", "--search-budget"}) {
    SCOPED_TRACE(option);
    std::string out, err;
    EXPECT_EQ(run_plan(plan + " " + option + " ''", &out, &err), 2);
    EXPECT_NE(err.find(std::string(option) + ": expected a non-empty value, got ''"),
              std::string::npos)
        << err;
  }
}

TEST(PlanBinary, BadStrategyOrSegmentsNameTheirOption) {
  const std::string plan = "--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                           src("configs/clusters/emu-mixed4.yaml");
  std::string out, err;
  EXPECT_EQ(run_plan(plan + " --strategy foo", &out, &err), 2);
  EXPECT_NE(
      err.find(
          "parallel.strategy: expected one of 'hap', 'dp-ev', 'dp-cp', 'tp', 'dp-ep', got 'foo' "
          "(value from --strategy foo)"),
      std::string::npos)
      << err;
  EXPECT_EQ(err.find("--set"), std::string::npos) << err;
  EXPECT_EQ(run_plan(plan + " --segments all", &out, &err), 2);
  EXPECT_NE(err.find("(value from --segments all)"), std::string::npos) << err;
}

TEST(PlanBinary, SearchBudgetIsAnOptionAndRunningOutNamesIt) {
  const std::string plan = "--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                           src("configs/clusters/two-devices.yaml") + " --set model.n_layer=96";
  std::string out, err;
  // Two uneven devices take some 5500 states to plan a 96-layer gpt-tiny with hap, 1800 with
  // dp-cp. Over its budget, dp-cp stops with an error naming the key and the option ...
  EXPECT_EQ(run_plan(plan + " --strategy dp-cp --search-budget 1000", &out, &err), 1);
  EXPECT_NE(err.find("expanded more than 1000 states"), std::string::npos) << err;
  EXPECT_NE(err.find("parallel.search_budget = 1000 states"), std::string::npos) << err;
  EXPECT_NE(err.find("--search-budget N"), std::string::npos) << err;
  EXPECT_EQ(run_plan(plan + " --strategy dp-cp --set parallel.search_budget=1000", &out, &err), 1);
  EXPECT_NE(err.find("parallel.search_budget = 1000 states"), std::string::npos) << err;
  // ... and hap returns the best baseline program, saying so.
  EXPECT_EQ(run_plan(plan + " --search-budget 1000", &out, &err), 0) << err;
  EXPECT_NE(out.find("note: hap's search went over its budget of 1000 states"), std::string::npos)
      << out;
  EXPECT_NE(out.find("parallel.search_budget"), std::string::npos) << out;
  EXPECT_EQ(run_plan(plan + " --search-budget 999", &out, &err), 2);
  EXPECT_NE(err.find("parallel.search_budget: expected an integer >= 1000, got 999 (value from "
                     "--search-budget 999)"),
            std::string::npos)
      << err;
  EXPECT_EQ(run_plan(plan + " --search-budget 100000", &out, &err), 0) << err;
  EXPECT_NE(out.find("predicted step time"), std::string::npos) << out;
}

// 16 sequences over 64 devices: the ratios give every device a share, but the batch comes in whole
// rows, so 48 devices get none; the report says what each really gets.
TEST(PlanBinary, RatiosThatRoundToWholeRowsShowWhatEachDeviceGets) {
  std::string out, err;
  ASSERT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                         src("configs/clusters/hap-paper.yaml") +
                         " --set train.batch_size=16 --strategy dp-cp",
                     &out, &err),
            0)
      << err;
  const size_t at = out.find("  segment 0:");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  const size_t rows = line.find("(in whole rows of");
  ASSERT_NE(rows, std::string::npos) << line;
  // 16 of the 64 get a sixteenth each, the others nothing.
  std::istringstream shares(line.substr(line.find(':', rows) + 1));
  int sixteenths = 0, zeros = 0;
  for (std::string x; shares >> x;) {
    if (x.back() == ')') x.pop_back();
    const double v = std::stod(x);
    sixteenths += std::abs(v - 1.0 / 16) < 1e-6;
    zeros += v == 0.0;
  }
  EXPECT_EQ(sixteenths, 16) << line;
  EXPECT_EQ(zeros, 48) << line;
}

// ---- the report, on programs made up to hit its edge cases ----

// `names.size()` devices of 1 GiB on one node.
hap::synth::Cluster cluster_of(const std::vector<std::string>& names) {
  std::vector<hap::synth::Device> devices;
  for (const std::string& name : names)
    devices.push_back({.name = name, .type = "cpu", .flops_per_s = 1e10, .memory_bytes = 1 << 30});
  hap::synth::Cluster c;
  c.name = "test";
  c.add_node("n", {.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-5}, std::move(devices));
  return c;
}

std::vector<std::string> numbered(int n) {
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i) names.push_back("d" + std::to_string(i));
  return names;
}

// A program of no instructions taking `step_s`, with even shares.
hap::synth::DistributedProgram program(const hap::synth::Cluster& c, double step_s) {
  hap::synth::DistributedProgram p;
  p.strategy = "hap";
  p.ratios = {std::vector<double>(c.size(), 1.0 / c.size())};
  p.predicted_step_s = p.compute_s = step_s;
  p.device_compute_s.assign(c.size(), step_s);
  p.device_memory_bytes.assign(c.size(), 1e6);
  return p;
}

class PlanReport : public ::testing::Test {
 protected:
  void SetUp() override {
    const hap::train::RunConfig config = hap::train::load_run_config(src("configs/gpt-tiny.yaml"));
    graph_ =
        hap::train::trace_model(*hap::train::build_model(config, true), config.train.batch_size);
  }

  std::string report(const hap::synth::Cluster& c, const hap::synth::DistributedProgram& p,
                     const std::vector<hap::synth::DistributedProgram>& baselines = {}) const {
    const hap::synth::CostModel cm(graph_, c);
    return hap::train::plan_report(cm, p, baselines);
  }

  // The report's lines that start with `prefix`.
  static std::vector<std::string> lines_starting(const std::string& text,
                                                 const std::string& prefix) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(prefix, 0) == 0) lines.push_back(line);
    return lines;
  }

  hap::synth::Graph graph_;
};

// A program whose all-reduces run hierarchically says how many, over which nodes, and what they
// take against the flat form; one without says nothing of it.
TEST_F(PlanReport, HierarchicalAllReducesAreCountedWithWhatTheySave) {
  hap::synth::Cluster c;
  c.name = "two-nodes";
  c.inter_node = {1e6, 1e-3};
  const std::vector<hap::synth::Device> devs = cluster_of(numbered(4)).devices;
  c.add_node("a", {1e10, 1e-6}, {devs[0], devs[1]});
  c.add_node("b", {1e10, 1e-6}, {devs[2], devs[3]});
  c.validate();
  hap::synth::SynthesisOptions o;
  o.strategy = hap::synth::Strategy::DpCp;
  const hap::synth::DistributedProgram hier = hap::synth::synthesize(graph_, c, o);
  const std::vector<std::string> lines =
      lines_starting(report(c, hier), "hierarchical collectives: ");
  ASSERT_EQ(lines.size(), 1u) << report(c, hier);
  EXPECT_NE(lines[0].find("inside each of the 2 nodes, then across them in 2 lanes"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("where flat ones would take"), std::string::npos) << lines[0];
  o.hierarchical_collectives = false;
  const hap::synth::DistributedProgram flat = hap::synth::synthesize(graph_, c, o);
  EXPECT_TRUE(lines_starting(report(c, flat), "hierarchical collectives").empty());
}

// A program that stores parameters sharded and gathers them for use (ZeRO storage) says how many,
// how large, and how many it gathers again in backward (marked * in the list); one without says
// nothing of it.
TEST_F(PlanReport, ZeroStorageIsCountedAndGatheredAgainMarked) {
  const hap::synth::Cluster c = cluster_of(numbered(2));
  hap::synth::SynthesisOptions o;
  o.strategy = hap::synth::Strategy::DpCp;
  o.select_devices = false;
  hap::synth::DistributedProgram p = hap::synth::synthesize(graph_, c, o);
  EXPECT_TRUE(lines_starting(report(c, p), "ZeRO storage").empty());
  const int n = hap::test_util::apply_zero_storage(graph_, p, true);
  ASSERT_GE(n, 1);
  const std::string out = report(c, p);
  const std::vector<std::string> lines = lines_starting(out, "ZeRO storage: ");
  ASSERT_EQ(lines.size(), 1u) << out;
  EXPECT_NE(lines[0].find(std::to_string(n) + " parameter"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(std::to_string(n) + " of them not kept for backward"), std::string::npos)
      << lines[0];
  EXPECT_NE(out.find("all_gather*"), std::string::npos) << out;
  EXPECT_NE(out.find("(* gathered again in backward"), std::string::npos) << out;
}

// A program whose products compute their parameters' gradients from broadcast factors says how
// many and what moves instead, and lists the factor_broadcast collectives; one without says
// nothing of it.
TEST_F(PlanReport, FactorBroadcastIsCountedAndListed) {
  const hap::synth::Cluster c = cluster_of(numbered(2));
  hap::synth::SynthesisOptions o;
  o.strategy = hap::synth::Strategy::DpCp;
  o.select_devices = false;
  hap::synth::DistributedProgram p = hap::synth::synthesize(graph_, c, o);
  EXPECT_TRUE(lines_starting(report(c, p), "factor broadcasting").empty());
  const int n =
      hap::test_util::apply_factor_broadcast(graph_, p, hap::synth::CollectiveMethod::Grouped);
  ASSERT_GE(n, 1);
  const std::string out = report(c, p);
  const std::vector<std::string> lines = lines_starting(out, "factor broadcasting: ");
  ASSERT_EQ(lines.size(), 1u) << out;
  EXPECT_NE(lines[0].find(std::to_string(n) + " product"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("instead of all-reducing them"), std::string::npos) << lines[0];
  EXPECT_NE(out.find("total factor_broadcast grouped: " + std::to_string(n) + " x"),
            std::string::npos)
      << out;
  const std::vector<std::string> listed = lines_starting(out, "  factor_broadcast ");
  ASSERT_EQ(listed.size(), static_cast<size_t>(n)) << out;
  EXPECT_NE(listed[0].find(" factors "), std::string::npos) << listed[0];
}

TEST_F(PlanReport, TimesKeepTheirUnitAtAnySize) {
  const hap::synth::Cluster c = cluster_of(numbered(2));
  std::string out = report(c, program(c, 2e30));
  EXPECT_NE(out.find("predicted step time: 2.00e+30 s (compute 2.00e+30 s"), std::string::npos)
      << out;
  out = report(c, program(c, 3e-10));
  EXPECT_NE(out.find("predicted step time: 0.3 ns"), std::string::npos) << out;
  out = report(c, program(c, 0.0125));
  EXPECT_NE(out.find("predicted step time: 12.500 ms"), std::string::npos) << out;
}

TEST_F(PlanReport, LongDeviceNamesKeepOneRowPerDeviceAndTheOverFlag) {
  const std::string long_name(300, 'd');
  const hap::synth::Cluster c = cluster_of({long_name, "short"});
  hap::synth::DistributedProgram p = program(c, 1e-3);
  p.device_memory_bytes[0] = 2.0 * (1 << 30);
  const std::string out = report(c, p);
  const std::vector<std::string> rows = lines_starting(out, "  0 ");
  ASSERT_EQ(rows.size(), 1u) << out;
  EXPECT_NE(rows[0].find(long_name + " compute "), std::string::npos) << rows[0];
  EXPECT_TRUE(rows[0].ends_with("of    1.0 GiB  OVER")) << rows[0];
  const std::vector<std::string> second = lines_starting(out, "  1 ");
  ASSERT_EQ(second.size(), 1u) << out;
  EXPECT_NE(second[0].find("short"), std::string::npos);
  EXPECT_TRUE(second[0].ends_with("of    1.0 GiB")) << second[0];
  EXPECT_EQ(second[0].size(), rows[0].size() - std::string("  OVER").size()) << "columns line up";
}

TEST_F(PlanReport, SpeedUpsCloseToOneShowWhichWayTheyGo) {
  const hap::synth::Cluster c = cluster_of(numbered(2));
  const hap::synth::DistributedProgram p = program(c, 1.0);
  std::vector<hap::synth::DistributedProgram> baselines = {program(c, 0.996), program(c, 1.0004),
                                                           program(c, 1.0), program(c, 2.5)};
  const char* names[] = {"dp-ev", "dp-cp", "tp", "other"};
  for (std::size_t i = 0; i < baselines.size(); ++i) baselines[i].strategy = names[i];
  const std::string out = report(c, p, baselines);
  EXPECT_NE(out.find("predicted speed-up of hap over: dp-ev 0.996x (996.000 ms); dp-cp 1.0004x "
                     "(1.000 s); tp 1.00x (1.000 s); other 2.50x (2.500 s);"),
            std::string::npos)
      << out;
}

TEST_F(PlanReport, SharesOfManyDevicesAreShownWithEnoughDigitsToSumToOne) {
  const hap::synth::Cluster c = cluster_of(numbered(64));
  hap::synth::DistributedProgram p = program(c, 1.0);
  // 16 fast devices and 48 slow ones, as on the hap-paper cluster.
  for (int d = 0; d < 64; ++d)
    p.ratios[0][d] = d < 16 ? 3.86 / (16 * 3.86 + 48 * 2.15) : 2.15 / (16 * 3.86 + 48 * 2.15);
  p.ratios[0].back() = 1e-9;  // and one share far too small for the fixed decimals
  const std::vector<std::string> rows = lines_starting(report(c, p), "  segment 0:");
  ASSERT_EQ(rows.size(), 1u);
  std::istringstream in(rows[0].substr(std::string("  segment 0:").size()));
  std::vector<std::string> shares;
  double sum = 0;
  for (std::string share; in >> share;) {
    shares.push_back(share);
    sum += std::stod(share);
  }
  ASSERT_EQ(shares.size(), 64u) << rows[0];
  EXPECT_EQ(shares[0], "0.02340") << rows[0];
  EXPECT_EQ(shares[16], "0.01303") << rows[0];
  EXPECT_EQ(shares.back(), "1.0e-09") << "a tiny share is not printed as 0";
  double expected = 0;
  for (double r : p.ratios[0]) expected += r;
  EXPECT_NEAR(sum, expected, 0.0005) << rows[0];
}

TEST_F(PlanReport, OneDeviceListsNoCollectives) {
  const hap::synth::Cluster c = cluster_of({"only"});
  hap::synth::DistributedProgram p = program(c, 1e-3);
  hap::synth::Instruction grad;
  grad.kind = hap::synth::InstrKind::GradAllReduce;
  grad.tensor = 0;
  p.instructions.push_back(grad);
  const std::string out = report(c, p);
  EXPECT_NE(out.find("collectives per step:\n  none (one device)\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("grad_all_reduce"), std::string::npos) << out;
}

}  // namespace
