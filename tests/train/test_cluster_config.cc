// Loading clusters from YAML: the shipped files load and validate, `count` expands with default
// names, memory sizes take units, and every kind of bad input gives one message naming the file,
// the key path, the value and the expectation.
#include <gtest/gtest.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "train/cluster_config.h"
#include "train/cluster_profile.h"
#include "yaml_file_test.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;
using synth::Cluster;
using synth::Link;

constexpr std::int64_t kGiB = std::int64_t{1} << 30;

fs::path clusters_dir() { return fs::path(HAP_SOURCE_DIR) / "configs" / "clusters"; }
std::string shipped(const std::string& name) { return (clusters_dir() / name).string(); }

// A valid two-node cluster; each bad-input test breaks one piece of it.
constexpr const char* kValidCluster = R"(name: test
inter_node: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}
nodes:
  - name: n0
    link: {bandwidth_bytes_per_s: 1.0e10, latency_s: 2.0e-6}
    devices:
      - {name: big, type: gpu-a, flops_per_s: 4.0e12, memory_bytes: 32GiB}
      - {type: gpu-b, flops_per_s: 2.0e12, memory_bytes: 16GiB, count: 2}
  - name: n1
    link: {bandwidth_bytes_per_s: 5.0e9, latency_s: 3.0e-6}
    devices:
      - {type: gpu-c, flops_per_s: 1.0e12, memory_bytes: 8.0e9}
)";

class ClusterFileTest : public YamlFileTest {
 protected:
  std::string write(const std::string& text, const std::string& name = "cluster.yaml") const {
    return YamlFileTest::write(text, name);
  }

  // The valid document with the first occurrence of `from` replaced by `to`.
  static std::string edited(const std::string& from, const std::string& to) {
    return replace_first(kValidCluster, from, to);
  }

  // The valid cluster with the memory of nodes[1].devices[0] written as `memory`.
  std::string with_memory(const std::string& memory) const {
    return write(edited("memory_bytes: 8.0e9", "memory_bytes: " + memory));
  }
};

// The message of the ConfigError that loading throws; fails the test when nothing is thrown.
std::string load_error(const std::string& path) {
  try {
    load_cluster_config(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << path << " did not throw a ConfigError";
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message lacks \"" << part << "\":\n  " << message;
}

// ---- the shipped clusters ----

TEST(ShippedCluster, EveryFileLoadsAndValidates) {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(clusters_dir())) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    Cluster c;
    // A file in cores (emulated clusters) resolves them with a given per-core rate here.
    constexpr double kCore = 1.5e11;
    ASSERT_NO_THROW(c = load_cluster_config(entry.path().string(), [] { return kCore; }));
    EXPECT_NO_THROW(c.validate());
    EXPECT_EQ(c.name, entry.path().stem().string()) << "a cluster is named like its file";
    // Node by node, the devices the file lists (an entry with `count` stands for that many),
    // with their FLOP/s, in rank order; the FLOP/s shares follow them.
    const YAML::Node file = YAML::LoadFile(entry.path().string());
    ASSERT_EQ(c.num_nodes(), static_cast<int>(file["nodes"].size()));
    std::vector<double> flops;
    for (size_t n = 0; n < file["nodes"].size(); ++n) {
      const YAML::Node node = file["nodes"][n];
      if (node["name"]) {
        EXPECT_EQ(c.nodes[n].name, node["name"].as<std::string>());
      }
      for (const YAML::Node& d : node["devices"]) {
        const int count = d["count"] ? d["count"].as<int>() : 1;
        const std::string text = d["flops_per_s"].as<std::string>();
        const bool cores = text.find("core") != std::string::npos;
        const double f = cores ? std::stod(text) * kCore : d["flops_per_s"].as<double>();
        for (int i = 0; i < count; ++i) flops.push_back(f);
      }
    }
    ASSERT_EQ(c.size(), static_cast<int>(flops.size()));
    double total = 0;
    for (double f : flops) total += f;
    for (int r = 0; r < c.size(); ++r) {
      EXPECT_EQ(c.devices[r].flops_per_s, flops[r]) << "rank " << r;
      EXPECT_NEAR(c.flops_ratios()[r], flops[r] / total, 1e-12) << "rank " << r;
    }
    const std::string head = "cluster " + c.name + ": " + std::to_string(c.size()) +
                             (c.size() == 1 ? " device on " : " devices on ");
    EXPECT_EQ(c.summary().rfind(head, 0), 0u) << c.summary();
    names.insert(entry.path().filename().string());
  }
  for (const char* expected : {"emu-mixed4.yaml", "emu-2node.yaml", "emu-gpu-mixed4.yaml",
                               "hap-paper.yaml", "modern-mix.yaml", "two-devices.yaml"})
    EXPECT_TRUE(names.contains(expected)) << "configs/clusters/" << expected << " is missing";
}

