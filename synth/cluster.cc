#include "synth/cluster.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace hap::synth {
namespace {

// Shortest text that reads back as the same number (0.001, 1e-08, 128).
template <typename T>
std::string number_text(T value) {
  std::array<char, 64> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return std::string(buffer.data(), result.ptr);
}

// Three significant digits, e.g. "3.86", "125", "0.5".
std::string three_digits(double value) {
  std::array<char, 32> buffer{};
  std::snprintf(buffer.data(), buffer.size(), "%.3g", value);
  return buffer.data();
}

// "1.3 GB/s", "125 MB/s"; decimal units, as links are quoted.
std::string rate_text(double bytes_per_s) {
  if (std::isinf(bytes_per_s)) return "unlimited";
  constexpr std::array<std::pair<double, const char*>, 4> kUnits = {
      {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "kB/s"}}};
  for (const auto& [scale, unit] : kUnits)
    if (bytes_per_s >= scale) return three_digits(bytes_per_s / scale) + " " + unit;
  return three_digits(bytes_per_s) + " B/s";
}

// "20 us", "1.5 ms", "0 s".
std::string latency_text(double seconds) {
  if (seconds == 0) return "0 s";
  if (seconds < 1e-3) return three_digits(seconds * 1e6) + " us";
  if (seconds < 1) return three_digits(seconds * 1e3) + " ms";
  return three_digits(seconds) + " s";
}

// "3.86 TFLOP/s", "32 GFLOP/s".
std::string flops_text(double flops_per_s) {
  constexpr std::array<std::pair<double, const char*>, 4> kUnits = {
      {{1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1e6, "MFLOP/s"}}};
  for (const auto& [scale, unit] : kUnits)
    if (flops_per_s >= scale) return three_digits(flops_per_s / scale) + " " + unit;
  return three_digits(flops_per_s) + " FLOP/s";
}

// "32 GiB" for a short whole number of binary units, "4 GB" otherwise.
std::string bytes_text(std::int64_t bytes) {
  constexpr std::array<std::pair<std::int64_t, const char*>, 4> kBinary = {
      {{std::int64_t{1} << 40, "TiB"},
       {std::int64_t{1} << 30, "GiB"},
       {std::int64_t{1} << 20, "MiB"},
       {std::int64_t{1} << 10, "KiB"}}};
  for (const auto& [scale, unit] : kBinary)
    if (bytes >= scale && bytes % scale == 0 && bytes / scale < 10000)
      return number_text(bytes / scale) + " " + unit;
  constexpr std::array<std::pair<double, const char*>, 4> kDecimal = {
      {{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "kB"}}};
  const double value = static_cast<double>(bytes);
  for (const auto& [scale, unit] : kDecimal)
    if (value >= scale) return three_digits(value / scale) + " " + unit;
  return number_text(bytes) + " B";
}

std::string link_text(const Link& link) {
  return rate_text(link.bandwidth_bytes_per_s) + ", " + latency_text(link.latency_s);
}

bool positive_finite(double value) { return std::isfinite(value) && value > 0; }

}  // namespace

int Cluster::add_node(std::string node_name, Link link, std::vector<Device> node_devices) {
  const int index = num_nodes();
  Node node{.name = std::move(node_name), .link = link, .devices = {}};
  for (Device& device : node_devices) {
    device.node = index;
    node.devices.push_back(size());
    devices.push_back(std::move(device));
  }
  nodes.push_back(std::move(node));
  return index;
}

Cluster Cluster::subset(std::vector<int> ranks) const {
  HAP_CHECK(!ranks.empty(), "cluster '", name, "': a subset needs at least one device");
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    HAP_CHECK(ranks[i] >= 0 && ranks[i] < size(), "cluster '", name, "': rank ", ranks[i],
              " is not one of its ", size(), " devices");
    HAP_CHECK(i == 0 || ranks[i] != ranks[i - 1], "cluster '", name, "': rank ", ranks[i],
              " is listed twice");
  }
  // Ranks ascending; nodes in the order their first kept device comes.
  Cluster out;
  out.name = name;
  out.inter_node = inter_node;
  out.lanes = lanes;
  std::vector<int> node_index(nodes.size(), -1);
  for (int r : ranks) {
    Device d = devices[static_cast<size_t>(r)];
    int& index = node_index[static_cast<size_t>(d.node)];
    if (index < 0) {
      index = out.num_nodes();
      const Node& from = nodes[static_cast<size_t>(d.node)];
      out.nodes.push_back(Node{.name = from.name, .link = from.link, .devices = {}});
    }
    d.node = index;
    out.nodes[static_cast<size_t>(index)].devices.push_back(out.size());
    out.devices.push_back(std::move(d));
  }
  return out;
}

