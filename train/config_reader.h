// Strict, typed reading of YAML config sections (internal to train/config.cc).
//
// A SectionReader owns the rules every config key shares: unknown and repeated keys are errors,
// integers reject floats and quoted strings, booleans are true/false only, numbers must be finite,
// and each value is checked against its Bounds. Every error throws one ConfigError in the form
//   <file>: <key path>: expected <what>, got <value>
// and says when the value came from a --set override.
#pragma once
#include <yaml-cpp/yaml.h>

#include <array>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/byte_size.h"
#include "train/config.h"

namespace hap::train::detail {

// Shortest text that reads back as the same number (0.001, 1e-08, 128).
template <typename T>
std::string format_number(T value) {
  std::array<char, 64> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return std::string(buffer.data(), result.ptr);
}

// "a, b, c", or "'a', 'b'" with quote = "'".
template <typename Names>
std::string join(const Names& names, std::string_view quote = "") {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out.append(quote).append(name).append(quote);
  }
  return out;
}

// How a value appears in a message: a scalar as written, anything else by its kind.
std::string show(const YAML::Node& node);

// "unknown key; valid keys of train: ... (did you mean 'steps'?)" for `section`.`key`.
std::string unknown_key_problem(std::string_view section, std::string_view key,
                                std::span<const std::string_view> keys);

// What a message needs to point at the file or at the --set argument a value came from.
struct Origin {
  std::string file;
  // key path -> the command-line argument that set it ("--set train.steps=9", "--strategy tp")
  std::map<std::string, std::string, std::less<>> overrides;
};

// Reads and parses origin.file as exactly one YAML document (an empty file gives a null node);
// `what` names the file in messages ("config file", "cluster file").
YAML::Node parse_yaml_file(const Origin& origin, std::string_view what);

// Throws the one message for one error: "<file>: <key path>: <problem>".
[[noreturn]] void fail(const Origin& origin, std::string_view key_path, std::string_view problem);

// The accepted range of a number. `reason` explains a bound taken from another key.
template <typename T>
struct Bounds {
  std::optional<T> min;
  std::optional<T> max;
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::string reason;

  static Bounds at_least(T lo) { return make(lo, std::nullopt, false, false); }
  static Bounds above(T lo) { return make(lo, std::nullopt, true, false); }
  static Bounds closed(T lo, T hi) { return make(lo, hi, false, false); }
  static Bounds closed_open(T lo, T hi) { return make(lo, hi, false, true); }
  static Bounds open(T lo, T hi) { return make(lo, hi, true, true); }
  static Bounds open_closed(T lo, T hi) { return make(lo, hi, true, false); }

  Bounds because(std::string why) const {
    Bounds copy = *this;
    copy.reason = std::move(why);
    return copy;
  }

  bool contains(T value) const {
    if (min && (min_exclusive ? value <= *min : value < *min)) return false;
    if (max && (max_exclusive ? value >= *max : value > *max)) return false;
    return true;
  }

  // "a number in [0, 1)", "an integer >= 1 (reason)".
  std::string expectation(std::string_view noun) const {
    std::string text(noun);
    if (min && max) {
      text += min_exclusive ? " in (" : " in [";
      text += format_number(*min) + ", " + format_number(*max);
      text += max_exclusive ? ")" : "]";
    } else if (min) {
      text += (min_exclusive ? " > " : " >= ") + format_number(*min);
    } else if (max) {
      text += (max_exclusive ? " < " : " <= ") + format_number(*max);
    }
    if (!reason.empty()) text += " (" + reason + ")";
    return text;
  }

 private:
  static Bounds make(std::optional<T> lo, std::optional<T> hi, bool lo_exclusive,
                     bool hi_exclusive) {
    Bounds bounds;
    bounds.min = lo;
    bounds.max = hi;
    bounds.min_exclusive = lo_exclusive;
    bounds.max_exclusive = hi_exclusive;
    return bounds;
  }
};
using IntRange = Bounds<std::int64_t>;
using RealRange = Bounds<double>;

// One YAML spelling of an enum value.
template <typename E>
struct Choice {
  std::string_view name;
  E value;
};

enum class Parsed { kOk, kMalformed, kOutOfRange };

// Parses a whole decimal integer; YAML allows a leading '+'.
template <typename T>
Parsed parse_integer(std::string_view text, T& value) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  // from_chars rejects any sign for unsigned types, but a negative integer is out of range, not
  // malformed.
  if constexpr (std::is_unsigned_v<T>) {
    if (!text.empty() && text[0] == '-') {
      const auto [ptr, ec] = std::from_chars(text.data() + 1, end, value);
      return ptr == end && ptr != text.data() + 1 ? Parsed::kOutOfRange : Parsed::kMalformed;
    }
  }
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ptr != end || ptr == text.data()) return Parsed::kMalformed;
  if (ec == std::errc::result_out_of_range) return Parsed::kOutOfRange;
  return ec == std::errc() ? Parsed::kOk : Parsed::kMalformed;
}