TEST(ShippedCluster, EmuMixed4IsOneNodeOfFourUnevenCpuRanks) {
  const Cluster c = load_cluster_config(shipped("emu-mixed4.yaml"));
  ASSERT_EQ(c.size(), 4);
  EXPECT_EQ(c.num_nodes(), 1);
  EXPECT_EQ(c.devices[0].name, "cpu0");
  EXPECT_EQ(c.devices[3].name, "cpu3");
  const std::vector<double> r = c.flops_ratios();
  EXPECT_DOUBLE_EQ(r[0], 0.5);  // 0.8 / (0.8 + 0.4 + 0.2 + 0.2)
  EXPECT_DOUBLE_EQ(r[1], 0.25);
  EXPECT_DOUBLE_EQ(r[2], 0.125);
  EXPECT_DOUBLE_EQ(r[3], 0.125);
  for (const synth::Device& d : c.devices) EXPECT_EQ(d.memory_bytes, 4'000'000'000);
  EXPECT_FALSE(c.spans_nodes({0, 1, 2, 3}));
  const Link link = c.bottleneck();
  EXPECT_DOUBLE_EQ(link.bandwidth_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(link.latency_s, 5e-6);
}

TEST(ShippedCluster, EmuTwoNodeSplitsTheSameRanksOverASlowLink) {
  const Cluster c = load_cluster_config(shipped("emu-2node.yaml"));
  const Cluster one = load_cluster_config(shipped("emu-mixed4.yaml"));
  ASSERT_EQ(c.size(), 4);
  ASSERT_EQ(c.num_nodes(), 2);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(c.devices[r].name, one.devices[r].name);
    EXPECT_EQ(c.devices[r].flops_per_s, one.devices[r].flops_per_s);
    EXPECT_EQ(c.devices[r].memory_bytes, one.devices[r].memory_bytes);
  }
  EXPECT_EQ(c.nodes[0].devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.nodes[1].devices, (std::vector<int>{2, 3}));
  EXPECT_TRUE(c.spans_nodes({1, 2}));
  EXPECT_DOUBLE_EQ(c.link_between(0, 1).bandwidth_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(c.link_between(1, 2).bandwidth_bytes_per_s, 1.25e8);
  EXPECT_DOUBLE_EQ(c.bottleneck().bandwidth_bytes_per_s, 1.25e8);
  EXPECT_DOUBLE_EQ(c.bottleneck().latency_s, 2e-4);
}

TEST(ShippedCluster, HapPaperIs16V100And48P100) {
  const Cluster c = load_cluster_config(shipped("hap-paper.yaml"));
  ASSERT_EQ(c.size(), 64);
  ASSERT_EQ(c.num_nodes(), 8);
  int v100 = 0;
  int p100 = 0;
  for (const synth::Device& d : c.devices) {
    if (d.type == "v100-32gb") {
      ++v100;
      EXPECT_EQ(d.flops_per_s, 3.86e12);
      EXPECT_EQ(d.memory_bytes, 32 * kGiB);
    } else {
      ++p100;
      EXPECT_EQ(d.type, "p100-16gb");
      EXPECT_EQ(d.flops_per_s, 2.15e12);
      EXPECT_EQ(d.memory_bytes, 16 * kGiB);
    }
  }
  EXPECT_EQ(v100, 16);
  EXPECT_EQ(p100, 48);
  for (const synth::Node& node : c.nodes) EXPECT_EQ(node.devices.size(), 8u);
  EXPECT_EQ(c.devices[0].name, "v100-0.v100-32gb.0");
  EXPECT_EQ(c.devices[63].name, "p100-5.p100-16gb.7");
  EXPECT_EQ(c.node_of(8), 1);
  EXPECT_EQ(c.node_of(16), 2);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_bytes_per_s, 1.3e9);
  EXPECT_DOUBLE_EQ(c.total_flops_per_s(), 16 * 3.86e12 + 48 * 2.15e12);
  EXPECT_FALSE(c.spans_nodes({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(c.spans_nodes({7, 8}));
}

TEST(ShippedCluster, ModernMixHasThreeGenerations) {
  const Cluster c = load_cluster_config(shipped("modern-mix.yaml"));
  ASSERT_EQ(c.size(), 12);
  ASSERT_EQ(c.num_nodes(), 3);
  EXPECT_EQ(c.devices[0].memory_bytes, 80 * kGiB);
  EXPECT_EQ(c.devices[4].memory_bytes, 32 * kGiB);
  EXPECT_EQ(c.devices[8].memory_bytes, 16 * kGiB);
  EXPECT_EQ(c.min_memory_bytes(), 16 * kGiB);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_bytes_per_s, 1.25e10);
  EXPECT_GT(c.devices[0].flops_per_s, c.devices[4].flops_per_s);
  EXPECT_GT(c.devices[4].flops_per_s, c.devices[8].flops_per_s);
}

TEST(ShippedCluster, TwoDevices) {
  const Cluster c = load_cluster_config(shipped("two-devices.yaml"));
  ASSERT_EQ(c.size(), 2);
  EXPECT_EQ(c.devices[0].name, "fast");
  EXPECT_EQ(c.devices[1].name, "host.cpu-slow.0");
  EXPECT_EQ(c.devices[0].memory_bytes, kGiB);
  EXPECT_EQ(c.devices[1].memory_bytes, kGiB);
  EXPECT_DOUBLE_EQ(c.flops_ratios()[0], 2.0 / 3.0);
}

// ---- reading ----

TEST_F(ClusterFileTest, ValidClusterLoadsWithCountExpansionAndDefaultNames) {
  const Cluster c = load_cluster_config(write(kValidCluster));
  EXPECT_EQ(c.name, "test");
  ASSERT_EQ(c.size(), 4);
  ASSERT_EQ(c.num_nodes(), 2);
  EXPECT_EQ(c.nodes[0].name, "n0");
  EXPECT_EQ(c.nodes[0].devices, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c.nodes[1].devices, (std::vector<int>{3}));
  EXPECT_EQ(c.devices[0].name, "big");
  EXPECT_EQ(c.devices[1].name, "n0.gpu-b.0");
  EXPECT_EQ(c.devices[2].name, "n0.gpu-b.1");
  EXPECT_EQ(c.devices[3].name, "n1.gpu-c.0");
  EXPECT_EQ(c.devices[1].type, "gpu-b");
  EXPECT_EQ(c.devices[2].flops_per_s, 2e12);
  EXPECT_EQ(c.devices[2].memory_bytes, 16 * kGiB);
  EXPECT_EQ(c.devices[3].memory_bytes, 8'000'000'000);
  EXPECT_EQ(c.devices[3].node, 1);
  EXPECT_DOUBLE_EQ(c.nodes[1].link.bandwidth_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(c.nodes[1].link.latency_s, 3e-6);
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(c.inter_node.latency_s, 1e-5);
}

TEST_F(ClusterFileTest, ANameThatIsNotUtf8IsRefused) {
  const std::string message = load_error(write(edited("name: big", "name: b\xefg")));
  EXPECT_NE(message.find("not UTF-8 text: byte 0xef at line 7, column 17"), std::string::npos)
      << message;
}

TEST_F(ClusterFileTest, DefaultIndexCountsEarlierDevicesOfTheTypeOnTheNode) {
  const Cluster c = load_cluster_config(write(R"(
nodes:
  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
    devices:
      - {name: first, type: t, flops_per_s: 1e9, memory_bytes: 1GB}
      - {type: t, flops_per_s: 1e9, memory_bytes: 1GB, count: 2}
      - {type: u, flops_per_s: 1e9, memory_bytes: 1GB}
      - {type: t, flops_per_s: 2e9, memory_bytes: 2GB}
  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
    devices:
      - {type: t, flops_per_s: 1e9, memory_bytes: 1GB, count: 3}
inter_node: {bandwidth_bytes_per_s: 1e8, latency_s: 1e-4}
)",
                                              "my-cluster.yaml"));
  EXPECT_EQ(c.name, "my-cluster") << "the name defaults to the file name";
  std::vector<std::string> names;
  for (const synth::Device& d : c.devices) names.push_back(d.name);
  EXPECT_EQ(names, (std::vector<std::string>{"first", "node0.t.1", "node0.t.2", "node0.u.0",
                                             "node0.t.3", "node1.t.0", "node1.t.1", "node1.t.2"}));
  EXPECT_EQ(c.nodes[1].name, "node1") << "node names default to node<i>";
  EXPECT_EQ(c.devices[4].flops_per_s, 2e9);
}

TEST_F(ClusterFileTest, OneNodeNeedsNoInterNodeLinkButMayHaveOne) {
  const std::string one_node = R"(nodes:
  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
    devices: [{type: t, flops_per_s: 1e9, memory_bytes: 1e9}]
)";
  const Cluster c = load_cluster_config(write(one_node));
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.devices[0].name, "node0.t.0");
  const Cluster d = load_cluster_config(
      write(one_node + "inter_node: {bandwidth_bytes_per_s: 2e9, latency_s: 1e-6}\n"));
  EXPECT_DOUBLE_EQ(d.inter_node.bandwidth_bytes_per_s, 2e9);
}

TEST_F(ClusterFileTest, MemoryTakesPlainNumbersAndUnits) {
  const std::vector<std::pair<std::string, std::int64_t>> cases = {
      {"8000000000", 8'000'000'000},
      {"8e9", 8'000'000'000},
      {"1.6e10", 16'000'000'000},
      {"32GiB", 32 * kGiB},
      {"\"32GiB\"", 32 * kGiB},
      {"'16 GB'", 16'000'000'000},
      {"16GB", 16'000'000'000},
      {"1.5GiB", 3 * kGiB / 2},
      {"512MiB", 512 * (std::int64_t{1} << 20)},
      {"64KiB", 64 * 1024},
      {"2KB", 2000},
      {"2kB", 2000},
      {"3MB", 3'000'000},
      {"1TB", 1'000'000'000'000},
      {"2TiB", 2 * 1024 * kGiB},
      {"100B", 100},
      {"1.1GB", 1'100'000'000},
      {"0.3KB", 300},
  };
  for (const auto& [text, bytes] : cases) {
    SCOPED_TRACE(text);
    const Cluster c = load_cluster_config(with_memory(text));
    EXPECT_EQ(c.devices[3].memory_bytes, bytes);
  }
}

TEST_F(ClusterFileTest, BadMemoryNamesTheValueAndTheAcceptedForms) {
  for (const std::string text : {"0", "-1", "-4GB", "0GB", "1.5", "32gib", "32 GiBs", "32PB", "GiB",
                                 "abc", "1e20", "9PiB", "0.4B", "\"\"", "nan", "1e9 B B"}) {
    SCOPED_TRACE(text);
    const std::string path = with_memory(text);
    expect_contains(load_error(path),
                    {path, ": nodes[1].devices[0].memory_bytes: expected a whole number of bytes",
                     "GiB", "got '"});
  }
  const std::string path = with_memory("[1, 2]");
  expect_contains(load_error(path), {path, "nodes[1].devices[0].memory_bytes",
                                     "expected a whole number of bytes", "got a sequence"});
  const std::string missing = write(edited(", memory_bytes: 8.0e9", ""));
  expect_contains(load_error(missing), {missing, "nodes[1].devices[0].memory_bytes",
                                        "missing required key", "whole number of bytes"});
}

// ---- errors: one per kind, each naming file, key path, value and expectation ----

// Counts within their own limit that add up past the file's: refused at the entry that does.
TEST_F(ClusterFileTest, TooManyDevicesInAllNamesTheEntryAndTheTotal) {
  const std::string path = write(edited("count: 2", "count: 65536"));
  expect_contains(load_error(path),
                  {path,
                   ": nodes[0].devices[1].count: expected at most 65536 devices in the whole "
                   "cluster file (this entry brings the total to 65537), got 65536"});
}

TEST_F(ClusterFileTest, ErrorMessageHasTheDocumentedFormat) {
  const std::string path = write(edited("flops_per_s: 1.0e12", "flops_per_s: 0"));
  EXPECT_EQ(load_error(path), path +
                                  ": nodes[1].devices[0].flops_per_s: expected a number in [1000, "
                                  "1e+18] (FLOP/s of one device), got 0");
}

TEST_F(ClusterFileTest, NonPositiveValues) {
  struct Case {
    std::string from, to, key_path, expectation, got;
  };
  const std::vector<Case> cases = {
      {"flops_per_s: 4.0e12", "flops_per_s: -4e12", "nodes[0].devices[0].flops_per_s",
       "expected a number in [1000, 1e+18]", "got -4e12"},
      {"count: 2", "count: 0", "nodes[0].devices[1].count", "expected an integer in [1, 65536]",
       "got 0"},
      {"count: 2", "count: 100000", "nodes[0].devices[1].count",
       "expected an integer in [1, 65536]", "got 100000"},
      {"bandwidth_bytes_per_s: 5.0e9", "bandwidth_bytes_per_s: 0",
       "nodes[1].link.bandwidth_bytes_per_s", "expected a number in [1000, 1e+15] (bytes/s)",
       "got 0"},
      {"latency_s: 2.0e-6", "latency_s: -2.0e-6", "nodes[0].link.latency_s",
       "expected a number in [0, 10] (seconds)", "got -2.0e-6"},
      {"bandwidth_bytes_per_s: 1.0e9", "bandwidth_bytes_per_s: -1",
       "inter_node.bandwidth_bytes_per_s", "expected a number in [1000, 1e+15]", "got -1"},
      {"flops_per_s: 4.0e12", "flops_per_s: .inf", "nodes[0].devices[0].flops_per_s",
       "expected a number", "got '.inf'"},
      {"flops_per_s: 4.0e12", "flops_per_s: 1e400", "nodes[0].devices[0].flops_per_s",
       "expected a number", "got '1e400'"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.to);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path),
                    {path + ": " + test.key_path + ": ", test.expectation, test.got});
  }
}

TEST_F(ClusterFileTest, WrongTypes) {
  struct Case {
    std::string from, to, key_path, expectation, got;
  };
  const std::vector<Case> cases = {
      {"flops_per_s: 4.0e12", "flops_per_s: fast", "nodes[0].devices[0].flops_per_s",
       "expected a number", "got 'fast'"},
      {"flops_per_s: 4.0e12", "flops_per_s: \"4e12\"", "nodes[0].devices[0].flops_per_s",
       "expected a number", "quoted string '4e12'"},
      {"count: 2", "count: 2.5", "nodes[0].devices[1].count", "expected an integer", "got '2.5'"},
      {"name: big", "name: [a, b]", "nodes[0].devices[0].name", "expected a non-empty string",
       "got a sequence"},
      {"type: gpu-c", "type: {x: 1}", "nodes[1].devices[0].type", "expected a non-empty string",
       "got a mapping"},
      {"latency_s: 1.0e-5", "latency_s: [1]", "inter_node.latency_s", "expected a number",
       "got a sequence"},
      {"link: {bandwidth_bytes_per_s: 1.0e10, latency_s: 2.0e-6}", "link: fast", "nodes[0].link",
       "expected a mapping with keys bandwidth_bytes_per_s, latency_s", "got 'fast'"},
      {"inter_node: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}", "inter_node: 10",
       "inter_node", "expected a mapping with keys bandwidth_bytes_per_s, latency_s", "got '10'"},
      {"      - {type: gpu-c, flops_per_s: 1.0e12, memory_bytes: 8.0e9}", "      - gpu-c",
       "nodes[1].devices[0]", "expected a mapping with keys name, type, flops_per_s",
       "got 'gpu-c'"},
      {"name: test", "name: [test]", "name", "expected a non-empty string", "got a sequence"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.to);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path),
                    {path + ": " + test.key_path + ": ", test.expectation, test.got});
  }
}

TEST_F(ClusterFileTest, UnknownKeysListTheValidKeys) {
  struct Case {
    std::string from, to, key_path, valid, hint;
  };
  const std::vector<Case> cases = {
      {"flops_per_s: 4.0e12", "flops_per_sec: 4.0e12", "nodes[0].devices[0].flops_per_sec",
       "valid keys of nodes[0].devices[0]: name, type, flops_per_s, memory_bytes, count",
       "(did you mean 'flops_per_s'?)"},
      {"flops_per_s: 4.0e12", "speed: 4.0e12", "nodes[0].devices[0].speed",
       "valid keys of nodes[0].devices[0]: name, type, flops_per_s, memory_bytes, count", ""},
      {"latency_s: 3.0e-6", "latency: 3.0e-6", "nodes[1].link.latency",
       "valid keys of nodes[1].link: bandwidth_bytes_per_s, latency_s",
       "(did you mean 'latency_s'?)"},
      {"  - name: n1", "  - nme: n1", "nodes[1].nme", "valid keys of nodes[1]: name, link, devices",
       "(did you mean 'name'?)"},
      {"inter_node:", "internode:", "internode",
       "valid keys of the cluster file: name, inter_node, nodes", "(did you mean 'inter_node'?)"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.to);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path),
                    {path + ": " + test.key_path + ": ", "unknown key", test.valid, test.hint});
  }
}

TEST_F(ClusterFileTest, MissingKeys) {
  struct Case {
    std::string from, to, key_path, expectation;
  };
  const std::vector<Case> cases = {
      {"type: gpu-c, ", "", "nodes[1].devices[0].type", "expected a non-empty string"},
      {"flops_per_s: 1.0e12, ", "", "nodes[1].devices[0].flops_per_s",
       "expected a number in [1000, 1e+18]"},
      {"latency_s: 3.0e-6", "", "nodes[1].link.latency_s", "expected a number in [0, 10]"},
      {"    link: {bandwidth_bytes_per_s: 5.0e9, latency_s: 3.0e-6}\n", "", "nodes[1].link",
       "expected a mapping with keys bandwidth_bytes_per_s, latency_s"},
      {"inter_node: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}\n", "", "inter_node",
       "required with more than one node, got 2 nodes"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.from);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path),
                    {path + ": " + test.key_path + ": ", "missing required", test.expectation});
  }
  const std::string no_devices = write(R"(nodes:
  - name: n0
    link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
)");
  expect_contains(load_error(no_devices), {no_devices + ": nodes[0].devices: missing required key",
                                           "expected a non-empty sequence of devices"});
  const std::string no_nodes = write("name: nothing\n");
  expect_contains(load_error(no_nodes), {no_nodes + ": nodes: missing required key",
                                         "expected a non-empty sequence of nodes"});
  const std::string empty = write("");
  expect_contains(load_error(empty), {empty + ": nodes: missing required key"});
}

