#include "core/sm_partition.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <numeric>
#include <system_error>

#include "core/error.h"

namespace hap {

namespace {

// A positive decimal integer, the whole of `text`.
bool parse_positive(std::string_view text, int& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ptr == end && ptr != text.data() && ec == std::errc() && value > 0;
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

std::vector<int> sm_groups(const std::vector<int>& asked, const SmGranularity& g,
                           const std::string& device) {
  HAP_CHECK(g.total > 0 && g.minimum > 0 && g.alignment > 0, device,
            ": the driver reports no SMs to partition (", g.total, " SMs, groups of at least ",
            g.minimum, " in multiples of ", g.alignment, ")");
  HAP_CHECK(!asked.empty(), device, ": no SM group asked for");
  std::vector<int> granted;
  for (size_t i = 0; i < asked.size(); ++i) {
    const int n = asked[i];
    const std::string which = "SM group " + std::to_string(i) + " (sm_count " + std::to_string(n) +
                              ", of " + list(asked) + ")";
    HAP_CHECK(n >= 1, device, ": ", which, ": expected a positive number of SMs");
    HAP_CHECK(n <= g.total, device, ": ", which, ": more SMs than the GPU has (", g.total, ")");
    HAP_CHECK(n >= g.minimum, device, ": ", which, ": below the GPU's partition minimum of ",
              g.minimum, " SMs (groups are multiples of ", g.alignment, " SMs, at least ",
              g.minimum, ")");
    // The nearest multiple of the alignment, halfway up; never below the minimum or above what
    // the GPU has in whole multiples.
    int rounded = (n + g.alignment / 2) / g.alignment * g.alignment;
    const int most = g.total / g.alignment * g.alignment;
    const int least = (g.minimum + g.alignment - 1) / g.alignment * g.alignment;
    rounded = std::min(std::max(rounded, least), most);
    HAP_CHECK(rounded >= g.minimum && rounded <= g.total, device, ": ", which, ": no multiple of ",
              g.alignment, " SMs between the partition minimum of ", g.minimum, " and the GPU's ",
              g.total, " SMs");
    granted.push_back(rounded);
  }
  const int sum = std::accumulate(granted.begin(), granted.end(), 0);
  HAP_CHECK(sum <= g.total, device, ": the SM groups asked for (", list(asked),
            ", rounded to multiples of ", g.alignment, ": ", list(granted), ") add up to ", sum,
            " SMs, more than the ", g.total, " the GPU has; give the ranks sharing it fewer SMs");
  return granted;
}

SmPartitionRequest parse_sm_partition(const char* sms, const char* group) {
  SmPartitionRequest r;
  if (sms == nullptr || *sms == '\0') {
    HAP_CHECK(group == nullptr || *group == '\0', "HAP_EMULATE_SM_GROUP='", group,
              "' is set without HAP_EMULATE_SMS (the SM counts of the ranks sharing the GPU)");
    return r;
  }
  const std::string_view text(sms);
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    int n = 0;
    HAP_CHECK(parse_positive(item, n), "HAP_EMULATE_SMS='", sms,
              "': expected SM counts separated by commas (positive integers, one per rank "
              "sharing the GPU, e.g. 64,32,16,16)");
    r.asked.push_back(n);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  HAP_CHECK(group != nullptr && *group != '\0', "HAP_EMULATE_SMS='", sms,
            "' is set without HAP_EMULATE_SM_GROUP (which of its groups this process takes)");
  int g = 0;
  const std::string_view gtext(group);
  const bool zero = gtext == "0";
  HAP_CHECK(zero || parse_positive(gtext, g), "HAP_EMULATE_SM_GROUP='", group,
            "': expected a group index from 0 to ", r.asked.size() - 1);
  HAP_CHECK(g < static_cast<int>(r.asked.size()), "HAP_EMULATE_SM_GROUP='", group,
            "': HAP_EMULATE_SMS='", sms, "' has ", r.asked.size(), " group(s), 0 to ",
            r.asked.size() - 1);
  r.group = zero ? 0 : g;
  return r;
}

SmPartitionRequest sm_partition_from_environment() {
  return parse_sm_partition(std::getenv("HAP_EMULATE_SMS"), std::getenv("HAP_EMULATE_SM_GROUP"));
}

}  // namespace hap
