// The typed cluster description: validation names the device or node and the bad value; links,
// bottlenecks and FLOP/s shares follow the topology.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "synth/cluster.h"

namespace hap::synth {
namespace {

Device device(std::string name, double flops_per_s, std::int64_t memory_bytes = 1 << 30) {
  return Device{.name = std::move(name),
                .type = "test",
                .flops_per_s = flops_per_s,
                .memory_bytes = memory_bytes,
                .node = -1};
}

// Node a: ranks 0 (fast) and 1; node b: rank 2. Node a's link has the highest latency of all,
// inter_node the lowest bandwidth, so a group using both reports one from each.
Cluster two_nodes() {
  Cluster c;
  c.name = "two-nodes";
  c.inter_node = {.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-5};
  c.add_node("a", {.bandwidth_bytes_per_s = 1e10, .latency_s = 5e-5},
             {device("d0", 2e10), device("d1", 1e10)});
  c.add_node("b", {.bandwidth_bytes_per_s = 5e9, .latency_s = 2e-6}, {device("d2", 1e10)});
  return c;
}

std::string validate_error(const Cluster& c) {
  try {
    c.validate();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "validate() did not throw for cluster " << c.name;
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message lacks \"" << part << "\":\n  " << message;
}

void expect_link(const Link& link, double bandwidth_bytes_per_s, double latency_s) {
  EXPECT_EQ(link.bandwidth_bytes_per_s, bandwidth_bytes_per_s);
  EXPECT_EQ(link.latency_s, latency_s);
}

TEST(Cluster, AddNodeAssignsRanksNodeByNode) {
  const Cluster c = two_nodes();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.size(), 3);
  EXPECT_EQ(c.num_nodes(), 2);
  EXPECT_EQ(c.nodes[0].devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(c.nodes[1].devices, (std::vector<int>{2}));
  EXPECT_EQ(c.devices[2].name, "d2");
  EXPECT_EQ(c.devices[2].node, 1);
  EXPECT_EQ(c.node_of(0), 0);
  EXPECT_EQ(c.node_of(1), 0);
  EXPECT_EQ(c.node_of(2), 1);
}

TEST(Cluster, LinkBetweenUsesTheNodeLinkInsideANodeAndInterNodeAcross) {
  const Cluster c = two_nodes();
  expect_link(c.link_between(0, 1), 1e10, 5e-5);
  expect_link(c.link_between(1, 0), 1e10, 5e-5);
  expect_link(c.link_between(0, 0), 1e10, 5e-5);
  expect_link(c.link_between(2, 2), 5e9, 2e-6);
  expect_link(c.link_between(0, 2), 1e9, 1e-5);
  expect_link(c.link_between(2, 1), 1e9, 1e-5);
  EXPECT_THROW(c.link_between(0, 3), Error);
  EXPECT_THROW(c.link_between(-1, 0), Error);
}

TEST(Cluster, BottleneckIsTheSlowestLinkAnyPairUses) {
  const Cluster c = two_nodes();
  expect_link(c.bottleneck({0, 1}), 1e10, 5e-5);  // node a only
  expect_link(c.bottleneck({1, 2}), 1e9, 1e-5);   // inter_node only: one device per node
  // Both links: the minimum bandwidth is inter_node's, the maximum latency node a's.
  expect_link(c.bottleneck({2, 0, 1}), 1e9, 5e-5);
  expect_link(c.bottleneck(), 1e9, 5e-5);
}

TEST(Cluster, BottleneckOfOneRankCostsNothing) {
  const Link alone = two_nodes().bottleneck({1});
  EXPECT_EQ(alone.bandwidth_bytes_per_s, std::numeric_limits<double>::infinity());
  EXPECT_EQ(alone.latency_s, 0.0);
  EXPECT_EQ(alone.transfer_s(1e9), 0.0);
}

TEST(Cluster, BadGroupsAreErrors) {
  const Cluster c = two_nodes();
  expect_contains(
      [&] {
        try {
          c.bottleneck({});
        } catch (const Error& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      {"two-nodes", "empty"});
  EXPECT_THROW(c.bottleneck({0, 3}), Error);
  EXPECT_THROW(c.bottleneck({0, 1, 0}), Error);
  EXPECT_THROW(c.spans_nodes({}), Error);
  EXPECT_THROW(c.spans_nodes({7}), Error);
}

TEST(Cluster, SpansNodes) {
  const Cluster c = two_nodes();
  EXPECT_FALSE(c.spans_nodes({0}));
  EXPECT_FALSE(c.spans_nodes({0, 1}));
  EXPECT_FALSE(c.spans_nodes({2}));
  EXPECT_TRUE(c.spans_nodes({0, 2}));
  EXPECT_TRUE(c.spans_nodes({2, 1, 0}));
}

TEST(Cluster, FlopsRatiosAreSharesOfTheTotal) {
  const Cluster c = two_nodes();
  EXPECT_DOUBLE_EQ(c.total_flops_per_s(), 4e10);
  const std::vector<double> r = c.flops_ratios();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0], 0.5);
  EXPECT_DOUBLE_EQ(r[1], 0.25);
  EXPECT_DOUBLE_EQ(r[2], 0.25);
  EXPECT_NEAR(std::accumulate(r.begin(), r.end(), 0.0), 1.0, 1e-12);

  Cluster odd;
  odd.name = "odd";
  odd.add_node("n", {1e9, 0}, {device("x", 3.86e12), device("y", 2.15e12), device("z", 7e11)});
  const std::vector<double> s = odd.flops_ratios();
  EXPECT_NEAR(std::accumulate(s.begin(), s.end(), 0.0), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(s[0] / s[1], 3.86e12 / 2.15e12);
}

TEST(Cluster, MinMemory) {
  Cluster c = two_nodes();
  c.devices[1].memory_bytes = 1000;
  EXPECT_EQ(c.min_memory_bytes(), 1000);
  EXPECT_EQ(Cluster{}.min_memory_bytes(), 0);
}

TEST(Cluster, LinkTransferTime) {
  const Link link{.bandwidth_bytes_per_s = 1e9, .latency_s = 1e-5};
  EXPECT_DOUBLE_EQ(link.transfer_s(0), 1e-5);
  EXPECT_DOUBLE_EQ(link.transfer_s(1e9), 1.0 + 1e-5);
}

TEST(Cluster, SummaryIsACompactTable) {
  Cluster c = two_nodes();
  c.add_node(
      "gpus", {2e10, 1e-5},
      {device("g0", 3.86e12, std::int64_t{32} << 30), device("g1", 3.86e12, std::int64_t{32} << 30),
       device("g2", 3.86e12, std::int64_t{32} << 30)});
  const std::string text = c.summary();
  expect_contains(text, {"cluster two-nodes", "6 devices on 3 nodes", "between nodes 1 GB/s, 10 us",
                         "d0 (test)", "ranks", "3-5", "3 x test", "3.86 TFLOP/s", "32 GiB", "each",
                         "20 GB/s, 10 us"});
  // One header line, one column-title line, and one row per run of identical devices.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2 + 3 + 1);
}

// ---- validate() ----

TEST(ClusterValidate, NoDevices) {
  Cluster c;
  c.name = "empty";
  expect_contains(validate_error(c), {"cluster 'empty'", "no devices"});
}

TEST(ClusterValidate, DeviceValuesNameTheDeviceAndTheValue) {
  struct Case {
    std::function<void(Device&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {[](Device& d) { d.flops_per_s = 0; }, {"device 1 'd1'", "flops_per_s", "> 0", "got 0"}},
      {[](Device& d) { d.flops_per_s = -5; }, {"device 1 'd1'", "flops_per_s", "got -5"}},
      {[](Device& d) { d.flops_per_s = std::nan(""); }, {"device 1 'd1'", "flops_per_s", "nan"}},
      {[](Device& d) { d.flops_per_s = std::numeric_limits<double>::infinity(); },
       {"device 1 'd1'", "flops_per_s", "finite", "inf"}},
      {[](Device& d) { d.memory_bytes = 0; }, {"device 1 'd1'", "memory_bytes", "> 0", "got 0"}},
      {[](Device& d) { d.memory_bytes = -1; }, {"device 1 'd1'", "memory_bytes", "got -1"}},
      {[](Device& d) { d.name = ""; }, {"device 1", "non-empty name"}},
      {[](Device& d) { d.name = "d0"; }, {"devices 0 and 1", "'d0'", "unique"}},
  };
  for (const Case& test : cases) {
    Cluster c = two_nodes();
    test.edit(c.devices[1]);
    const std::string message = validate_error(c);
    expect_contains(message, {"cluster 'two-nodes'"});
    for (const std::string& part : test.parts) expect_contains(message, {part});
  }
}

TEST(ClusterValidate, LinkValuesNameTheNodeAndTheValue) {
  Cluster c = two_nodes();
  c.nodes[1].link.bandwidth_bytes_per_s = 0;
  expect_contains(validate_error(c), {"node 1 'b' link", "bandwidth_bytes_per_s", "> 0", "got 0"});
  c = two_nodes();
  c.nodes[0].link.latency_s = -1e-6;
  expect_contains(validate_error(c), {"node 0 'a' link", "latency_s", ">= 0", "got -1e-06"});
  c = two_nodes();
  c.nodes[0].link.bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
  expect_contains(validate_error(c), {"node 0 'a' link", "finite", "got inf"});
  c = two_nodes();
  c.inter_node.bandwidth_bytes_per_s = -2;
  expect_contains(validate_error(c), {"inter_node link", "bandwidth_bytes_per_s", "got -2"});
  c = two_nodes();
  c.inter_node.latency_s = std::nan("");
  expect_contains(validate_error(c), {"inter_node link", "latency_s", "got nan"});
}

TEST(ClusterValidate, InterNodeIsUnusedWithOneNode) {
  Cluster c;
  c.name = "one";
  c.add_node("n", {1e9, 1e-6}, {device("x", 1e9), device("y", 1e9)});
  EXPECT_EQ(c.inter_node.bandwidth_bytes_per_s, 0.0);
  EXPECT_NO_THROW(c.validate());
  EXPECT_FALSE(c.spans_nodes({0, 1}));
  expect_link(c.bottleneck(), 1e9, 1e-6);
}

TEST(ClusterValidate, NodeMembership) {
  Cluster c = two_nodes();
  c.nodes.push_back(Node{.name = "c", .link = {1e9, 0}, .devices = {}});
  expect_contains(validate_error(c), {"node 2 'c'", "no devices"});

  c = two_nodes();
  c.nodes[1].name = "a";
  expect_contains(validate_error(c), {"nodes 0 and 1", "'a'", "unique"});

  c = two_nodes();
  c.nodes[1].devices.push_back(0);  // rank 0 on both nodes
  expect_contains(validate_error(c), {"node 1 'b'", "device 0 'd0'", "node 0 'a'", "one node"});

  c = two_nodes();
  c.nodes[0].devices.push_back(1);  // rank 1 twice on node a
  expect_contains(validate_error(c), {"node 0 'a'", "device 1 'd1'", "twice"});

  c = two_nodes();
  c.nodes[1].devices.push_back(9);
  expect_contains(validate_error(c), {"node 1 'b'", "rank 9", "[0, 3)"});

  c = two_nodes();
  c.nodes[1].devices.clear();
  c.nodes[0].devices.push_back(2);  // node a lists rank 2, whose node field says b
  expect_contains(validate_error(c), {"node 1 'b'", "no devices"});

  c = two_nodes();
  c.devices[2].node = 0;
  expect_contains(validate_error(c), {"device 2 'd2'", "node: expected 1", "got 0"});

  c = two_nodes();
  c.devices.push_back(device("stray", 1e9));
  expect_contains(validate_error(c), {"device 3 'stray'", "no node lists it"});
}

TEST(ClusterValidate, QueriesOnABrokenClusterThrowInsteadOfCrashing) {
  Cluster c = two_nodes();
  c.devices[2].node = 5;
  EXPECT_THROW(c.link_between(0, 2), Error);
  EXPECT_THROW(c.bottleneck(), Error);
  Cluster zero;
  zero.add_node("n", {1e9, 0}, {device("x", 0)});
  EXPECT_THROW(zero.flops_ratios(), Error);
}

}  // namespace
}  // namespace hap::synth