void Cluster::validate() const {
  const std::string where = "cluster '" + name + "': ";
  HAP_CHECK(!devices.empty(), where, "no devices; expected at least one");

  std::map<std::string, int, std::less<>> device_names;
  for (int r = 0; r < size(); ++r) {
    const Device& d = devices[r];
    const std::string device = where + "device " + number_text(r) + " '" + d.name + "'";
    HAP_CHECK(!d.name.empty(), where, "device ", r, ": expected a non-empty name");
    const auto [it, inserted] = device_names.emplace(d.name, r);
    HAP_CHECK(inserted, where, "devices ", it->second, " and ", r, " are both named '", d.name,
              "'; expected unique device names");
    HAP_CHECK(positive_finite(d.flops_per_s), device,
              ": flops_per_s: expected a finite number > 0, got ", number_text(d.flops_per_s));
    HAP_CHECK(d.memory_bytes > 0, device, ": memory_bytes: expected an integer > 0, got ",
              d.memory_bytes);
    HAP_CHECK(std::isfinite(d.memory_bandwidth_bytes_per_s) && d.memory_bandwidth_bytes_per_s >= 0,
              device, ": memory_bandwidth_bytes_per_s: expected a finite number >= 0, got ",
              number_text(d.memory_bandwidth_bytes_per_s));
    HAP_CHECK(std::isfinite(d.update_s_per_param) && d.update_s_per_param >= 0, device,
              ": update_s_per_param: expected a finite number >= 0, got ",
              number_text(d.update_s_per_param));
    HAP_CHECK(std::isfinite(d.kernel_overhead_s) && d.kernel_overhead_s >= 0, device,
              ": kernel_overhead_s: expected a finite number >= 0, got ",
              number_text(d.kernel_overhead_s));
  }

  auto check_link = [](const std::string& owner, const Link& link) {
    for (int c = 0; c < kNumCollectives; ++c) {
      const LinkTerms& t = link.collective[c];
      const std::string what =
          owner + ": collectives." + collective_name(static_cast<Collective>(c));
      HAP_CHECK(t.bandwidth_bytes_per_s == 0 || positive_finite(t.bandwidth_bytes_per_s), what,
                ".bandwidth_bytes_per_s: expected a finite number > 0, got ",
                number_text(t.bandwidth_bytes_per_s));
      HAP_CHECK(std::isfinite(t.latency_s) && t.latency_s >= 0, what,
                ".latency_s: expected a finite number >= 0, got ", number_text(t.latency_s));
    }
    HAP_CHECK(positive_finite(link.bandwidth_bytes_per_s), owner,
              ": bandwidth_bytes_per_s: expected a finite number > 0, got ",
              number_text(link.bandwidth_bytes_per_s));
    HAP_CHECK(std::isfinite(link.latency_s) && link.latency_s >= 0, owner,
              ": latency_s: expected a finite number >= 0, got ", number_text(link.latency_s));
    HAP_CHECK(link.overlap >= 0 && link.overlap <= 1, owner,
              ": overlap: expected a number in [0, 1], got ", number_text(link.overlap));
  };

  std::map<std::string, int, std::less<>> node_names;
  std::vector<int> owner(devices.size(), -1);  // rank -> the node that lists it
  for (int n = 0; n < num_nodes(); ++n) {
    const Node& node = nodes[n];
    const std::string label = where + "node " + number_text(n) + " '" + node.name + "'";
    HAP_CHECK(!node.name.empty(), where, "node ", n, ": expected a non-empty name");
    const auto [it, inserted] = node_names.emplace(node.name, n);
    HAP_CHECK(inserted, where, "nodes ", it->second, " and ", n, " are both named '", node.name,
              "'; expected unique node names");
    HAP_CHECK(!node.devices.empty(), label, ": no devices; expected at least one");
    check_link(label + " link", node.link);
    for (int r : node.devices) {
      HAP_CHECK(r >= 0 && r < size(), label, ": lists rank ", r, "; expected a rank in [0, ",
                size(), ")");
      HAP_CHECK(owner[r] == -1 || owner[r] == n, label, ": lists device ", r, " '", devices[r].name,
                "', which node ", owner[r], " '", nodes[owner[r]].name,
                "' lists too; expected each device on one node");
      HAP_CHECK(owner[r] == -1, label, ": lists device ", r, " '", devices[r].name,
                "' twice; expected each device once");
      owner[r] = n;
    }
  }
  for (int r = 0; r < size(); ++r) {
    const Device& d = devices[r];
    const std::string device = where + "device " + number_text(r) + " '" + d.name + "'";
    HAP_CHECK(owner[r] != -1, device, ": no node lists it; expected each device on one node");
    HAP_CHECK(d.node == owner[r], device, ": node: expected ", owner[r], " (node '",
              nodes[owner[r]].name, "' lists it), got ", d.node);
  }
  if (num_nodes() > 1) check_link(where + "inter_node link", inter_node);
  if (lanes.bandwidth_bytes_per_s != 0) check_link(where + "inter_node lanes", lanes);
}

