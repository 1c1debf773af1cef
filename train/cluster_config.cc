#include "train/cluster_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/byte_size.h"
#include "train/config_reader.h"
#include "train/core_rate.h"

namespace hap::train {
namespace {

using detail::fail;
using detail::format_number;
using detail::IntRange;
using detail::join;
using detail::Origin;
using detail::RealRange;
using detail::SectionReader;
using detail::show;

// ---- the schema ----

constexpr std::array<std::string_view, 3> kTopKeys = {"name", "inter_node", "nodes"};
constexpr std::array<std::string_view, 3> kNodeKeys = {"name", "link", "devices"};
constexpr std::array<std::string_view, 10> kDeviceKeys = {"name",
                                                          "type",
                                                          "flops_per_s",
                                                          "memory_bytes",
                                                          "count",
                                                          "cpu_quota",
                                                          "sm_count",
                                                          "update_s_per_param",
                                                          "memory_bandwidth_bytes_per_s",
                                                          "kernel_overhead_s"};
constexpr std::array<std::string_view, 4> kLinkKeys = {"bandwidth_bytes_per_s", "latency_s",
                                                       "collectives", "overlap"};
// The link between nodes may also give its lanes' figures (synth::Cluster::lanes).
constexpr std::array<std::string_view, 5> kInterNodeKeys = {"bandwidth_bytes_per_s", "latency_s",
                                                            "collectives", "overlap", "lanes"};
constexpr std::array<std::string_view, 2> kLinkTermKeys = {"bandwidth_bytes_per_s", "latency_s"};
constexpr std::array<std::string_view, 4> kCollectiveKeys = {"all_reduce", "all_gather",
                                                             "reduce_scatter", "all_to_all"};

constexpr std::int64_t kMaxCount = 65536;
// SMs a GPU may have (an H200 has 132): what a typo is above.
constexpr std::int64_t kMaxSmCount = 4096;
// Devices in the whole file: plans and collectives are sized per device, so an absurd total
// (many nodes of large counts) is refused before anything is allocated for it.
constexpr std::int64_t kMaxDevices = 65536;

// Physically plausible figures, generous on both sides (documented in cluster_config.h). A value
// outside them is a typo or a unit mistake, and far outside them the cost model's times overflow
// or lose all precision and the ratio LP (COIN-OR CLP) aborts.
const RealRange kFlopsRange = RealRange::closed(1e3, 1e18).because("FLOP/s of one device");
const RealRange kBandwidthRange = RealRange::closed(1e3, 1e15).because("bytes/s");
const RealRange kLatencyRange = RealRange::closed(0, 10).because("seconds");
const RealRange kUpdateRange = RealRange::closed(0, 1e-3).because("seconds per parameter element");
const RealRange kOverlapRange =
    RealRange::closed(0, 1).because("the share of a collective that passes while devices compute");
const RealRange kKernelOverheadRange = RealRange::closed(0, 1).because("seconds per kernel call");
constexpr std::string_view kMemoryExpectation = kByteSizeExpectation;

// ---- the file ----

// The value under `key` of a mapping the SectionReader has already checked (known keys, no
// repeats), or nothing. Const access: yaml-cpp's non-const operator[] inserts the key.
std::optional<YAML::Node> value_of(const YAML::Node& mapping, std::string_view key) {
  if (!mapping.IsMap()) return std::nullopt;
  const YAML::Node value = mapping[std::string(key)];
  if (!value.IsDefined()) return std::nullopt;
  return value;
}

// The items of the non-empty sequence under `key`, which must be present.
std::vector<YAML::Node> sequence(const Origin& origin, const std::string& key_path,
                                 const std::optional<YAML::Node>& node, std::string_view items) {
  const std::string expected = "a non-empty sequence of " + std::string(items);
  if (!node) fail(origin, key_path, "missing required key; expected " + expected);
  if (!node->IsSequence()) fail(origin, key_path, "expected " + expected + ", got " + show(*node));
  if (node->size() == 0) fail(origin, key_path, "expected " + expected + ", got an empty sequence");
  std::vector<YAML::Node> out;
  for (const YAML::Node& item : *node) out.push_back(item);
  return out;
}

// An optional figure where 0 means "not modelled" and any other value must lie in `range`.
double zero_or_in(SectionReader& s, std::string_view key, const RealRange& range) {
  const double value = s.number(key, 0.0, RealRange());
  if (value != 0 && !range.contains(value))
    s.fail_value(key, "0 (not modelled) or " + range.expectation("a number"));
  return value;
}

// A link's figures; `lanes` (inter_node only): its lanes' figures, where given, into *lanes.
synth::Link read_link(SectionReader& s, synth::Link* lanes = nullptr) {
  if (lanes) {
    const bool given = s.has("lanes");
    SectionReader lane_reader = s.section("lanes", kLinkKeys, /*optional=*/!given);
    if (given) *lanes = read_link(lane_reader);
  }
  synth::Link link;
  link.bandwidth_bytes_per_s = s.number("bandwidth_bytes_per_s", std::nullopt, kBandwidthRange);
  link.latency_s = s.number("latency_s", std::nullopt, kLatencyRange);
  link.overlap = s.number("overlap", 1.0, kOverlapRange);  // (hap-profile measures it)
  // Optional figures per collective (hap-profile writes them).
  SectionReader per = s.section("collectives", kCollectiveKeys, /*optional=*/true);
  for (std::size_t c = 0; c < kCollectiveKeys.size(); ++c) {
    const bool given = per.has(kCollectiveKeys[c]);
    SectionReader t = per.section(kCollectiveKeys[c], kLinkTermKeys, /*optional=*/!given);
    if (!given) continue;
    link.collective[c].bandwidth_bytes_per_s =
        t.number("bandwidth_bytes_per_s", std::nullopt, kBandwidthRange);
    link.collective[c].latency_s = t.number("latency_s", std::nullopt, kLatencyRange);
    t.finish();
  }
  per.finish();
  s.finish();
  return link;
}

std::int64_t read_memory(const Origin& origin, SectionReader& s, const YAML::Node& entry) {
  const std::string key_path = s.path("memory_bytes");
  const std::optional<YAML::Node> node = value_of(entry, "memory_bytes");
  if (!node)
    fail(origin, key_path, "missing required key; expected " + std::string(kMemoryExpectation));
  if (!node->IsScalar() || node->Scalar().empty())
    fail(origin, key_path,
         "expected " + std::string(kMemoryExpectation) + ", got " +
             (node->IsScalar() ? "''" : show(*node)));
  // Marks the key as read; quoted and unquoted values are treated alike ("32GiB" or 32GiB).
  const std::string text = s.string("memory_bytes", std::nullopt, /*allow_empty=*/false);
  const std::optional<std::int64_t> bytes = parse_byte_size(text);
  if (!bytes)
    fail(origin, key_path, "expected " + std::string(kMemoryExpectation) + ", got '" + text + "'");
  return *bytes;
}

constexpr std::string_view kFlopsExpectation =
    "a number in [1000, 1e+18] (FLOP/s of one device), or a number of CPU cores in (0, 4096] "
    "written with the unit cores (e.g. '0.8 cores': that many times this machine's per-core "
    "rate, train/core_rate.h)";

// `flops_per_s`: FLOP/s, or "<x> cores" resolved with the machine's per-core rate.
double read_flops(const Origin& origin, SectionReader& s, const YAML::Node& entry,
                  const std::function<double()>& core_flops, ClusterLoadInfo* info) {
  const std::string key_path = s.path("flops_per_s");
  const std::optional<YAML::Node> node = value_of(entry, "flops_per_s");
  std::string lower = node && node->IsScalar() ? node->Scalar() : "";
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("core") == std::string::npos)
    return s.number("flops_per_s", std::nullopt, kFlopsRange);
  const std::string text = s.string("flops_per_s", std::nullopt, /*allow_empty=*/false);
  const std::size_t unit = lower.find("core");
  std::string number = text.substr(0, unit), suffix = text.substr(unit);
  while (!number.empty() && number.back() == ' ') number.pop_back();
  double cores = 0;
  bool ok = (suffix == "core" || suffix == "cores") && !number.empty();
  if (ok) {
    char* end = nullptr;
    errno = 0;
    cores = std::strtod(number.c_str(), &end);
    ok = end == number.c_str() + number.size() && errno != ERANGE && std::isfinite(cores) &&
         cores > 0 && cores <= 4096;
  }
  if (!ok)
    fail(origin, key_path, "expected " + std::string(kFlopsExpectation) + ", got '" + text + "'");
  const double per_core = core_flops();
  if (info) info->core_flops_per_s = per_core;
  const double flops = cores * per_core;
  if (!(flops >= 1e3 && flops <= 1e18))
    fail(origin, key_path,
         "expected a number in [1000, 1e+18] (FLOP/s of one device), got '" + text +
             "' = " + format_number(flops) + " FLOP/s with one core at " + format_number(per_core));
  return flops;
}

// Where a name came from, for messages about duplicates.
struct NameSite {
  std::string key_path;
  bool defaulted = false;
};

// Rejects a name already taken; otherwise records it.
void claim_name(const Origin& origin, std::map<std::string, NameSite, std::less<>>& taken,
                const std::string& name, NameSite site, std::string_view what) {
  const auto [it, inserted] = taken.emplace(name, site);
  if (inserted) return;
  const std::string first =
      (it->second.defaulted ? "the default name of " : "the name at ") + it->second.key_path;
  fail(origin, site.key_path,
       "expected a unique " + std::string(what) + " name, got '" + name + "'" +
           (site.defaulted ? " (the default name)" : "") + ", already " + first);
}

}  // namespace