TEST_F(ClusterFileTest, AClusterWithoutDevicesIsAnError) {
  const std::string empty_nodes = write("nodes: []\n");
  expect_contains(
      load_error(empty_nodes),
      {empty_nodes + ": nodes: expected a non-empty sequence of nodes", "got an empty sequence"});
  const std::string null_nodes = write("nodes:\n");
  expect_contains(load_error(null_nodes),
                  {null_nodes + ": nodes: expected a non-empty sequence", "got an empty value"});
  const std::string map_nodes = write("nodes: {a: 1}\n");
  expect_contains(load_error(map_nodes),
                  {map_nodes + ": nodes: expected a non-empty sequence", "got a mapping"});
  const std::string empty_devices = write(
      edited("    devices:\n      - {type: gpu-c, flops_per_s: 1.0e12, memory_bytes: 8.0e9}\n",
             "    devices: []\n"));
  expect_contains(load_error(empty_devices),
                  {empty_devices + ": nodes[1].devices: expected a non-empty sequence of devices",
                   "got an empty sequence"});
}

TEST_F(ClusterFileTest, NamesMustBeUnique) {
  // Two explicit names.
  std::string path = write(edited("type: gpu-c,", "name: big, type: gpu-c,"));
  expect_contains(load_error(path), {path + ": nodes[1].devices[0].name: ",
                                     "expected a unique device name, got 'big'",
                                     "already the name at nodes[0].devices[0].name"});
  // An explicit name equal to a default one.
  path = write(edited("type: gpu-c,", "name: n0.gpu-b.1, type: gpu-c,"));
  expect_contains(load_error(path), {path + ": nodes[1].devices[0].name: ", "'n0.gpu-b.1'",
                                     "already the default name of nodes[0].devices[1]"});
  // A default name equal to an earlier explicit one.
  path = write(edited("name: big", "name: n0.gpu-b.0"));
  expect_contains(load_error(path), {path + ": nodes[0].devices[1]: ",
                                     "expected a unique device name, got 'n0.gpu-b.0' (the "
                                     "default name)",
                                     "already the name at nodes[0].devices[0].name"});
  // Node names, explicit and default.
  path = write(edited("name: n1", "name: n0"));
  expect_contains(load_error(path),
                  {path + ": nodes[1].name: ", "expected a unique node name, got 'n0'",
                   "already the name at nodes[0].name"});
  path = write(R"(nodes:
  - name: node1
    link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
    devices: [{type: t, flops_per_s: 1e9, memory_bytes: 1e9}]
  - link: {bandwidth_bytes_per_s: 1e9, latency_s: 0}
    devices: [{type: t, flops_per_s: 1e9, memory_bytes: 1e9}]
inter_node: {bandwidth_bytes_per_s: 1e8, latency_s: 0}
)");
  expect_contains(load_error(path), {path + ": nodes[1]: ",
                                     "expected a unique node name, got 'node1' (the default name)",
                                     "already the name at nodes[0].name"});
}