int Cluster::node_of(int rank) const {
  HAP_CHECK(rank >= 0 && rank < size(), "cluster '", name, "': rank ", rank,
            " is out of range; expected a rank in [0, ", size(), ")");
  const int node = devices[rank].node;
  HAP_CHECK(node >= 0 && node < num_nodes(), "cluster '", name, "': device ", rank, " '",
            devices[rank].name, "' has node ", node, "; expected a node in [0, ", num_nodes(), ")");
  return node;
}

Link Cluster::link_between(int a, int b) const {
  const int node_a = node_of(a);
  const int node_b = node_of(b);
  return node_a == node_b ? nodes[node_a].link : inter_node;
}

namespace {

// How many of `ranks` sit on each node; checks the group.
std::vector<int> members_per_node(const Cluster& cluster, const std::vector<int>& ranks) {
  HAP_CHECK(!ranks.empty(), "cluster '", cluster.name,
            "': a group of ranks is empty; expected at least one rank");
  std::vector<int> members(cluster.nodes.size(), 0);
  std::vector<char> seen(cluster.devices.size(), 0);
  for (int r : ranks) {
    const int node = cluster.node_of(r);
    HAP_CHECK(!seen[r], "cluster '", cluster.name, "': rank ", r,
              " appears twice in a group; expected distinct ranks");
    seen[r] = 1;
    ++members[node];
  }
  return members;
}

}  // namespace

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::AllGather:
      return "all_gather";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllToAll:
      return "all_to_all";
  }
  return "?";
}

Link Cluster::bottleneck(const std::vector<int>& ranks) const {
  const std::vector<int> members = members_per_node(*this, ranks);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Link slowest{.bandwidth_bytes_per_s = kInf, .latency_s = 0, .collective = {}, .overlap = 1.0};
  for (LinkTerms& t : slowest.collective) t = {kInf, 0};
  auto use = [&slowest](const Link& link) {
    slowest.bandwidth_bytes_per_s =
        std::min(slowest.bandwidth_bytes_per_s, link.bandwidth_bytes_per_s);
    slowest.latency_s = std::max(slowest.latency_s, link.latency_s);
    slowest.overlap = std::min(slowest.overlap, link.overlap);
    for (int c = 0; c < kNumCollectives; ++c) {
      const Link own = link.for_collective(static_cast<Collective>(c));
      LinkTerms& t = slowest.collective[c];
      t.bandwidth_bytes_per_s = std::min(t.bandwidth_bytes_per_s, own.bandwidth_bytes_per_s);
      t.latency_s = std::max(t.latency_s, own.latency_s);
    }
  };
  int nodes_used = 0;
  for (int n = 0; n < num_nodes(); ++n) {
    if (members[n] > 0) ++nodes_used;
    if (members[n] > 1) use(nodes[n].link);
  }
  if (nodes_used > 1) use(inter_node);
  if (!std::isfinite(slowest.bandwidth_bytes_per_s))
    for (LinkTerms& t : slowest.collective) t = {};  // one rank: nobody to talk to
  return slowest;
}