synth::Cluster load_cluster_config(const std::string& path,
                                   const std::function<double()>& core_flops,
                                   ClusterLoadInfo* info) {
  Origin origin{.file = path, .overrides = {}};
  // Resolved at most once per file, and only when a device states its compute in cores.
  double per_core = 0;
  const std::function<double()> core_flops_once = [&]() {
    if (per_core == 0) per_core = core_flops ? core_flops() : core_rate().flops_per_s;
    return per_core;
  };
  const YAML::Node root = detail::parse_yaml_file(origin, "cluster file");

  // The top-level keys are keys, not sections: report unknown ones as such.
  if (root.IsMap())
    for (const auto& entry : root)
      if (entry.first.IsScalar() &&
          std::find(kTopKeys.begin(), kTopKeys.end(), entry.first.Scalar()) == kTopKeys.end())
        fail(origin, entry.first.Scalar(),
             detail::unknown_key_problem("the cluster file", entry.first.Scalar(), kTopKeys));

  // `nodes` and `devices` are sequences, which SectionReader does not read; they are taken from
  // the checked mappings directly, so those two readers skip finish().
  SectionReader document(origin, "", root, kTopKeys);
  synth::Cluster cluster;
  cluster.name =
      document.string("name", std::filesystem::path(path).stem().string(), /*allow_empty=*/false);

  std::map<std::string, NameSite, std::less<>> node_names;
  std::map<std::string, NameSite, std::less<>> device_names;
  const std::vector<YAML::Node> nodes =
      sequence(origin, "nodes", value_of(root, "nodes"),
               "nodes (mappings with keys " + join(kNodeKeys) + ")");
  std::int64_t total_devices = 0;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    const std::string node_path = "nodes[" + format_number(n) + "]";
    SectionReader node_reader(origin, node_path, nodes[n], kNodeKeys);
    const std::optional<YAML::Node> given_name = value_of(nodes[n], "name");
    std::string node_name =
        node_reader.string("name", "node" + format_number(n), /*allow_empty=*/false);
    claim_name(
        origin, node_names, node_name,
        {.key_path = given_name ? node_reader.path("name") : node_path, .defaulted = !given_name},
        "node");
    SectionReader link_reader = node_reader.section("link", kLinkKeys);
    const synth::Link link = read_link(link_reader);

    std::vector<synth::Device> devices;
    std::map<std::string, int, std::less<>> of_type;  // devices of each type so far on this node
    const std::vector<YAML::Node> entries =
        sequence(origin, node_reader.path("devices"), value_of(nodes[n], "devices"),
                 "devices (mappings with keys " + join(kDeviceKeys) + ")");
    for (std::size_t e = 0; e < entries.size(); ++e) {
      const std::string entry_path = node_reader.path("devices") + "[" + format_number(e) + "]";
      SectionReader s(origin, entry_path, entries[e], kDeviceKeys);
      const std::int64_t count =
          s.integer<std::int64_t>("count", 1, IntRange::closed(1, kMaxCount));
      total_devices += count;
      if (total_devices > kMaxDevices)
        s.fail_value("count", "at most " + format_number(kMaxDevices) +
                                  " devices in the whole cluster file (this entry brings the "
                                  "total to " +
                                  format_number(total_devices) + ")");
      const std::string type = s.string("type", std::nullopt, /*allow_empty=*/false);
      std::optional<std::string> name;
      if (value_of(entries[e], "name")) {
        name = s.string("name", std::nullopt, /*allow_empty=*/false);
        if (count > 1)
          s.fail_value("name",
                       "no name on an entry with count > 1 (each device needs its own name; the "
                       "defaults are <node>.<type>.<i>)");
      } else {
        s.string("name", "", /*allow_empty=*/true);  // absent: marks the key as read
      }
      synth::Device device;
      device.type = type;
      device.flops_per_s = read_flops(origin, s, entries[e], core_flops_once, info);
      device.memory_bytes = read_memory(origin, s, entries[e]);
      device.cpu_quota = s.number("cpu_quota", 0.0,
                                  RealRange::open_closed(0, 1).because("a share of one CPU core"));
      device.sm_count = static_cast<int>(s.integer<std::int64_t>(
          "sm_count", 0,
          IntRange::closed(1, kMaxSmCount).because("SMs of the GPU the rank runs on")));
      if (device.sm_count > 0 && device.cpu_quota > 0)
        s.fail_value("sm_count",
                     "no sm_count on a device with cpu_quota (a rank is emulated either on a share "
                     "of a CPU core or on a GPU's SMs, not both)");
      device.update_s_per_param = s.number("update_s_per_param", 0.0, kUpdateRange);
      device.memory_bandwidth_bytes_per_s =
          zero_or_in(s, "memory_bandwidth_bytes_per_s", kBandwidthRange);
      device.kernel_overhead_s = s.number("kernel_overhead_s", 0.0, kKernelOverheadRange);
      s.finish();
      for (std::int64_t i = 0; i < count; ++i) {
        const int index = of_type[type]++;
        device.name = name ? *name : node_name + "." + type + "." + format_number(index);
        claim_name(origin, device_names, device.name,
                   {.key_path = name ? s.path("name") : entry_path, .defaulted = !name}, "device");
        devices.push_back(device);
      }
    }
    cluster.add_node(std::move(node_name), link, std::move(devices));
  }

  if (value_of(root, "inter_node")) {
    SectionReader link_reader = document.section("inter_node", kInterNodeKeys);
    cluster.inter_node = read_link(link_reader, &cluster.lanes);
  } else {
    document.string("inter_node", "", /*allow_empty=*/true);  // absent: marks the key as read
    if (cluster.num_nodes() > 1)
      fail(origin, "inter_node",
           "missing required section; expected a mapping with keys " + join(kLinkKeys) +
               " (the link between nodes; required with more than one node, got " +
               format_number(cluster.num_nodes()) + " nodes)");
  }

  // Everything validate() checks was checked above with a key path; this guards the two in sync.
  try {
    cluster.validate();
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    fail(origin, "", e.what());
  }
  return cluster;
}