TEST_F(ClusterFileTest, NameIsNotAllowedWithCount) {
  const std::string path = write(edited("{type: gpu-b,", "{name: twin, type: gpu-b,"));
  expect_contains(load_error(path), {path + ": nodes[0].devices[1].name: ",
                                     "expected no name on an entry with count > 1", "got twin"});
}

TEST_F(ClusterFileTest, EmptyStrings) {
  std::string path = write(edited("type: gpu-c", "type: ''"));
  expect_contains(load_error(path),
                  {path + ": nodes[1].devices[0].type: expected a non-empty string, got ''"});
  path = write(edited("name: n1", "name:"));
  expect_contains(load_error(path),
                  {path + ": nodes[1].name: expected a non-empty string, got an empty value"});
}

TEST_F(ClusterFileTest, DuplicateKey) {
  const std::string path = write(edited("count: 2", "count: 2, count: 3"));
  expect_contains(load_error(path), {path + ": nodes[0].devices[1].count: duplicate key"});
}

// ---- profiled and emulated figures ----

TEST_F(ClusterFileTest, ProfiledFiguresAndPerCollectiveLinksLoad) {
  const std::string text = replace_first(
      edited("link: {bandwidth_bytes_per_s: 1.0e10, latency_s: 2.0e-6}",
             "link: {bandwidth_bytes_per_s: 1.0e10, latency_s: 2.0e-6, overlap: 0.25, collectives: "
             "{all_reduce: {bandwidth_bytes_per_s: 4.0e9, latency_s: 9.0e-6}, all_to_all: "
             "{bandwidth_bytes_per_s: 2.0e9, latency_s: 1.0e-5}}}"),
      "memory_bytes: 32GiB}",
      "memory_bytes: 32GiB, update_s_per_param: 2.5e-9, memory_bandwidth_bytes_per_s: 9.0e11, "
      "cpu_quota: 0.5, kernel_overhead_s: 4.0e-6}");
  const Cluster c = load_cluster_config(write(text, "profiled.yaml"));
  const synth::Device& big = c.devices[0];
  EXPECT_DOUBLE_EQ(big.update_s_per_param, 2.5e-9);
  EXPECT_DOUBLE_EQ(big.memory_bandwidth_bytes_per_s, 9.0e11);
  EXPECT_DOUBLE_EQ(big.cpu_quota, 0.5);
  EXPECT_DOUBLE_EQ(big.kernel_overhead_s, 4.0e-6);
  EXPECT_DOUBLE_EQ(c.devices[1].update_s_per_param, 0.0);  // absent: not modelled
  EXPECT_DOUBLE_EQ(c.devices[1].kernel_overhead_s, 0.0);
  EXPECT_DOUBLE_EQ(c.devices[1].cpu_quota, 0.0);
  const Link& link = c.nodes[0].link;
  const Link ar = link.for_collective(synth::Collective::AllReduce);
  EXPECT_DOUBLE_EQ(ar.bandwidth_bytes_per_s, 4.0e9);
  EXPECT_DOUBLE_EQ(ar.latency_s, 9.0e-6);
  EXPECT_DOUBLE_EQ(link.for_collective(synth::Collective::AllToAll).bandwidth_bytes_per_s, 2.0e9);
  // Collectives not given fall back to the link's own figures.
  const Link ag = link.for_collective(synth::Collective::AllGather);
  EXPECT_DOUBLE_EQ(ag.bandwidth_bytes_per_s, 1.0e10);
  EXPECT_DOUBLE_EQ(ag.latency_s, 2.0e-6);
  // The share of a collective that passes while the devices compute, carried per collective too;
  // 1 where not given.
  EXPECT_DOUBLE_EQ(link.overlap, 0.25);
  EXPECT_DOUBLE_EQ(ar.overlap, 0.25);
  EXPECT_DOUBLE_EQ(c.bottleneck().overlap, 0.25);
  EXPECT_DOUBLE_EQ(load_cluster_config(write(kValidCluster, "plain.yaml")).nodes[0].link.overlap,
                   1.0);
}