Link Cluster::bottleneck() const {
  std::vector<int> all(devices.size());
  for (int r = 0; r < size(); ++r) all[r] = r;
  return bottleneck(all);
}

bool Cluster::spans_nodes(const std::vector<int>& ranks) const {
  const std::vector<int> members = members_per_node(*this, ranks);
  return std::count_if(members.begin(), members.end(), [](int m) { return m > 0; }) > 1;
}

double Cluster::total_flops_per_s() const {
  double total = 0;
  for (const Device& d : devices) total += d.flops_per_s;
  return total;
}

std::vector<double> Cluster::flops_ratios() const {
  const double total = total_flops_per_s();
  HAP_CHECK(total > 0 && std::isfinite(total), "cluster '", name, "': total FLOP/s is ",
            number_text(total), "; expected a finite number > 0");
  std::vector<double> ratios;
  ratios.reserve(devices.size());
  for (const Device& d : devices) ratios.push_back(d.flops_per_s / total);
  return ratios;
}

std::int64_t Cluster::min_memory_bytes() const {
  if (devices.empty()) return 0;
  std::int64_t smallest = devices.front().memory_bytes;
  for (const Device& d : devices) smallest = std::min(smallest, d.memory_bytes);
  return smallest;
}

std::string Cluster::summary() const {
  const double total = total_flops_per_s();
  std::int64_t memory = 0;  // saturates rather than overflows
  for (const Device& d : devices)
    memory = d.memory_bytes > std::numeric_limits<std::int64_t>::max() - memory
                 ? std::numeric_limits<std::int64_t>::max()
                 : memory + std::max<std::int64_t>(d.memory_bytes, 0);

  std::ostringstream os;
  os << "cluster " << name << ": " << size() << (size() == 1 ? " device" : " devices") << " on "
     << num_nodes() << (num_nodes() == 1 ? " node" : " nodes") << ", " << flops_text(total) << ", "
     << bytes_text(memory) << " memory";
  if (num_nodes() > 1) os << "; between nodes " << link_text(inter_node);
  os << "\n";

  // One row per run of consecutive identical devices (same node, type, FLOP/s and memory).
  using Row = std::array<std::string, 7>;
  std::vector<Row> rows = {{"node", "link", "ranks", "devices", "FLOP/s", "memory", "share"}};
  for (int n = 0; n < num_nodes(); ++n) {
    const Node& node = nodes[n];
    bool first = true;
    for (std::size_t i = 0; i < node.devices.size();) {
      const int rank = node.devices[i];
      const Device& d = devices[rank];
      std::size_t j = i + 1;
      while (j < node.devices.size() && node.devices[j] == node.devices[j - 1] + 1) {
        const Device& e = devices[node.devices[j]];
        if (e.type != d.type || e.flops_per_s != d.flops_per_s || e.memory_bytes != d.memory_bytes)
          break;
        ++j;
      }
      const std::size_t count = j - i;
      const int last = node.devices[j - 1];
      const std::string share = total > 0 ? three_digits(100 * d.flops_per_s / total) + "%" : "-";
      rows.push_back(
          {first ? node.name : "", first ? link_text(node.link) : "",
           count == 1 ? number_text(rank) : number_text(rank) + "-" + number_text(last),
           count == 1 ? d.name + " (" + d.type + ")" : number_text(count) + " x " + d.type,
           flops_text(d.flops_per_s), bytes_text(d.memory_bytes),
           count == 1 ? share : share + " each"});
      first = false;
      i = j;
    }
  }
  std::array<std::size_t, 7> width{};
  for (const Row& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const Row& row : rows) {
    std::string line = " ";
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += " " + row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 1, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
  return os.str();
}

}  // namespace hap::synth