// Parses a whole finite decimal number (1, 0.5, 1e-3); false for anything else.
using ::hap::parse_number;

// Reads the typed values of one mapping (the document itself, or one section). Construction
// rejects unknown and repeated keys; each getter reads one key, checks its type and range, and
// returns `fallback` when the key is absent (a missing key without a fallback is an error).
class SectionReader {
 public:
  // `section` is the key path of the mapping ("" for the document). An absent or empty section
  // reads as an empty mapping, so its required keys are reported as missing. `origin` must
  // outlive the reader.
  SectionReader(const Origin& origin, std::string section, const YAML::Node& node,
                std::span<const std::string_view> keys);

  // The mapping under `key`, which must be present (unless `optional`: then an absent section
  // reads as empty, and its keys take their defaults).
  SectionReader section(std::string_view key, std::span<const std::string_view> keys,
                        bool optional = false);

  template <typename T>
  T integer(std::string_view key, std::type_identity_t<std::optional<T>> fallback,
            const Bounds<T>& bounds);

  double number(std::string_view key, std::optional<double> fallback, const RealRange& bounds);

  // YAML 1.2 booleans only: `yes`, `on` and `1` are rejected rather than guessed at.
  bool boolean(std::string_view key, std::optional<bool> fallback);

  // Any scalar, quoted or not; an empty value reads as "" where `allow_empty`.
  std::string string(std::string_view key, std::optional<std::string> fallback, bool allow_empty);

  // Names as one string, separated by commas ("a, b"), or as a YAML sequence of names ([a, b]),
  // returned in the string form (the sequence's names joined by ", "); an empty string or null
  // reads as "". A sequence must hold at least one name, each a non-empty scalar without a comma.
  std::string names(std::string_view key, std::optional<std::string> fallback);

  template <typename E, std::size_t N>
  E choice(std::string_view key, const std::array<Choice<E>, N>& choices,
           std::type_identity_t<std::optional<E>> fallback);

  // Whether `key` is present (a declared key; does not count as reading it).
  bool has(std::string_view key) const;

  // Reports a constraint between keys that Bounds cannot express, quoting `key`'s value.
  [[noreturn]] void fail_value(std::string_view key, std::string_view expectation) const;

  // Every declared key must have had a getter call, or a key would be accepted and then ignored.
  void finish() const;

  std::string path(std::string_view key) const;
  const Origin& origin() const { return origin_; }

 private:
  std::optional<YAML::Node> find(std::string_view key);

  template <typename T>
  T required(std::string_view key, std::optional<T> fallback, std::string_view expected) const {
    if (!fallback)
      fail(origin_, path(key), "missing required key; expected " + std::string(expected));
    return std::move(*fallback);
  }

  // The text of an unquoted scalar: a quoted "16" is a string in YAML, not a number.
  std::string unquoted_scalar(std::string_view key, const YAML::Node& node,
                              std::string_view noun) const;

  std::string mapping_expectation() const;

  const Origin& origin_;
  std::string section_;
  std::span<const std::string_view> keys_;
  std::map<std::string, YAML::Node, std::less<>> entries_;
  std::set<std::string, std::less<>> read_;
};

template <typename T>
T SectionReader::integer(std::string_view key, std::type_identity_t<std::optional<T>> fallback,
                         const Bounds<T>& bounds) {
  const std::string expected = bounds.expectation("an integer");
  const std::optional<YAML::Node> node = find(key);
  if (!node) return required(key, fallback, expected);
  const std::string text = unquoted_scalar(key, *node, "an integer");
  T value{};
  switch (parse_integer(text, value)) {
    case Parsed::kMalformed:
      fail(origin_, path(key), "expected an integer, got '" + text + "'");
    case Parsed::kOutOfRange: {
      // A negative value for an unsigned key is below the bounds; anything else overflowed.
      const bool negative = std::is_unsigned_v<T> && text.starts_with('-');
      const std::string overflow =
          negative ? "" : " (does not fit in a " + format_number(8 * sizeof(T)) + "-bit integer)";
      fail(origin_, path(key), "expected " + expected + ", got " + text + overflow);
    }
    case Parsed::kOk:
      break;
  }
  if (!bounds.contains(value)) fail(origin_, path(key), "expected " + expected + ", got " + text);
  return value;
}

template <typename E, std::size_t N>
E SectionReader::choice(std::string_view key, const std::array<Choice<E>, N>& choices,
                        std::type_identity_t<std::optional<E>> fallback) {
  std::vector<std::string_view> names;
  for (const Choice<E>& choice : choices) names.push_back(choice.name);
  const std::string expected = "one of " + join(names, "'");
  const std::optional<YAML::Node> node = find(key);
  if (!node) return required(key, fallback, expected);
  if (node->IsScalar())
    for (const Choice<E>& choice : choices)
      if (choice.name == node->Scalar()) return choice.value;
  fail(origin_, path(key), "expected " + expected + ", got " + show(*node));
}

}  // namespace hap::train::detail