// The hierarchical collectives' lanes between nodes may have figures of their own (hap-profile
// measures them), under inter_node only; inter_node's own figures stand where they are absent.
TEST_F(ClusterFileTest, LanesBetweenNodesLoadUnderInterNodeOnly) {
  const Cluster c = load_cluster_config(
      write(edited("inter_node: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5}",
                   "inter_node: {bandwidth_bytes_per_s: 1.0e9, latency_s: 1.0e-5, lanes: "
                   "{bandwidth_bytes_per_s: 3.0e9, latency_s: 4.0e-6, collectives: {all_reduce: "
                   "{bandwidth_bytes_per_s: 2.0e9, latency_s: 7.0e-6}}}}"),
            "lanes.yaml"));
  EXPECT_DOUBLE_EQ(c.inter_node.bandwidth_bytes_per_s, 1.0e9);
  EXPECT_DOUBLE_EQ(c.across_lanes().bandwidth_bytes_per_s, 3.0e9);
  EXPECT_DOUBLE_EQ(c.across_lanes().latency_s, 4.0e-6);
  EXPECT_DOUBLE_EQ(
      c.across_lanes().for_collective(synth::Collective::AllReduce).bandwidth_bytes_per_s, 2.0e9);
  const Cluster plain = load_cluster_config(write(kValidCluster, "plain.yaml"));
  EXPECT_DOUBLE_EQ(plain.lanes.bandwidth_bytes_per_s, 0.0);
  EXPECT_DOUBLE_EQ(plain.across_lanes().bandwidth_bytes_per_s, 1.0e9);
  // Bad figures name the key; a node's link has no lanes.
  expect_contains(load_error(write(edited("latency_s: 1.0e-5}",
                                          "latency_s: 1.0e-5, lanes: "
                                          "{bandwidth_bytes_per_s: 0, latency_s: 0}}"))),
                  {"inter_node.lanes.bandwidth_bytes_per_s", "expected a number in [1000, 1e+15]"});
  expect_contains(load_error(write(edited("latency_s: 2.0e-6}",
                                          "latency_s: 2.0e-6, lanes: {bandwidth_bytes_per_s: "
                                          "1e9, latency_s: 0}}"))),
                  {"nodes[0].link", "lanes"});
}

// A cluster emulated on one GPU: each device's SMs (scripts/hap-emulate gives each rank a green
// context of them); carried to the JSON hap-emulate reads, ignored by the planner.
TEST_F(ClusterFileTest, SmCountsOfAClusterEmulatedOnOneGpu) {
  const std::string text =
      replace_first(kValidCluster, "memory_bytes: 32GiB}", "memory_bytes: 32GiB, sm_count: 64}");
  const Cluster c = load_cluster_config(write(text, "gpu.yaml"));
  EXPECT_EQ(c.devices[0].sm_count, 64);
  EXPECT_EQ(c.devices[1].sm_count, 0);  // absent: a real device
  const nlohmann::json j = cluster_to_json(c);
  EXPECT_EQ(j["devices"][0]["sm_count"], 64);
  EXPECT_EQ(j["devices"][1]["sm_count"], 0);
  // The plan does not depend on it.
  const Cluster plain = load_cluster_config(write(kValidCluster, "plain.yaml"));
  EXPECT_EQ(c.summary(), plain.summary());
  const std::string device = "memory_bytes: 32GiB}";
  for (const auto& [to, expectation] : std::vector<std::pair<std::string, std::string>>{
           {"memory_bytes: 32GiB, sm_count: 0}",
            "expected an integer in [1, 4096] (SMs of the GPU the rank runs on), got 0"},
           {"memory_bytes: 32GiB, sm_count: 5000}", "expected an integer in [1, 4096]"},
           {"memory_bytes: 32GiB, sm_count: 16.5}", "expected an integer"},
           {"memory_bytes: 32GiB, sm_count: 16, cpu_quota: 0.5}",
            "expected no sm_count on a device with cpu_quota"}}) {
    SCOPED_TRACE(to);
    const std::string path = write(edited(device, to));
    expect_contains(load_error(path), {path + ": nodes[0].devices[0].sm_count", expectation});
  }
}

