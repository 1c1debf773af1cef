#include "apps/common/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <type_traits>
#include <utility>

namespace hap::app {
namespace {

// ---- the schema: the keys of each section, in the order the YAML files list them ----

constexpr std::array<std::string_view, 3> kSections = {"model", "data", "train"};
constexpr std::array<std::string_view, 8> kModelKeys = {
    "name", "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias"};
constexpr std::array<std::string_view, 2> kDataKeys = {"path", "val_fraction"};
constexpr std::array<std::string_view, 19> kTrainKeys = {
    "batch_size", "seq_len",      "steps",        "optimizer", "lr",
    "min_lr",     "warmup_steps", "weight_decay", "beta1",     "beta2",
    "eps",        "momentum",     "grad_clip",    "seed",      "log_every",
    "eval_every", "eval_batches", "log_file",     "threads"};

// The keys of a section; empty for a name that is not a section.
std::span<const std::string_view> keys_of(std::string_view section) {
  if (section == "model") return kModelKeys;
  if (section == "data") return kDataKeys;
  if (section == "train") return kTrainKeys;
  return {};
}

template <typename E>
struct Choice {
  std::string_view name;
  E value;
};
constexpr std::array<Choice<ModelName>, 1> kModelNames = {{{"gpt", ModelName::kGpt}}};
constexpr std::array<Choice<Optimizer>, 2> kOptimizers = {
    {{"adamw", Optimizer::kAdamW}, {"sgd", Optimizer::kSgd}}};

template <typename E, std::size_t N>
std::string_view name_of(const std::array<Choice<E>, N>& choices, E value) {
  for (const Choice<E>& choice : choices)
    if (choice.value == value) return choice.name;
  throw InternalError("config: an enum value has no YAML spelling");
}

// ---- formatting for messages ----

// Shortest text that reads back as the same number (0.001, 1e-08, 128).
template <typename T>
std::string format_number(T value) {
  std::array<char, 64> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return std::string(buffer.data(), result.ptr);
}

template <typename Range>
std::string join(const Range& names, std::string_view quote = "") {
  std::string out;
  for (const auto& name : names) {
    if (!out.empty()) out += ", ";
    out += quote;
    out += name;
    out += quote;
  }
  return out;
}

// How a value appears in a message: a scalar as written, anything else by its kind.
std::string show(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "an empty value";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The valid key a misspelled one most likely meant, when one is close enough to be a typo.
std::optional<std::string_view> likely_meant(std::string_view key,
                                             std::span<const std::string_view> keys) {
  std::optional<std::string_view> best;
  std::size_t best_distance = std::min<std::size_t>(2, key.size() / 2);
  for (std::string_view candidate : keys) {
    const std::size_t distance = edit_distance(key, candidate);
    if (distance <= best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

// ---- where values came from ----

// What a message needs to point at the file or at the --set argument a value came from.
struct Origin {
  std::string file;
  std::map<std::string, std::string, std::less<>> overrides;  // key path -> "--set" argument
};

// Throws the one message for one error: "<file>: <key path>: <problem>".
[[noreturn]] void fail(const Origin& origin, std::string_view key_path, std::string_view problem) {
  std::string message = origin.file + ": ";
  if (!key_path.empty()) message.append(key_path).append(": ");
  message.append(problem);
  if (const auto it = origin.overrides.find(key_path); it != origin.overrides.end())
    message += " (value from --set " + it->second + ")";
  throw ConfigError(message);
}

// ---- accepted ranges ----

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
  Bounds because(std::string why) const {
    Bounds copy = *this;
    copy.reason = std::move(why);
    return copy;
  }

  static Bounds make(std::optional<T> lo, std::optional<T> hi, bool lo_exclusive,
                     bool hi_exclusive) {
    Bounds bounds;
    bounds.min = lo;
    bounds.max = hi;
    bounds.min_exclusive = lo_exclusive;
    bounds.max_exclusive = hi_exclusive;
    return bounds;
  }

  bool contains(T value) const {
    if (min && (min_exclusive ? value <= *min : value < *min)) return false;
    if (max && (max_exclusive ? value >= *max : value > *max)) return false;
    return true;
  }

  // "a number in [0, 1)", "an integer >= 1 (why)".
  std::string expectation(std::string_view noun) const {
    std::string text(noun);
    if (min && max) {
      text += " in ";
      text += min_exclusive ? "(" : "[";
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
};
using IntRange = Bounds<std::int64_t>;
using RealRange = Bounds<double>;

enum class Parsed { kOk, kMalformed, kOutOfRange };

// Parses a whole decimal integer; YAML allows a leading '+'.
template <typename T>
Parsed parse_integer(std::string_view text, T& value) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  // from_chars rejects a sign for unsigned types; a negative integer is out of range, not
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

// Parses a whole finite decimal number (1, 0.5, 1e-3).
bool parse_number(std::string_view text, double& value) {
  if (text.size() > 1 && text[0] == '+' && text[1] != '-') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return ptr == end && ptr != text.data() && ec == std::errc() && std::isfinite(value);
}

// ---- reading one section ----

// Reads the typed values of one mapping (the document itself, or one section). Construction
// rejects unknown and repeated keys; each getter checks one key's type and range.
class SectionReader {
 public:
  // `section` is the key path of the mapping ("" for the document). An absent or empty section
  // reads as an empty mapping, so its required keys are reported as missing.
  SectionReader(const Origin& origin, std::string section, const YAML::Node& node,
                std::span<const std::string_view> keys)
      : origin_(origin), section_(std::move(section)), keys_(keys) {
    if (!node.IsDefined() || node.IsNull()) return;
    if (!node.IsMap())
      fail(origin_, section_, "expected " + mapping_expectation() + ", got " + show(node));
    for (const auto& entry : node) {
      if (!entry.first.IsScalar())
        fail(origin_, section_, "expected key names, got " + show(entry.first) + " as a key");
      const std::string& key = entry.first.Scalar();
      if (std::find(keys_.begin(), keys_.end(), key) == keys_.end())
        fail(origin_, path(key), unknown_key_problem(key));
      if (!entries_.emplace(key, entry.second).second)
        fail(origin_, path(key), "duplicate key; each key may appear once");
    }
  }

  // The mapping under `key`, which must be present.
  SectionReader section(std::string_view key, std::span<const std::string_view> keys) {
    const std::optional<YAML::Node> node = find(key);
    SectionReader reader(origin_, path(key), node.value_or(YAML::Node()), keys);
    if (!node)
      fail(origin_, path(key),
           "missing required section; expected " + reader.mapping_expectation());
    return reader;
  }

  template <typename T>
  T integer(std::string_view key, std::type_identity_t<std::optional<T>> fallback,
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
        fail(origin_, path(key),
             "expected " + expected + ", got " + text +
                 (negative
                      ? ""
                      : " (does not fit in a " + format_number(8 * sizeof(T)) + "-bit integer)"));
      }
      case Parsed::kOk:
        break;
    }
    if (!bounds.contains(value)) fail(origin_, path(key), "expected " + expected + ", got " + text);
    return value;
  }

  double number(std::string_view key, std::optional<double> fallback, const RealRange& bounds) {
    const std::string expected = bounds.expectation("a number");
    const std::optional<YAML::Node> node = find(key);
    if (!node) return required(key, fallback, expected);
    const std::string text = unquoted_scalar(key, *node, "a number");
    double value = 0.0;
    if (!parse_number(text, value))
      fail(origin_, path(key), "expected a number, got '" + text + "'");
    if (!bounds.contains(value)) fail(origin_, path(key), "expected " + expected + ", got " + text);
    return value;
  }

  // YAML 1.2 booleans only: `yes`, `on` and `1` are rejected rather than guessed at.
  bool boolean(std::string_view key, std::optional<bool> fallback) {
    const std::optional<YAML::Node> node = find(key);
    if (!node) return required(key, fallback, "true or false");
    const std::string text = unquoted_scalar(key, *node, "true or false");
    if (text == "true") return true;
    if (text == "false") return false;
    fail(origin_, path(key), "expected true or false, got '" + text + "'");
  }

  // Any scalar, quoted or not; an empty value reads as "" where `allow_empty`.
  std::string string(std::string_view key, std::optional<std::string> fallback, bool allow_empty) {
    const std::string expected = allow_empty ? "a string" : "a non-empty string";
    const std::optional<YAML::Node> node = find(key);
    if (!node) return required(key, std::move(fallback), expected);
    if (node->IsNull() && allow_empty) return "";
    if (!node->IsScalar())
      fail(origin_, path(key), "expected " + expected + ", got " + show(*node));
    if (node->Scalar().empty() && !allow_empty)
      fail(origin_, path(key), "expected " + expected + ", got ''");
    return node->Scalar();
  }

  template <typename E, std::size_t N>
  E choice(std::string_view key, const std::array<Choice<E>, N>& choices,
           std::type_identity_t<std::optional<E>> fallback) {
    std::vector<std::string_view> names;
    for (const Choice<E>& choice : choices) names.push_back(choice.name);
    const std::string expected = "one of " + join(names, "'");
    const std::optional<YAML::Node> node = find(key);
    if (!node) return required(key, fallback, expected);
    if (!node->IsScalar())
      fail(origin_, path(key), "expected " + expected + ", got " + show(*node));
    for (const Choice<E>& choice : choices)
      if (choice.name == node->Scalar()) return choice.value;
    fail(origin_, path(key), "expected " + expected + ", got " + show(*node));
  }

  // Reports a constraint between keys that Bounds cannot express, quoting `key`'s value.
  [[noreturn]] void fail_value(std::string_view key, std::string_view expectation) const {
    const auto it = entries_.find(key);
    const std::string got = it == entries_.end() ? "nothing" : it->second.Scalar();
    fail(origin_, path(key), "expected " + std::string(expectation) + ", got " + got);
  }

  // Every declared key must have a getter call, or a key would be accepted and then ignored.
  void finish() const {
    for (std::string_view key : keys_)
      HAP_ASSERT(read_.contains(key), "config key ", path(key), " is declared but never read");
  }

  std::string path(std::string_view key) const {
    return section_.empty() ? std::string(key) : section_ + "." + std::string(key);
  }

 private:
  std::optional<YAML::Node> find(std::string_view key) {
    HAP_ASSERT(std::find(keys_.begin(), keys_.end(), key) != keys_.end(), "config key ", path(key),
               " is read but not declared");
    read_.emplace(key);
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    return it->second;
  }

  template <typename T>
  T required(std::string_view key, std::optional<T> fallback, std::string_view expected) const {
    if (!fallback)
      fail(origin_, path(key), "missing required key; expected " + std::string(expected));
    return std::move(*fallback);
  }

  // The text of an unquoted scalar: a quoted "16" is a string in YAML, not a number.
  std::string unquoted_scalar(std::string_view key, const YAML::Node& node,
                              std::string_view noun) const {
    if (!node.IsScalar())
      fail(origin_, path(key), "expected " + std::string(noun) + ", got " + show(node));
    if (node.Tag() == "!")
      fail(origin_, path(key),
           "expected " + std::string(noun) + ", got the quoted string " + show(node) +
               " (remove the quotes)");
    return node.Scalar();
  }

  std::string mapping_expectation() const { return "a mapping with keys " + join(keys_); }

  std::string unknown_key_problem(std::string_view key) const {
    std::string problem = section_.empty()
                              ? "unknown section; valid sections: " + join(keys_)
                              : "unknown key; valid keys of " + section_ + ": " + join(keys_);
    if (const auto meant = likely_meant(key, keys_))
      problem += " (did you mean '" + std::string(*meant) + "'?)";
    return problem;
  }

  const Origin& origin_;
  std::string section_;
  std::span<const std::string_view> keys_;
  std::map<std::string, YAML::Node, std::less<>> entries_;
  std::set<std::string, std::less<>> read_;
};

// ---- the file and the overrides ----

YAML::Node parse_file(const Origin& origin) {
  std::error_code ec;
  if (std::filesystem::is_directory(origin.file, ec))
    fail(origin, "", "cannot read the config file: it is a directory, expected a YAML file");
  std::ifstream in(origin.file, std::ios::binary);
  if (!in) fail(origin, "", std::string("cannot read the config file: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    fail(origin, "", std::string("cannot read the config file: ") + std::strerror(errno));

  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text.str());
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null())
      where = " at line " + format_number(e.mark.line + 1) + ", column " +
              format_number(e.mark.column + 1);
    fail(origin, "", "YAML syntax error" + where + ": " + e.msg);
  }
  if (documents.size() > 1)
    fail(origin, "", "expected one YAML document, found " + format_number(documents.size()));
  return documents.empty() ? YAML::Node() : documents.front();
}

// Applies "section.key=value" overrides to the parsed tree, and records them in `origin` so that a
// message about an overridden value points at its --set argument.
void apply_overrides(Origin& origin, YAML::Node& root, const std::vector<std::string>& overrides) {
  for (const std::string& text : overrides) {
    const std::size_t equals = text.find('=');
    const std::string key_path = text.substr(0, equals);
    const std::size_t dot = key_path.find('.');
    if (equals == std::string::npos || dot == std::string::npos || dot == 0 ||
        dot + 1 == key_path.size())
      fail(origin, "", "--set '" + text + "': expected section.key=value, e.g. train.steps=100");
    const std::string section = key_path.substr(0, dot);
    const std::string key = key_path.substr(dot + 1);

    const std::span<const std::string_view> keys = keys_of(section);
    if (keys.empty())
      fail(origin, key_path,
           "--set " + text + ": unknown section '" + section +
               "'; valid sections: " + join(kSections));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::string problem =
          "--set " + text + ": unknown key; valid keys of " + section + ": " + join(keys);
      if (const auto meant = likely_meant(key, keys))
        problem += " (did you mean '" + std::string(*meant) + "'?)";
      fail(origin, key_path, problem);
    }

    // The value is a YAML scalar, so `--set train.lr=1e-3` means what `lr: 1e-3` means in the file.
    YAML::Node value;
    try {
      value = YAML::Load(text.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      fail(origin, key_path, "--set " + text + ": the value is not valid YAML: " + e.msg);
    }

    // A malformed tree is left as it is: the section reader reports it.
    if (!root.IsNull() && root.IsDefined() && !root.IsMap()) continue;
    YAML::Node section_node = root[section];
    if (section_node.IsDefined() && !section_node.IsNull() && !section_node.IsMap()) continue;
    section_node[key] = value;
    origin.overrides[key_path] = text;
  }
}

// ---- the sections ----

ModelConfig read_model(SectionReader& s) {
  ModelConfig m;
  m.name = s.choice("name", kModelNames, ModelName::kGpt);
  m.vocab_size =
      s.integer("vocab_size", m.vocab_size, IntRange::closed_open(1, std::int64_t{1} << 31));
  m.block_size = s.integer("block_size", std::nullopt, IntRange::at_least(1));
  m.n_layer = s.integer("n_layer", std::nullopt, IntRange::at_least(1));
  m.n_head = s.integer("n_head", std::nullopt, IntRange::at_least(1));
  m.n_embd = s.integer("n_embd", std::nullopt, IntRange::at_least(1));
  // Attention splits n_embd into n_head equal heads.
  if (m.n_embd % m.n_head != 0)
    s.fail_value("n_embd", "a multiple of model.n_head = " + format_number(m.n_head));
  m.dropout = s.number("dropout", m.dropout, RealRange::closed_open(0.0, 1.0));
  m.bias = s.boolean("bias", m.bias);
  s.finish();
  return m;
}

DataConfig read_data(SectionReader& s) {
  DataConfig d;
  d.path = s.string("path", std::nullopt, /*allow_empty=*/false);
  d.val_fraction = s.number("val_fraction", d.val_fraction, RealRange::open(0.0, 1.0));
  s.finish();
  return d;
}

TrainConfig read_train(SectionReader& s, const ModelConfig& model) {
  TrainConfig t;
  t.batch_size = s.integer("batch_size", std::nullopt, IntRange::at_least(1));
  // Positions past block_size have no position embedding.
  t.seq_len = s.integer("seq_len", std::nullopt,
                        IntRange::closed(1, model.block_size)
                            .because("train.seq_len may not exceed model.block_size"));
  t.steps = s.integer("steps", std::nullopt, IntRange::at_least(1));
  t.optimizer = s.choice("optimizer", kOptimizers, std::nullopt);
  t.lr = s.number("lr", std::nullopt, RealRange::above(0.0));
  t.min_lr = s.number("min_lr", t.lr,
                      RealRange::closed(0.0, t.lr).because("train.min_lr may not exceed train.lr"));
  t.warmup_steps = s.integer(
      "warmup_steps", t.warmup_steps,
      IntRange::closed(0, t.steps).because("train.warmup_steps may not exceed train.steps"));
  t.weight_decay = s.number("weight_decay", t.weight_decay, RealRange::at_least(0.0));
  t.beta1 = s.number("beta1", t.beta1, RealRange::closed_open(0.0, 1.0));
  t.beta2 = s.number("beta2", t.beta2, RealRange::closed_open(0.0, 1.0));
  t.eps = s.number("eps", t.eps, RealRange::above(0.0));
  t.momentum = s.number("momentum", t.momentum, RealRange::closed_open(0.0, 1.0));
  t.grad_clip = s.number("grad_clip", t.grad_clip, RealRange::at_least(0.0));
  t.seed = s.integer("seed", t.seed, Bounds<std::uint64_t>::at_least(0));
  t.log_every = s.integer("log_every", t.log_every, IntRange::at_least(1));
  t.eval_every = s.integer("eval_every", t.eval_every, IntRange::at_least(1));
  t.eval_batches = s.integer("eval_batches", t.eval_batches, IntRange::at_least(1));
  t.log_file = s.string("log_file", t.log_file, /*allow_empty=*/true);
  t.threads = s.integer("threads", t.threads, Bounds<int>::at_least(0));
  s.finish();
  return t;
}

}  // namespace

std::string_view to_string(ModelName name) { return name_of(kModelNames, name); }
std::string_view to_string(Optimizer optimizer) { return name_of(kOptimizers, optimizer); }

TrainRunConfig load_train_config(const std::string& path,
                                 const std::vector<std::string>& overrides) {
  Origin origin{.file = path, .overrides = {}};
  YAML::Node root = parse_file(origin);
  apply_overrides(origin, root, overrides);

  SectionReader document(origin, "", root, kSections);
  TrainRunConfig config;
  config.source_file = path;
  SectionReader model = document.section("model", kModelKeys);
  config.model = read_model(model);
  SectionReader data = document.section("data", kDataKeys);
  config.data = read_data(data);
  SectionReader train = document.section("train", kTrainKeys);
  config.train = read_train(train, config.model);
  document.finish();
  return config;
}

std::string describe(const TrainRunConfig& config) {
  const ModelConfig& m = config.model;
  const DataConfig& d = config.data;
  const TrainConfig& t = config.train;
  std::ostringstream os;
  os << "config " << config.source_file << "\n";
  os << "  model: " << to_string(m.name) << ", " << m.n_layer << " layers, " << m.n_head
     << " heads, n_embd " << m.n_embd << ", block_size " << m.block_size << ", vocab_size "
     << m.vocab_size << ", dropout " << format_number(m.dropout) << ", bias "
     << (m.bias ? "on" : "off") << "\n";
  os << "  data:  " << d.path << " (val_fraction " << format_number(d.val_fraction) << ")\n";
  os << "  train: " << t.steps << " steps of " << t.batch_size << " x " << t.seq_len << " tokens ("
     << t.batch_size * t.seq_len << " per step), " << to_string(t.optimizer) << ", lr "
     << format_number(t.lr) << " -> " << format_number(t.min_lr) << " (" << t.warmup_steps
     << " warmup steps), weight_decay " << format_number(t.weight_decay);
  if (t.optimizer == Optimizer::kAdamW)
    os << ", betas " << format_number(t.beta1) << "/" << format_number(t.beta2) << ", eps "
       << format_number(t.eps);
  else
    os << ", momentum " << format_number(t.momentum);
  os << ", grad_clip " << (t.grad_clip > 0 ? format_number(t.grad_clip) : "off") << "\n";
  os << "         seed " << t.seed << ", log every " << t.log_every << " steps, eval every "
     << t.eval_every << " steps on " << t.eval_batches << " batches, log_file "
     << (t.log_file.empty() ? "none" : t.log_file) << ", threads "
     << (t.threads == 0 ? "all cores" : format_number(t.threads)) << "\n";
  return os.str();
}

nlohmann::json to_json(const TrainRunConfig& config) {
  const ModelConfig& m = config.model;
  const DataConfig& d = config.data;
  const TrainConfig& t = config.train;
  // The keys are the YAML keys, so a logged config reads like the file that produced it.
  return {
      {"source_file", config.source_file},
      {"model",
       {{"name", std::string(to_string(m.name))},
        {"vocab_size", m.vocab_size},
        {"block_size", m.block_size},
        {"n_layer", m.n_layer},
        {"n_head", m.n_head},
        {"n_embd", m.n_embd},
        {"dropout", m.dropout},
        {"bias", m.bias}}},
      {"data", {{"path", d.path}, {"val_fraction", d.val_fraction}}},
      {"train",
       {{"batch_size", t.batch_size},
        {"seq_len", t.seq_len},
        {"steps", t.steps},
        {"optimizer", std::string(to_string(t.optimizer))},
        {"lr", t.lr},
        {"min_lr", t.min_lr},
        {"warmup_steps", t.warmup_steps},
        {"weight_decay", t.weight_decay},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"eps", t.eps},
        {"momentum", t.momentum},
        {"grad_clip", t.grad_clip},
        {"seed", t.seed},
        {"log_every", t.log_every},
        {"eval_every", t.eval_every},
        {"eval_batches", t.eval_batches},
        {"log_file", t.log_file},
        {"threads", t.threads}}},
  };
}

}  // namespace hap::app
