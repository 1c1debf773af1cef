#include "core/byte_size.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <system_error>

namespace hap {

namespace {

struct Unit {
  std::string_view name;
  double scale;
};
constexpr std::array<Unit, 10> kUnits = {{{"B", 1.0},
                                          {"KB", 1e3},
                                          {"kB", 1e3},
                                          {"MB", 1e6},
                                          {"GB", 1e9},
                                          {"TB", 1e12},
                                          {"KiB", 1024.0},
                                          {"MiB", 1048576.0},
                                          {"GiB", 1073741824.0},
                                          {"TiB", 1099511627776.0}}};
constexpr double kMaxBytes = 1e15;

}  // namespace

bool parse_number(std::string_view text, double& value) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ptr == end && ptr != text.data() && ec == std::errc() && std::isfinite(value);
}

std::optional<std::int64_t> parse_byte_size(std::string_view text) {
  std::size_t split = text.size();
  while (split > 0 && std::isalpha(static_cast<unsigned char>(text[split - 1]))) --split;
  const std::string_view unit_text = text.substr(split);
  std::string_view number_text = text.substr(0, split);
  while (!number_text.empty() && number_text.back() == ' ') number_text.remove_suffix(1);

  double scale = 1.0;
  if (!unit_text.empty()) {
    const auto it = std::find_if(kUnits.begin(), kUnits.end(),
                                 [&](const Unit& unit) { return unit.name == unit_text; });
    if (it == kUnits.end()) return std::nullopt;
    scale = it->scale;
  }
  double value = 0;
  if (!parse_number(number_text, value)) return std::nullopt;
  double bytes = value * scale;
  // A plain number counts bytes and must be whole; with a unit, round to whole bytes.
  if (unit_text.empty() && bytes != std::floor(bytes)) return std::nullopt;
  bytes = std::round(bytes);
  if (!(bytes >= 1 && bytes <= kMaxBytes)) return std::nullopt;
  return static_cast<std::int64_t>(bytes);
}

}  // namespace hap