TEST_F(ClusterFileTest, BadProfiledAndEmulatedFiguresNameTheKey) {
  struct Case {
    std::string from, to, key_path, expectation;
  };
  const std::vector<Case> cases = {
      {"memory_bytes: 32GiB}", "memory_bytes: 32GiB, cpu_quota: 1.5}",
       "nodes[0].devices[0].cpu_quota",
       "expected a number in (0, 1] (a share of one CPU core), got 1.5"},
      {"memory_bytes: 32GiB}", "memory_bytes: 32GiB, cpu_quota: 0}",
       "nodes[0].devices[0].cpu_quota", "expected a number in (0, 1]"},
      {"memory_bytes: 32GiB}", "memory_bytes: 32GiB, update_s_per_param: -1}",
       "nodes[0].devices[0].update_s_per_param",
       "expected a number in [0, 0.001] (seconds per parameter element), got -1"},
      {"memory_bytes: 32GiB}", "memory_bytes: 32GiB, kernel_overhead_s: 2}",
       "nodes[0].devices[0].kernel_overhead_s",
       "expected a number in [0, 1] (seconds per kernel call), got 2"},
      {"memory_bytes: 32GiB}", "memory_bytes: 32GiB, memory_bandwidth_bytes_per_s: -5}",
       "nodes[0].devices[0].memory_bandwidth_bytes_per_s",
       "expected 0 (not modelled) or a number in [1000, 1e+15] (bytes/s), got -5"},
      {"latency_s: 2.0e-6}",
       "latency_s: 2.0e-6, collectives: {all_reduce: {bandwidth_bytes_per_s: 0, "
       "latency_s: 1e-6}}}",
       "nodes[0].link.collectives.all_reduce.bandwidth_bytes_per_s",
       "expected a number in [1000, 1e+15] (bytes/s), got 0"},
      {"latency_s: 2.0e-6}",
       "latency_s: 2.0e-6, collectives: {broadcast: {bandwidth_bytes_per_s: 1e9, "
       "latency_s: 1e-6}}}",
       "nodes[0].link.collectives", "broadcast"},
      {"latency_s: 2.0e-6}", "latency_s: 2.0e-6, collectives: {all_gather: {latency_s: 1e-6}}}",
       "nodes[0].link.collectives.all_gather.bandwidth_bytes_per_s", "missing required key"},
      {"latency_s: 2.0e-6}", "latency_s: 2.0e-6, overlap: 1.2}", "nodes[0].link.overlap",
       "expected a number in [0, 1] (the share of a collective that passes while devices "
       "compute), got 1.2"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.to);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path), {path + ": " + test.key_path, test.expectation});
  }
}

TEST_F(ClusterFileTest, ImplausibleFiguresAreRefusedWithTheirRange) {
  struct Case {
    std::string from, to, key_path, expectation, got;
  };
  const std::string device = "memory_bytes: 32GiB}";
  const std::vector<Case> cases = {
      {"flops_per_s: 4.0e12", "flops_per_s: 1e-300", "nodes[0].devices[0].flops_per_s",
       "expected a number in [1000, 1e+18] (FLOP/s of one device)", "got 1e-300"},
      {"flops_per_s: 4.0e12", "flops_per_s: 1e-18", "nodes[0].devices[0].flops_per_s",
       "expected a number in [1000, 1e+18]", "got 1e-18"},
      {"flops_per_s: 4.0e12", "flops_per_s: 1e308", "nodes[0].devices[0].flops_per_s",
       "expected a number in [1000, 1e+18]", "got 1e308"},
      {device, "memory_bytes: 32GiB, update_s_per_param: 1e30}",
       "nodes[0].devices[0].update_s_per_param",
       "expected a number in [0, 0.001] (seconds per parameter element)", "got 1e30"},
      {device, "memory_bytes: 32GiB, memory_bandwidth_bytes_per_s: 1e-30}",
       "nodes[0].devices[0].memory_bandwidth_bytes_per_s",
       "expected 0 (not modelled) or a number in [1000, 1e+15] (bytes/s)", "got 1e-30"},
      {device, "memory_bytes: 32GiB, memory_bandwidth_bytes_per_s: 1e16}",
       "nodes[0].devices[0].memory_bandwidth_bytes_per_s", "in [1000, 1e+15]", "got 1e16"},
      {"latency_s: 3.0e-6", "latency_s: 1.0e30", "nodes[1].link.latency_s",
       "expected a number in [0, 10] (seconds)", "got 1.0e30"},
      {"bandwidth_bytes_per_s: 1.0e9", "bandwidth_bytes_per_s: 1e-3",
       "inter_node.bandwidth_bytes_per_s", "expected a number in [1000, 1e+15] (bytes/s)",
       "got 1e-3"},
      {"bandwidth_bytes_per_s: 1.0e9", "bandwidth_bytes_per_s: 2e15",
       "inter_node.bandwidth_bytes_per_s", "expected a number in [1000, 1e+15]", "got 2e15"},
      {"latency_s: 2.0e-6}",
       "latency_s: 2.0e-6, collectives: {all_gather: {bandwidth_bytes_per_s: 1e9, latency_s: 11}}}",
       "nodes[0].link.collectives.all_gather.latency_s", "expected a number in [0, 10]", "got 11"},
      {"memory_bytes: 8.0e9", "memory_bytes: 2e15", "nodes[1].devices[0].memory_bytes",
       "expected a whole number of bytes in [1, 1e15]", "got '2e15'"},
      {"memory_bytes: 8.0e9", "memory_bytes: 1PiB", "nodes[1].devices[0].memory_bytes",
       "expected a whole number of bytes in [1, 1e15]", "got '1PiB'"},
  };
  for (const Case& test : cases) {
    SCOPED_TRACE(test.to);
    const std::string path = write(edited(test.from, test.to));
    expect_contains(load_error(path),
                    {path + ": " + test.key_path + ": ", test.expectation, test.got});
  }
}

TEST_F(ClusterFileTest, FiguresAtTheEdgesOfTheirRangesLoad) {
  const Cluster low = load_cluster_config(write(R"(nodes:
  - link: {bandwidth_bytes_per_s: 1e3, latency_s: 0}
    devices:
      - {type: t, flops_per_s: 1e3, memory_bytes: 1, update_s_per_param: 0, memory_bandwidth_bytes_per_s: 1e3}
)",
                                                "low.yaml"));
  EXPECT_EQ(low.devices[0].flops_per_s, 1e3);
  EXPECT_EQ(low.devices[0].memory_bytes, 1);
  EXPECT_EQ(low.devices[0].memory_bandwidth_bytes_per_s, 1e3);
  EXPECT_EQ(low.nodes[0].link.bandwidth_bytes_per_s, 1e3);
  const Cluster high = load_cluster_config(write(R"(nodes:
  - link: {bandwidth_bytes_per_s: 1e15, latency_s: 10}
    devices:
      - {type: t, flops_per_s: 1e18, memory_bytes: 1e15, update_s_per_param: 1e-3, memory_bandwidth_bytes_per_s: 1e15}
)",
                                                 "high.yaml"));
  EXPECT_EQ(high.devices[0].flops_per_s, 1e18);
  EXPECT_EQ(high.devices[0].memory_bytes, 1'000'000'000'000'000);
  EXPECT_EQ(high.devices[0].update_s_per_param, 1e-3);
  EXPECT_EQ(high.nodes[0].link.latency_s, 10);
}

