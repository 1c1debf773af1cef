#include "models/options.h"

#include <algorithm>
#include <charconv>
#include <sstream>

namespace hap::nn {

const char* option_type_name(OptionType type) {
  switch (type) {
    case OptionType::Integer:
      return "an integer";
    case OptionType::Number:
      return "a number";
    case OptionType::Boolean:
      return "true or false";
    case OptionType::String:
      return "a string";
  }
  return "?";
}

OptionSpec OptionSpec::integer(std::string name, std::optional<std::int64_t> fallback,
                               std::optional<double> min, std::optional<double> max,
                               std::string help) {
  OptionSpec s;
  s.name = std::move(name);
  s.type = OptionType::Integer;
  if (fallback) s.fallback = *fallback;
  s.min = min;
  s.max = max;
  s.help = std::move(help);
  return s;
}

OptionSpec OptionSpec::number(std::string name, std::optional<double> fallback,
                              std::optional<double> min, std::optional<double> max,
                              std::string help) {
  OptionSpec s;
  s.name = std::move(name);
  s.type = OptionType::Number;
  if (fallback) s.fallback = *fallback;
  s.min = min;
  s.max = max;
  s.help = std::move(help);
  return s;
}

OptionSpec OptionSpec::boolean(std::string name, std::optional<bool> fallback, std::string help) {
  OptionSpec s;
  s.name = std::move(name);
  s.type = OptionType::Boolean;
  if (fallback) s.fallback = *fallback;
  s.help = std::move(help);
  return s;
}

OptionSpec OptionSpec::string(std::string name, std::optional<std::string> fallback,
                              std::string help, std::vector<std::string> choices) {
  OptionSpec s;
  s.name = std::move(name);
  s.type = OptionType::String;
  if (fallback) s.fallback = *fallback;
  s.help = std::move(help);
  s.choices = std::move(choices);
  return s;
}

Options::Options(const std::vector<OptionSpec>& specs) {
  for (const OptionSpec& s : specs)
    if (s.fallback) values_[s.name] = *s.fallback;
}

const OptionValue& Options::at(std::string_view name) const {
  auto it = values_.find(name);
  HAP_ASSERT(it != values_.end(), "option '", name,
             "' was never set (a required option the "
             "reader did not check, or a name the schema does not declare)");
  return it->second;
}

std::int64_t Options::integer(std::string_view name) const {
  const OptionValue& v = at(name);
  HAP_ASSERT(std::holds_alternative<std::int64_t>(v), "option '", name, "' is not an integer");
  return std::get<std::int64_t>(v);
}

double Options::number(std::string_view name) const {
  const OptionValue& v = at(name);
  // An integer option may be read as a number (a count used in a formula).
  if (std::holds_alternative<std::int64_t>(v))
    return static_cast<double>(std::get<std::int64_t>(v));
  HAP_ASSERT(std::holds_alternative<double>(v), "option '", name, "' is not a number");
  return std::get<double>(v);
}

bool Options::boolean(std::string_view name) const {
  const OptionValue& v = at(name);
  HAP_ASSERT(std::holds_alternative<bool>(v), "option '", name, "' is not a boolean");
  return std::get<bool>(v);
}

const std::string& Options::string(std::string_view name) const {
  const OptionValue& v = at(name);
  HAP_ASSERT(std::holds_alternative<std::string>(v), "option '", name, "' is not a string");
  return std::get<std::string>(v);
}

void Options::set(std::string name, OptionValue value) {
  values_[std::move(name)] = std::move(value);
}

namespace {

std::string range_text(const OptionSpec& s) {
  std::ostringstream os;
  os << option_type_name(s.type);
  if (s.min && s.max)
    os << " in " << (s.min_exclusive ? "(" : "[") << *s.min << ", " << *s.max
       << (s.max_exclusive ? ")" : "]");
  else if (s.min)
    os << (s.min_exclusive ? " > " : " >= ") << *s.min;
  else if (s.max)
    os << (s.max_exclusive ? " < " : " <= ") << *s.max;
  return os.str();
}

}  // namespace

void check_options(const std::vector<OptionSpec>& specs, const Options& values) {
  for (const auto& [name, value] : values.values()) {
    auto it = std::find_if(specs.begin(), specs.end(),
                           [&key = name](const OptionSpec& s) { return s.name == key; });
    if (it == specs.end()) throw OptionError(name, "no such option");
    const OptionSpec& s = *it;
    bool typed = false;
    double number = 0;
    switch (s.type) {
      case OptionType::Integer:
        typed = std::holds_alternative<std::int64_t>(value);
        if (typed) number = static_cast<double>(std::get<std::int64_t>(value));
        break;
      case OptionType::Number:
        typed =
            std::holds_alternative<double>(value) || std::holds_alternative<std::int64_t>(value);
        if (typed) number = values.number(name);
        break;
      case OptionType::Boolean:
        typed = std::holds_alternative<bool>(value);
        break;
      case OptionType::String:
        typed = std::holds_alternative<std::string>(value);
        break;
    }
    if (!typed) throw OptionError(name, option_type_name(s.type));
    if (s.type == OptionType::Integer || s.type == OptionType::Number) {
      const bool low = s.min && (s.min_exclusive ? number <= *s.min : number < *s.min);
      const bool high = s.max && (s.max_exclusive ? number >= *s.max : number > *s.max);
      if (low || high) throw OptionError(name, range_text(s));
    }
    if (s.type == OptionType::String) {
      const std::string& text = std::get<std::string>(value);
      if (text.empty() && !s.allow_empty) throw OptionError(name, "a non-empty string");
      if (!s.choices.empty() &&
          std::find(s.choices.begin(), s.choices.end(), text) == s.choices.end())
        throw OptionError(name, "one of the declared choices");
    }
  }
  for (const OptionSpec& s : specs)
    if (!values.has(s.name)) throw OptionError(s.name, "a value (the option is required)");
}

std::string number_text(std::int64_t v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string number_text(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void check_elements(const char* key, const char* tensor,
                    std::initializer_list<SizeFactor> factors) {
  double product = 1;
  for (const SizeFactor& f : factors) product *= static_cast<double>(f.value);
  if (product <= kMaxTensorElements) return;
  std::string names, values;
  for (const SizeFactor& f : factors) {
    names += (names.empty() ? "" : " x ") + std::string(f.key);
    values += (values.empty() ? "" : " x ") + number_text(f.value);
  }
  throw OptionError(key, "an integer with " + names + " <= 2^40 (the elements of " + tensor +
                             "; here " + values + " = " + number_text(product) + ")");
}

}  // namespace hap::nn
