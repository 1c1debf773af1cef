// hap-plan end to end: the graph dump, a plan with its report and JSON, and bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
  ASSERT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --dump-graph", &out, &err), 0) << err;
  EXPECT_NE(out.find("param %0(wte.weight):f32[256, 32]"), std::string::npos) << out;
  EXPECT_NE(out.find("blocks.1"), std::string::npos);
  EXPECT_NE(out.find("Attention"), std::string::npos);
  EXPECT_NE(out.find("CrossEntropy"), std::string::npos);
}

TEST(PlanBinary, PlansTheEmulatedClusterAndWritesJsonWithRatiosSummingToOne) {
  std::string out, err;
  std::string json = (fs::temp_directory_path() / ("hap_plan_" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " +
                         src("configs/clusters/emu-mixed4.yaml") + " --json " + json,
                     &out, &err),
            0)
      << err;
  for (const char* s : {"ratios", "strategy per layer", "collectives per step", "predicted step time",
                        "per device", "predicted speed-up of hap over: dp-ev", "synthesis time"})
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

TEST(PlanBinary, ClusterWithNoDevicesIsAConfigError) {
  std::string out, err;
  fs::path bad = fs::temp_directory_path() / ("hap_empty_cluster_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(bad) << "name: empty\nnodes: []\n";
  EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " + bad.string(), &out, &err), 2);
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
  fs::path bad = fs::temp_directory_path() / ("hap_implausible_" + std::to_string(::getpid()) + ".yaml");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.device);
    std::ofstream(bad) << "nodes:\n  - link: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}\n"
                       << "    devices:\n      - " << c.device << "\n";
    std::string out, err;
    EXPECT_EQ(run_plan("--config " + src("configs/gpt-tiny.yaml") + " --cluster " + bad.string(), &out, &err),
              2)
        << err;
    EXPECT_NE(err.find(bad.string() + ": nodes[0].devices[0]." + c.key + ": expected "), std::string::npos)
        << err;
    EXPECT_NE(err.find(" in ["), std::string::npos) << err;
    EXPECT_NE(err.find("got " + c.got), std::string::npos) << err;
  }
  fs::remove(bad);
}

}  // namespace