TEST(ShippedCluster, EmulatedFilesStateComputeInCoresLikeTheirQuotas) {
  // Whatever the CPU model, an emulated rank is its quota of one core of it.
  for (const char* name : {"emu-mixed4.yaml", "emu-2node.yaml"}) {
    ClusterLoadInfo info;
    const Cluster c = load_cluster_config(
        shipped(name), [] { return 2e11; }, &info);
    EXPECT_EQ(info.core_flops_per_s, 2e11) << name;
    for (const synth::Device& d : c.devices)
      EXPECT_NEAR(d.flops_per_s, d.cpu_quota * 2e11, 1) << name << " " << d.name;
  }
}

TEST(ShippedCluster, EmulatedFilesDeclareTheirQuotas) {
  EXPECT_EQ(load_cluster_config(shipped("emu-mixed4.yaml")).devices.size(), 4u);
  for (const char* name : {"emu-mixed4.yaml", "emu-2node.yaml"}) {
    const Cluster c = load_cluster_config(shipped(name));
    std::vector<double> quotas;
    for (const synth::Device& d : c.devices) quotas.push_back(d.cpu_quota);
    EXPECT_EQ(quotas, (std::vector<double>{0.8, 0.4, 0.2, 0.2})) << name;
    // Declared FLOP/s follow the quotas, so a plan on the declared file splits like them.
    for (size_t i = 1; i < c.devices.size(); ++i)
      EXPECT_NEAR(c.devices[i].flops_per_s / c.devices[0].flops_per_s, quotas[i] / quotas[0],
                  1e-12);
  }
}

TEST_F(ClusterFileTest, ComputeInCoresIsThatManyOfThisMachinesCores) {
  int calls = 0;
  auto rate = [&calls]() {
    ++calls;
    return 1e11;
  };
  const std::string path = write(edited("flops_per_s: 4.0e12", "flops_per_s: 0.25 cores"));
  ClusterLoadInfo info;
  const Cluster c = load_cluster_config(path, rate, &info);
  EXPECT_EQ(c.devices[0].flops_per_s, 2.5e10);
  EXPECT_EQ(info.core_flops_per_s, 1e11);
  EXPECT_EQ(calls, 1);
  for (const char* text : {"1 core", "1core", "1 cores", "'1 core'", "\"1.0 cores\""}) {
    SCOPED_TRACE(text);
    calls = 0;
    const Cluster one = load_cluster_config(
        write(edited("flops_per_s: 4.0e12", std::string("flops_per_s: ") + text)), rate);
    EXPECT_EQ(one.devices[0].flops_per_s, 1e11);
    EXPECT_EQ(calls, 1);
  }
  // Every device in cores takes the rate once; a file without cores never asks for it.
  calls = 0;
  std::string every = kValidCluster;
  for (const char* f : {"4.0e12", "2.0e12", "1.0e12"})
    every = replace_first(every, std::string("flops_per_s: ") + f, "flops_per_s: 2 cores");
  const std::string all = write(every);
  load_cluster_config(all, rate);
  EXPECT_LE(calls, 1);
  calls = 0;
  ClusterLoadInfo none;
  load_cluster_config(write(kValidCluster), rate, &none);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(none.core_flops_per_s, 0);
}

TEST_F(ClusterFileTest, ComputeInCoresMustBeAPositiveNumberOfCores) {
  auto rate = [] { return 1e11; };
  for (const char* bad :
       {"0 cores", "-1 cores", "5000 cores", "cores", "core", "x cores", "0.8 corez",
        "0.8 cores per rank", "nan cores", "1e400 cores", "0.8 CORES"}) {
    SCOPED_TRACE(bad);
    const std::string path =
        write(edited("flops_per_s: 4.0e12", std::string("flops_per_s: ") + bad));
    std::string message;
    try {
      load_cluster_config(path, rate);
    } catch (const ConfigError& e) {
      message = e.what();
    }
    expect_contains(message, {path + ": nodes[0].devices[0].flops_per_s: expected a number in "
                                     "[1000, 1e+18] (FLOP/s of one device"});
  }
  // The number itself is still checked as FLOP/s.
  std::string message;
  try {
    load_cluster_config(write(edited("flops_per_s: 4.0e12", "flops_per_s: 0.001 cores")),
                        [] { return 1e5; });
  } catch (const ConfigError& e) {
    message = e.what();
  }
  expect_contains(message, {"flops_per_s", "0.001 cores"});
}

TEST_F(ClusterFileTest, FileProblems) {
  const std::string syntax = write("nodes: [\n");
  expect_contains(load_error(syntax), {syntax + ": YAML syntax error at line"});
  const std::string missing = (dir_ / "absent.yaml").string();
  expect_contains(load_error(missing), {missing + ": cannot read the cluster file"});
  expect_contains(load_error(dir_.string()), {dir_.string() + ": cannot read", "directory"});
  const std::string scalar = write("just text\n");
  expect_contains(
      load_error(scalar),
      {scalar + ": expected a mapping with keys name, inter_node, nodes", "got 'just text'"});
  const std::string two = write("name: a\n---\nname: b\n");
  expect_contains(load_error(two),
                  {two + ": expected one YAML document, found another one at line 2"});
  // A stray ',' where a block starts made yaml-cpp yield empty documents until memory ran out
  // (found by fuzz_cluster_config).
  const std::string stray = write(", flops_per_s: 1.6e10\nname: a\n");
  expect_contains(load_error(stray), {stray + ": YAML syntax error at line 1, column 1"});
}

// ---- hap-profile's fit of a fixed cost per step ----

// Two measurements of a step give a line: on one thread the default GPT took 13.0 ms on 2
// sequences and 42.7 ms on 8, 3.1 ms of it fixed. Where the rows agree, a time is not positive
// or does not grow with the rows, nothing is fixed (the step is read as proportional).
TEST(ProfileFit, TheFixedPartIsWhereTheLineThroughTwoStepsMeetsZeroRows) {
  EXPECT_NEAR(fit_fixed_step_s({{2, 13.0e-3}, {8, 42.7e-3}}), 3.1e-3, 1e-12);
  EXPECT_NEAR(fit_fixed_step_s({{8, 42.7e-3}, {2, 13.0e-3}}), 3.1e-3, 1e-12);  // either order
  EXPECT_EQ(fit_fixed_step_s({{4, 10e-3}, {4, 11e-3}}), 0.0);                  // one size
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}, {4, 9e-3}}), 0.0);            // faster on more rows
  EXPECT_NEAR(fit_fixed_step_s({{2, 10e-3}, {4, 20e-3}}), 0.0, 1e-15);  // proportional
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}, {4, 30e-3}}), 0.0);           // superlinear
  EXPECT_EQ(fit_fixed_step_s({{0, 10e-3}, {4, 30e-3}}), 0.0);
  EXPECT_EQ(fit_fixed_step_s({{2, 0.0}, {4, 30e-3}}), 0.0);
  EXPECT_EQ(fit_fixed_step_s({{2, 1e-3}, {4, std::numeric_limits<double>::infinity()}}), 0.0);
  EXPECT_EQ(fit_fixed_step_s({{2, std::nan("")}, {4, 3e-3}}), 0.0);
  // Never more than either step.
  const double f = fit_fixed_step_s({{1, 5e-3}, {2, 5.001e-3}});
  EXPECT_GT(f, 4.9e-3);
  EXPECT_LT(f, 5e-3);
}