std::string core_rate_line(const std::string& path, const ClusterLoadInfo& loaded) {
  if (loaded.core_flops_per_s <= 0) return "";
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.4g", loaded.core_flops_per_s);
  return "cluster " + path + ": compute in CPU cores of " + rate + " FLOP/s (" +
         core_rate().source + ")";
}

nlohmann::json cluster_to_json(const synth::Cluster& cluster) {
  auto link = [](const synth::Link& l) {
    return nlohmann::json{{"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s},
                          {"latency_s", l.latency_s},
                          {"overlap", l.overlap}};
  };
  nlohmann::json j;
  j["name"] = cluster.name;
  j["devices"] = nlohmann::json::array();
  for (int r = 0; r < cluster.size(); ++r) {
    const synth::Device& d = cluster.devices[r];
    j["devices"].push_back({{"rank", r},
                            {"name", d.name},
                            {"type", d.type},
                            {"node", d.node},
                            {"flops_per_s", d.flops_per_s},
                            {"memory_bytes", d.memory_bytes},
                            {"memory_bandwidth_bytes_per_s", d.memory_bandwidth_bytes_per_s},
                            {"kernel_overhead_s", d.kernel_overhead_s},
                            {"update_s_per_param", d.update_s_per_param},
                            {"cpu_quota", d.cpu_quota},
                            {"sm_count", d.sm_count}});
  }
  j["nodes"] = nlohmann::json::array();
  for (const synth::Node& n : cluster.nodes)
    j["nodes"].push_back({{"name", n.name}, {"devices", n.devices}, {"link", link(n.link)}});
  if (cluster.num_nodes() > 1) {
    j["inter_node"] = link(cluster.inter_node);
    if (cluster.lanes.bandwidth_bytes_per_s > 0) j["inter_node"]["lanes"] = link(cluster.lanes);
  }
  return j;
}

}  // namespace hap::train
