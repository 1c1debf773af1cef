// Typed options of a registered model or dataset: each entry of the model zoo (models/zoo.h) and
// of the dataset registry (train/dataset.h) declares its options once, as a list of OptionSpec
// (name, type, default or required, range, help). A config reader validates a YAML section
// against that list (train/config.h), so a model never looks a key up in a string map; it reads
// typed values from an Options that has already been checked.
//
//   {OptionSpec::integer("n_layer", std::nullopt, 1, 10000, "transformer blocks"),
//    OptionSpec::number("dropout", 0.0, 0.0, 1.0, "dropout probability").max_open()}
#pragma once
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/error.h"

namespace hap::nn {

using OptionValue = std::variant<std::int64_t, double, bool, std::string>;
enum class OptionType : std::uint8_t { Integer, Number, Boolean, String };
const char* option_type_name(OptionType type);  // "an integer", "a number", ...

// One declared option. Integer and Number options have a closed range [min, max] (either end
// may be open or absent); String options may list their accepted values.
struct OptionSpec {
  std::string name;
  OptionType type = OptionType::Integer;
  std::optional<OptionValue> fallback;  // nullopt: the option is required
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
  std::vector<std::string> choices;  // String: the accepted values (empty: any)
  bool allow_empty = false;          // String: "" is accepted
  std::string help;

  static OptionSpec integer(std::string name, std::optional<std::int64_t> fallback,
                            std::optional<double> min, std::optional<double> max, std::string help);
  static OptionSpec number(std::string name, std::optional<double> fallback,
                           std::optional<double> min, std::optional<double> max, std::string help);
  static OptionSpec boolean(std::string name, std::optional<bool> fallback, std::string help);
  static OptionSpec string(std::string name, std::optional<std::string> fallback, std::string help,
                           std::vector<std::string> choices = {});
  OptionSpec& min_open() {
    min_exclusive = true;
    return *this;
  }
  OptionSpec& max_open() {
    max_exclusive = true;
    return *this;
  }
  OptionSpec& empty_allowed() {
    allow_empty = true;
    return *this;
  }
};

// A constraint between options that a single OptionSpec cannot express (n_embd a multiple of
// n_head). `key` is the option the reader reports (its value is quoted), `expectation` what was
// expected ("a multiple of model.n_head = 4").
class OptionError : public Error {
 public:
  OptionError(std::string key, std::string expectation)
      : Error(key + ": expected " + expectation),
        key_(std::move(key)),
        expectation_(std::move(expectation)) {}
  const std::string& key() const { return key_; }
  const std::string& expectation() const { return expectation_; }

 private:
  std::string key_, expectation_;
};

// The checked values of one model's or dataset's options, by name.
class Options {
 public:
  Options() = default;
  // Every option of `specs` at its default (required options must be set() before use).
  explicit Options(const std::vector<OptionSpec>& specs);

  std::int64_t integer(std::string_view name) const;
  double number(std::string_view name) const;
  bool boolean(std::string_view name) const;
  const std::string& string(std::string_view name) const;
  bool has(std::string_view name) const { return values_.find(name) != values_.end(); }

  void set(std::string name, OptionValue value);
  const std::map<std::string, OptionValue, std::less<>>& values() const { return values_; }

 private:
  const OptionValue& at(std::string_view name) const;
  std::map<std::string, OptionValue, std::less<>> values_;
};

// Checks `values` against `specs` without a config file (for options built in C++): every
// value has its declared type and range, every required option is set, no unknown name. Throws
// OptionError naming the first problem.
void check_options(const std::vector<OptionSpec>& specs, const Options& values);

// ---- bounds a model's check() puts on its sizes ----
inline constexpr double kMaxDimension = 2147483647.0;  // 2^31 - 1: every dimension fits in 32 bits
inline constexpr double kMaxTensorElements = 1099511627776.0;  // 2^40: 4 TiB of f32

// The shortest decimal text of a number ("0.1", "4096").
std::string number_text(std::int64_t v);
std::string number_text(double v);

// One factor of a tensor's size: the option (or other quantity) it comes from and its value.
struct SizeFactor {
  const char* key;
  std::int64_t value;
};

// Throws OptionError on `key` when the product of `factors` (the elements of `tensor`) exceeds
// 2^40, naming every factor with its value: nothing derived from the sizes may overflow.
void check_elements(const char* key, const char* tensor, std::initializer_list<SizeFactor> factors);

}  // namespace hap::nn