// Through more points, the least-squares line: 2, 4 and 8 rows at 3 ms fixed and 2 ms a row give
// 3 ms; where the points do not rise with the rows, or fewer than two row counts are given,
// nothing is fixed; never more than the smallest time.
TEST(ProfileFit, ThePooledFixedPartIsTheLeastSquaresLinesValueAtZeroRows) {
  EXPECT_NEAR(fit_fixed_step_s({{2, 7e-3}, {4, 11e-3}, {8, 19e-3}}), 3e-3, 1e-12);
  // 1 ms more on the middle point moves the intercept by half of it: 1/n - mean(x) (x - mean(x))
  // / Sxx = 1/3 + (14/3)(2/3) / (56/3) = 1/2.
  EXPECT_NEAR(fit_fixed_step_s({{2, 7e-3}, {4, 12e-3}, {8, 19e-3}}), 3.5e-3, 1e-12);
  EXPECT_NEAR(fit_fixed_step_s({{1, 44e-3}, {2, 99e-3}, {4, 142.7e-3}, {4, 142e-3}}),
              fit_fixed_step_s({{4, 142.7e-3}, {1, 44e-3}, {4, 142e-3}, {2, 99e-3}}), 1e-15);
  EXPECT_EQ(fit_fixed_step_s({{4, 10e-3}, {4, 11e-3}, {4, 12e-3}}), 0.0);  // one row count
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}, {4, 9e-3}, {8, 8e-3}}), 0.0);    // falls with rows
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}}), 0.0);
  EXPECT_EQ(fit_fixed_step_s({}), 0.0);
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}, {4, 20e-3}, {0, 30e-3}}), 0.0);  // no rows
  EXPECT_EQ(fit_fixed_step_s({{2, 10e-3}, {4, std::nan("")}, {8, 30e-3}}), 0.0);
  // A steep drop then flat: the line's intercept lies above the smallest time; held to it.
  EXPECT_EQ(fit_fixed_step_s({{1, 5e-3}, {2, 5.001e-3}, {3, 5.002e-3}, {50, 5.003e-3}}), 5e-3);
}

// Ranks of one kind pool; a rank far from its kind's median step on the even share keeps its
// own group; groups are numbered by their first rank.
TEST(ProfileFit, RanksOfOneKindPoolUnlessTheirStepIsFarFromTheKindsMedian) {
  EXPECT_EQ(pooled_kinds({"a", "b", "c", "c"}, {1.0, 2.0, 4.0, 4.1}, 0.2),
            (std::vector<int>{0, 1, 2, 2}));
  EXPECT_EQ(pooled_kinds({"c", "a", "c", "a"}, {4.0, 1.0, 4.4, 1.1}, 0.2),
            (std::vector<int>{0, 1, 0, 1}));
  // The third 'c' is 4x slower: it stands alone; the other two pool.
  EXPECT_EQ(pooled_kinds({"c", "c", "c"}, {4.0, 16.0, 4.2}, 0.2), (std::vector<int>{0, 1, 0}));
  // Two of a kind, each more than a factor 1.2 from their median (their mean): each its own.
  EXPECT_EQ(pooled_kinds({"c", "c"}, {1.0, 4.0}, 0.2), (std::vector<int>{0, 1}));
  EXPECT_EQ(pooled_kinds({"c", "c"}, {1.0, 1.3}, 0.2), (std::vector<int>{0, 0}));
  // A step that is not finite never pools.
  EXPECT_EQ(pooled_kinds({"c", "c", "c"}, {1.0, std::nan(""), 1.0}, 0.2),
            (std::vector<int>{0, 1, 0}));
  EXPECT_TRUE(pooled_kinds({}, {}, 0.2).empty());
  EXPECT_THROW(pooled_kinds({"a"}, {}, 0.2), Error);
}

TEST(ProfileFit, TheSecondSizeIsTheOperatingPointElseTwiceElseHalfTheRows) {
  EXPECT_EQ(second_profile_rows(4, 8, 16), 8);  // the rows a proportional split gives
  EXPECT_EQ(second_profile_rows(4, 2, 16), 2);
  EXPECT_EQ(second_profile_rows(4, 4, 16), 8);   // the even share is the operating point
  EXPECT_EQ(second_profile_rows(4, 0, 16), 8);   // none given
  EXPECT_EQ(second_profile_rows(16, 0, 16), 8);  // one rank, the whole batch
  EXPECT_EQ(second_profile_rows(3, 3, 5), 1);
  EXPECT_EQ(second_profile_rows(1, 0, 1), 0);  // nothing else to measure
}

// A link's collective gets figures of its own only from kMinSamplesPerCollective samples at 4
// sizes or more (two parameters): a full profile measures each collective it fits that often,
// in the groups and in the lanes between nodes (which run one form of each: all-reduce, padded
// all-gather and reduce-scatter, even shares).
TEST(ProfilePlan, AFullProfileTimesEveryCollectiveOftenEnoughForAFitOfItsOwn) {
  using synth::InstrKind;
  for (const bool lanes : {false, true}) {
    const std::vector<CollectiveMeasurement> plan =
        lanes ? lanes_plan(false) : measurement_plan(false);
    std::vector<InstrKind> kinds = {InstrKind::AllReduce, InstrKind::AllGather,
                                    InstrKind::ReduceScatter};
    if (!lanes) kinds.push_back(InstrKind::AllToAll);
    for (const InstrKind k : kinds) {
      size_t n = 0;
      std::set<double> sizes;
      for (const CollectiveMeasurement& m : plan)
        if (m.kind == k) {
          ++n;
          sizes.insert(m.bytes);
          if (lanes) {
            EXPECT_FALSE(m.uneven);
            EXPECT_EQ(m.method, k == InstrKind::AllReduce ? ops::CollectiveMethod::Grouped
                                                          : ops::CollectiveMethod::Padded);
          }
        }
      EXPECT_GE(n, kMinSamplesPerCollective)
          << (lanes ? "lanes: " : "groups: ") << synth::instr_name(k);
      EXPECT_GE(sizes.size(), 4u) << synth::instr_name(k);
      EXPECT_GE(*sizes.rbegin() / *sizes.begin(), 1000.0) << synth::instr_name(k);
    }
    for (const CollectiveMeasurement& m : plan)
      EXPECT_TRUE(std::find(kinds.begin(), kinds.end(), m.kind) != kinds.end())
          << synth::instr_name(m.kind);
  }
  // --quick is a smoke test: fewer sizes.
  EXPECT_LT(lanes_plan(true).size(), lanes_plan(false).size());
  EXPECT_LT(measurement_plan(true).size(), measurement_plan(false).size());
}

}  // namespace
}  // namespace hap::train
