#include "train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <new>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/input_file.h"
#include "models/zoo.h"
#include "train/config_reader.h"
#include "train/dataset.h"
#include "train/trainer.h"

namespace hap::train {
namespace {

using detail::Bounds;
using detail::Choice;
using detail::fail;
using detail::format_number;
using detail::IntRange;
using detail::join;
using detail::Origin;
using detail::RealRange;
using detail::SectionReader;

// ---- the schema: the keys of each section, in the order the YAML files list them ----

constexpr std::array<std::string_view, 4> kSections = {"model", "data", "train", "parallel"};
constexpr std::array<std::string_view, 13> kParallelKeys = {"strategy",
                                                            "segments",
                                                            "search_budget",
                                                            "collective_timeout_s",
                                                            "backend",
                                                            "share_gpus",
                                                            "overlap_grad_comm",
                                                            "devices",
                                                            "select_devices",
                                                            "recompute",
                                                            "hierarchical_collectives",
                                                            "zero_storage",
                                                            "factor_broadcast"};
constexpr std::array<std::string_view, 23> kTrainKeys = {"batch_size",     "steps",
                                                         "optimizer",      "lr",
                                                         "min_lr",         "warmup_steps",
                                                         "weight_decay",   "beta1",
                                                         "beta2",          "eps",
                                                         "momentum",       "grad_clip",
                                                         "seed",           "log_every",
                                                         "eval_every",     "eval_batches",
                                                         "log_file",       "threads",
                                                         "device",         "checkpoint_every",
                                                         "checkpoint_dir", "keep_checkpoints",
                                                         "precision"};
// Keys that moved to another section, with where they went.
constexpr std::array<std::pair<std::string_view, std::string_view>, 1> kMovedKeys = {
    {{"train.seq_len",
      "model.seq_len (the sequence length is part of the model's declared inputs)"}}};

// The fixed keys of a section; empty for the sections whose keys come from a registered entry
// (model, data) and for a name that is not a section.
std::span<const std::string_view> keys_of(std::string_view section) {
  if (section == "train") return kTrainKeys;
  if (section == "parallel") return kParallelKeys;
  return {};
}

bool is_section(std::string_view name) {
  return std::find(kSections.begin(), kSections.end(), name) != kSections.end();
}

constexpr std::array<Choice<synth::Strategy>, 5> kStrategies = {{{"hap", synth::Strategy::Hap},
                                                                 {"dp-ev", synth::Strategy::DpEv},
                                                                 {"dp-cp", synth::Strategy::DpCp},
                                                                 {"tp", synth::Strategy::Tp},
                                                                 {"dp-ep", synth::Strategy::DpEp}}};
constexpr std::array<Choice<synth::SegmentMode>, 2> kSegmentModes = {
    {{"per-block", synth::SegmentMode::PerBlock}, {"single", synth::SegmentMode::Single}}};
constexpr std::array<Choice<synth::Recompute>, 3> kRecomputeModes = {
    {{"auto", synth::Recompute::Auto},
     {"off", synth::Recompute::Off},
     {"all", synth::Recompute::All}}};
constexpr std::array<Choice<synth::ZeroStorage>, 4> kZeroStorageModes = {
    {{"auto", synth::ZeroStorage::Auto},
     {"off", synth::ZeroStorage::Off},
     {"on", synth::ZeroStorage::On},
     {"all", synth::ZeroStorage::All}}};
constexpr std::array<Choice<synth::FactorBroadcast>, 2> kFactorBroadcastModes = {
    {{"auto", synth::FactorBroadcast::Auto}, {"off", synth::FactorBroadcast::Off}}};
constexpr std::array<Choice<CommBackend>, 3> kCommBackends = {
    {{"auto", CommBackend::kAuto}, {"nccl", CommBackend::kNccl}, {"mpi", CommBackend::kMpi}}};
constexpr std::array<Choice<Optimizer>, 2> kOptimizers = {
    {{"adamw", Optimizer::kAdamW}, {"sgd", Optimizer::kSgd}}};
constexpr std::array<Choice<DType>, 2> kPrecisions = {{{"f32", DType::F32}, {"bf16", DType::BF16}}};

template <typename E, std::size_t N>
std::string_view name_of(const std::array<Choice<E>, N>& choices, E value) {
  for (const Choice<E>& choice : choices)
    if (choice.value == value) return choice.name;
  throw InternalError("config: an enum value has no YAML spelling");
}

// ---- the file and the overrides ----

// Applies "section.key=value" overrides to the parsed tree, and records where each came from in
// `origin`, so that a message about an overridden value points at its command-line argument.
void apply_overrides(Origin& origin, YAML::Node& root,
                     const std::vector<ConfigOverride>& overrides) {
  for (const ConfigOverride& override : overrides) {
    const std::string& text = override.assignment;
    const std::string& argument = override.argument;
    const std::size_t equals = text.find('=');
    const std::string key_path = text.substr(0, equals);
    const std::size_t dot = key_path.find('.');
    if (equals == std::string::npos || dot == std::string::npos || dot == 0 ||
        dot + 1 == key_path.size())
      fail(origin, "",
           argument + ": expected section.key=value, e.g. train.steps=100, got '" + text + "'");
    const std::string section = key_path.substr(0, dot);
    const std::string key = key_path.substr(dot + 1);

    if (!is_section(section))
      fail(origin, key_path,
           argument + ": unknown section '" + section + "'; valid sections: " + join(kSections));
    for (const auto& [old_path, new_path] : kMovedKeys)
      if (key_path == old_path)
        fail(origin, key_path, argument + ": this key moved to " + std::string(new_path));
    // The model's and the dataset's keys depend on their name (which an override may set too):
    // their section readers report an unknown key, naming this argument.
    const std::span<const std::string_view> keys = keys_of(section);
    if (!keys.empty() && std::find(keys.begin(), keys.end(), key) == keys.end())
      fail(origin, key_path, argument + ": " + detail::unknown_key_problem(section, key, keys));

    // The value is a YAML scalar, so `--set train.lr=1e-3` means what `lr: 1e-3` means in the file.
    YAML::Node value;
    if (const std::size_t bad = invalid_utf8_at(text); bad != std::string::npos)
      fail(origin, key_path,
           "a --set argument that is not UTF-8 text (byte " + std::to_string(bad + 1) + ")");
    try {
      value = YAML::Load(text.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      fail(origin, key_path, argument + ": the value is not valid YAML: " + e.msg);
    }
    // yaml-cpp reads a value that cannot start a plain scalar (",cpu1": an indicator first; "#x":
    // a comment) as null where the file's reader refuses it: so does --set, unless the value
    // spells null (nothing, ~, null), else ",cpu1" would silently mean no value at all.
    if (value.IsNull()) {
      std::string v = text.substr(equals + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      v.erase(v.find_last_not_of(" \t") + 1);
      if (!(v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL"))
        fail(origin, key_path,
             argument + ": '" + v +
                 "' is not a YAML value (one that starts with ',', '#' or another YAML indicator "
                 "must be quoted, e.g. --set '" +
                 key_path + "=\"" + v + "\"')");
    }

    // A malformed tree is left as it is: the section reader reports it.
    if (!root.IsNull() && root.IsDefined() && !root.IsMap()) continue;
    YAML::Node section_node = root[section];
    if (section_node.IsDefined() && !section_node.IsNull() && !section_node.IsMap()) continue;
    section_node[key] = value;
    origin.overrides[key_path] = argument;
  }
}

// ---- the sections ----

constexpr std::int64_t kMaxDimension = (std::int64_t{1} << 31) - 1;

// The value of an option as the file shows it.
std::string value_text(const nn::OptionValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>)
          return "'" + x + "'";
        else if constexpr (std::is_same_v<T, bool>)
          return x ? "true" : "false";
        else
          return format_number(x);
      },
      v);
}

// The options of a registered entry (a model's, a dataset's) from its section, each read with its
// declared type and range, then the entry's check between options.
nn::Options read_options(SectionReader& s, const std::vector<nn::OptionSpec>& specs) {
  nn::Options o;
  for (const nn::OptionSpec& spec : specs) {
    switch (spec.type) {
      case nn::OptionType::Integer: {
        IntRange range;
        if (spec.min) range.min = static_cast<std::int64_t>(*spec.min);
        if (spec.max) range.max = static_cast<std::int64_t>(*spec.max);
        range.min_exclusive = spec.min_exclusive;
        range.max_exclusive = spec.max_exclusive;
        std::optional<std::int64_t> fallback;
        if (spec.fallback) fallback = std::get<std::int64_t>(*spec.fallback);
        o.set(spec.name, s.integer<std::int64_t>(spec.name, fallback, range));
        break;
      }
      case nn::OptionType::Number: {
        RealRange range;
        range.min = spec.min;
        range.max = spec.max;
        range.min_exclusive = spec.min_exclusive;
        range.max_exclusive = spec.max_exclusive;
        std::optional<double> fallback;
        if (spec.fallback) fallback = std::get<double>(*spec.fallback);
        o.set(spec.name, s.number(spec.name, fallback, range));
        break;
      }
      case nn::OptionType::Boolean: {
        std::optional<bool> fallback;
        if (spec.fallback) fallback = std::get<bool>(*spec.fallback);
        o.set(spec.name, s.boolean(spec.name, fallback));
        break;
      }
      case nn::OptionType::String: {
        std::optional<std::string> fallback;
        if (spec.fallback) fallback = std::get<std::string>(*spec.fallback);
        std::string text = s.string(spec.name, fallback, spec.allow_empty);
        if (!spec.choices.empty() &&
            std::find(spec.choices.begin(), spec.choices.end(), text) == spec.choices.end())
          s.fail_value(spec.name, "one of " + join(spec.choices, "'"));
        o.set(spec.name, std::move(text));
        break;
      }
    }
  }
  return o;
}

// Throws the reader's message for an entry's failed check between options.
[[noreturn]] void fail_option(const SectionReader& s, const nn::Options& o,
                              const nn::OptionError& e) {
  if (s.has(e.key()) || !o.has(e.key())) s.fail_value(e.key(), e.expectation());
  // A default value broke the constraint: quote it.
  fail(s.origin(), s.path(e.key()),
       "expected " + e.expectation() + ", got " + value_text(o.values().at(e.key())) +
           " (the default)");
}

// The keys of a registered entry's section: name, then its options.
std::vector<std::string_view> entry_keys(const std::vector<nn::OptionSpec>& specs) {
  std::vector<std::string_view> keys = {"name"};
  for (const nn::OptionSpec& spec : specs) keys.push_back(spec.name);
  return keys;
}

// The `name` of a registered-entry section before its reader exists (its keys depend on it).
std::string entry_name(const Origin& origin, const YAML::Node& root, std::string_view section,
                       std::string fallback, const std::vector<std::string>& names) {
  YAML::Node node = root.IsMap() ? root[std::string(section)] : YAML::Node();
  if (!node.IsDefined() || !node.IsMap() || !node["name"].IsDefined()) return fallback;
  const YAML::Node name = node["name"];
  const std::string key_path = std::string(section) + ".name";
  if (!name.IsScalar() || std::find(names.begin(), names.end(), name.Scalar()) == names.end())
    fail(origin, key_path,
         "expected one of " + join(names, "'") + " (the registered names), got " +
             detail::show(name));
  return name.Scalar();
}

// The model section, read, with what its check needs once the batch size is known.
struct ModelSection {
  ModelConfig config;
  std::vector<std::string_view> keys;  // the reader's keys live here
  std::optional<SectionReader> reader;
};

ModelSection read_model(const Origin& origin, SectionReader& document, const YAML::Node& root) {
  ModelSection m;
  m.config.name = entry_name(origin, root, "model", m.config.name, nn::model_names());
  const nn::ModelEntry& entry = nn::find_model(m.config.name);
  m.keys = entry_keys(entry.options);
  m.reader.emplace(document.section("model", m.keys));
  m.reader->string("name", m.config.name, false);
  m.config.options = read_options(*m.reader, entry.options);
  m.reader->finish();
  return m;
}

void check_model(const ModelSection& m, std::int64_t batch_size) {
  const nn::ModelEntry& entry = nn::find_model(m.config.name);
  try {
    if (entry.check) entry.check(m.config.options, batch_size);
  } catch (const nn::OptionError& e) {
    fail_option(*m.reader, m.config.options, e);
  }
}

// The data section; without a name it is the model's dataset (nn::ModelEntry::data), and it may
// be left out when that dataset needs no option.
DataConfig read_data(const Origin& origin, SectionReader& document, const YAML::Node& root,
                     const std::string& model_data) {
  DataConfig d;
  d.name = entry_name(origin, root, "data", model_data, dataset_names());
  const DatasetEntry& entry = find_dataset(d.name);
  const std::vector<std::string_view> keys = entry_keys(entry.options);
  SectionReader s = document.section("data", keys, /*optional=*/true);
  s.string("name", d.name, false);
  d.options = read_options(s, entry.options);
  s.finish();
  return d;
}

TrainConfig read_train(SectionReader& s) {
  TrainConfig t;
  t.batch_size = s.integer("batch_size", std::nullopt, IntRange::closed(1, kMaxDimension));
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
  const std::optional<Device> device = parse_device(s.string("device", "cpu", false));
  if (!device) s.fail_value("device", "cpu, cuda or cuda:N (N a device index >= 0)");
  t.device = *device;
  t.checkpoint_dir = s.string("checkpoint_dir", t.checkpoint_dir, /*allow_empty=*/true);
  t.checkpoint_every = s.integer(
      "checkpoint_every", t.checkpoint_every,
      t.checkpoint_dir.empty()
          ? IntRange::closed(0, 0).because("set train.checkpoint_dir to write checkpoints")
          : IntRange::at_least(0));
  t.keep_checkpoints = s.integer("keep_checkpoints", t.keep_checkpoints, IntRange::at_least(1));
  t.precision = s.choice("precision", kPrecisions, t.precision);
  s.finish();
  return t;
}

ParallelConfig read_parallel(SectionReader& s) {
  ParallelConfig p;
  p.strategy = s.choice("strategy", kStrategies, p.strategy);
  p.segments = s.choice("segments", kSegmentModes, p.segments);
  // Fewer states than this cannot plan even the smallest model.
  p.search_budget = s.integer("search_budget", p.search_budget, IntRange::at_least(1000));
  p.collective_timeout_s =
      s.number("collective_timeout_s", p.collective_timeout_s, RealRange::at_least(0.0));
  p.backend = s.choice("backend", kCommBackends, p.backend);
  p.share_gpus = s.boolean("share_gpus", p.share_gpus);
  p.overlap_grad_comm = s.boolean("overlap_grad_comm", p.overlap_grad_comm);
  p.devices = s.names("devices", p.devices);
  p.select_devices = s.boolean("select_devices", p.select_devices);
  p.recompute = s.choice("recompute", kRecomputeModes, p.recompute);
  p.hierarchical_collectives = s.boolean("hierarchical_collectives", p.hierarchical_collectives);
  p.zero_storage = s.choice("zero_storage", kZeroStorageModes, p.zero_storage);
  p.factor_broadcast = s.choice("factor_broadcast", kFactorBroadcastModes, p.factor_broadcast);
  s.finish();
  return p;
}

}  // namespace

std::string_view to_string(synth::SegmentMode segments) { return name_of(kSegmentModes, segments); }
std::string_view to_string(Optimizer optimizer) { return name_of(kOptimizers, optimizer); }
std::string_view to_string(CommBackend backend) { return name_of(kCommBackends, backend); }

RunConfig load_run_config(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  Origin origin{.file = path, .overrides = {}};
  YAML::Node root = detail::parse_yaml_file(origin, "config file");
  apply_overrides(origin, root, overrides);

  for (const auto& [old_path, new_path] : kMovedKeys) {
    const std::string path(old_path);
    const std::size_t dot = path.find('.');
    if (root.IsMap() && root[path.substr(0, dot)].IsMap() &&
        root[path.substr(0, dot)][path.substr(dot + 1)].IsDefined())
      fail(origin, path, "this key moved to " + std::string(new_path));
  }
  SectionReader document(origin, "", root, kSections);
  RunConfig config;
  config.source_file = path;
  // Sections in file order; the model's check, which bounds its activations by the batch size,
  // once the train section is read.
  ModelSection model = read_model(origin, document, root);
  config.model = model.config;
  config.data = read_data(origin, document, root, nn::find_model(config.model.name).data);
  SectionReader train = document.section("train", kTrainKeys);
  config.train = read_train(train);
  check_model(model, config.train.batch_size);
  SectionReader parallel = document.section("parallel", kParallelKeys, /*optional=*/true);
  config.parallel = read_parallel(parallel);
  document.finish();
  return config;
}

namespace {

// "name: k1 v1, k2 v2, ..." in the entry's declared order.
std::string options_line(const std::string& name, const nn::Options& o,
                         const std::vector<nn::OptionSpec>& specs) {
  std::string line = name;
  bool first = true;
  for (const nn::OptionSpec& spec : specs) {
    if (!o.has(spec.name)) continue;
    const nn::OptionValue& v = o.values().at(spec.name);
    line += (first ? ": " : ", ") + spec.name + " " +
            (std::holds_alternative<std::string>(v) ? std::get<std::string>(v) : value_text(v));
    first = false;
  }
  return line;
}

nlohmann::json options_json(const std::string& name, const nn::Options& o) {
  nlohmann::json j = {{"name", name}};
  for (const auto& [key, value] : o.values())
    std::visit([&j, &k = key](const auto& x) { j[k] = x; }, value);
  return j;
}

}  // namespace

std::string describe(const RunConfig& config) {
  const TrainConfig& t = config.train;
  std::ostringstream os;
  os << "config " << config.source_file << "\n";
  os << "  model: "
     << options_line(config.model.name, config.model.options,
                     nn::find_model(config.model.name).options)
     << "\n";
  os << "  data:  "
     << options_line(config.data.name, config.data.options, find_dataset(config.data.name).options)
     << "\n";
  os << "  train: " << t.steps << " steps of " << t.batch_size << " examples, "
     << to_string(t.optimizer) << ", lr " << format_number(t.lr) << " -> "
     << format_number(t.min_lr) << " (" << t.warmup_steps << " warmup steps), weight_decay "
     << format_number(t.weight_decay);
  if (t.optimizer == Optimizer::kAdamW)
    os << ", betas " << format_number(t.beta1) << "/" << format_number(t.beta2) << ", eps "
       << format_number(t.eps);
  else
    os << ", momentum " << format_number(t.momentum);
  os << ", grad_clip " << (t.grad_clip > 0 ? format_number(t.grad_clip) : "off") << "\n";
  os << "         seed " << t.seed << ", log every " << t.log_every << " steps, eval every "
     << t.eval_every << " steps on " << t.eval_batches << " batches, log_file "
     << (t.log_file.empty() ? "none" : t.log_file) << ", threads "
     << (t.threads == 0 ? "auto" : format_number(t.threads)) << ", device " << t.device.str()
     << ", precision " << name_of(kPrecisions, t.precision)
     << (t.precision == DType::BF16 ? " (mixed: bf16 products, f32 norms, loss and parameters)"
                                    : "")
     << "\n";
  if (!t.checkpoint_dir.empty())
    os << "         checkpoints in " << t.checkpoint_dir << " every "
       << (t.checkpoint_every > 0 ? format_number(t.checkpoint_every) + " steps" : "run's end")
       << ", keeping the newest " << t.keep_checkpoints << "\n";
  return os.str();
}

nlohmann::json to_json(const RunConfig& config) {
  const TrainConfig& t = config.train;
  // The keys are the YAML keys, so a logged config reads like the file that produced it.
  return {
      {"source_file", config.source_file},
      {"model", options_json(config.model.name, config.model.options)},
      {"data", options_json(config.data.name, config.data.options)},
      {"train",
       {{"batch_size", t.batch_size},
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
        {"threads", t.threads},
        {"device", t.device.str()},
        {"checkpoint_every", t.checkpoint_every},
        {"checkpoint_dir", t.checkpoint_dir},
        {"keep_checkpoints", t.keep_checkpoints},
        {"precision", std::string(name_of(kPrecisions, t.precision))}}},
      {"parallel",
       {{"strategy", synth::strategy_name(config.parallel.strategy)},
        {"segments", std::string(to_string(config.parallel.segments))},
        {"search_budget", config.parallel.search_budget},
        {"collective_timeout_s", config.parallel.collective_timeout_s},
        {"backend", std::string(to_string(config.parallel.backend))},
        {"share_gpus", config.parallel.share_gpus},
        {"overlap_grad_comm", config.parallel.overlap_grad_comm},
        {"devices", config.parallel.devices},
        {"select_devices", config.parallel.select_devices},
        {"recompute", std::string(name_of(kRecomputeModes, config.parallel.recompute))},
        {"hierarchical_collectives", config.parallel.hierarchical_collectives},
        {"zero_storage", std::string(name_of(kZeroStorageModes, config.parallel.zero_storage))},
        {"factor_broadcast",
         std::string(name_of(kFactorBroadcastModes, config.parallel.factor_broadcast))}}},
  };
}

synth::SynthesisOptions synthesis_options(const RunConfig& config) {
  const ParallelConfig& p = config.parallel;
  synth::SynthesisOptions o;
  o.optimizer_state_slots = optimizer_state_slots(config.train);
  o.strategy = p.strategy;
  o.segments = p.segments;
  o.max_states = p.search_budget;
  o.overlap_grad_comm = p.overlap_grad_comm;
  o.select_devices = p.select_devices;
  o.recompute = p.recompute;
  o.hierarchical_collectives = p.hierarchical_collectives;
  o.zero_storage = p.zero_storage;
  o.factor_broadcast = p.factor_broadcast;
  return o;
}

int device_rank(const synth::Cluster& cluster, const std::string& name) {
  for (int r = 0; r < cluster.size(); ++r)
    if (cluster.devices[static_cast<size_t>(r)].name == name) return r;
  return -1;
}

std::vector<int> pinned_devices(const ParallelConfig& p, const synth::Cluster& cluster) {
  std::vector<int> ranks;
  if (p.devices.empty()) return ranks;
  const std::string key = "parallel.devices";
  size_t at = 0;
  while (at <= p.devices.size()) {
    size_t comma = p.devices.find(',', at);
    if (comma == std::string::npos) comma = p.devices.size();
    std::string name = p.devices.substr(at, comma - at);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    at = comma + 1;
    if (name.empty()) continue;
    const int rank = device_rank(cluster, name);
    if (rank < 0) {
      std::string known;
      for (int r = 0; r < cluster.size() && r < 8; ++r)
        known += (r ? ", " : "") + cluster.devices[static_cast<size_t>(r)].name;
      if (cluster.size() > 8) known += ", ...";
      throw ConfigError(key + ": the cluster '" + cluster.name + "' has no device '" + name +
                        "' (its devices: " + known + ")");
    }
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end())
      throw ConfigError(key + ": device '" + name + "' is named twice");
    ranks.push_back(rank);
  }
  if (ranks.empty())
    throw ConfigError(key + ": '" + p.devices +
                      "' names no device; expected device names separated by commas, or "
                      "nothing (hap chooses)");
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string synthesis_error_message(const std::string& what, const ParallelConfig& p) {
  // The search (synth/search.cc) knows no config keys; its budget error asks to "raise the
  // search budget".
  if (what.find("search budget") == std::string::npos) return what;
  return what + "; the budget is parallel.search_budget = " + std::to_string(p.search_budget) +
         " states (--set parallel.search_budget=N, or hap-plan --search-budget N)";
}

std::string cut_message(const std::string& message, size_t limit) {
  if (message.size() <= limit) return message;
  // The start names the file and key, the end what was expected or found last.
  const size_t head = limit * 2 / 3, tail = limit - head;
  return message.substr(0, head) + " [... " + std::to_string(message.size() - head - tail) +
         " characters cut ...] " + message.substr(message.size() - tail);
}

int report_current_exception(const char* prog) {
  constexpr size_t kLimit = 2000;  // a value quoted whole could be megabytes long
  try {
    throw;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: config error: %s\n", prog, cut_message(e.what(), kLimit).c_str());
    return 2;
  } catch (const synth::OptionsError& e) {
    std::fprintf(stderr, "%s: config error: %s\n", prog, cut_message(e.what(), kLimit).c_str());
    return 2;
  } catch (const hap::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, cut_message(e.what(), kLimit).c_str());
  } catch (const std::bad_alloc&) {
    std::fprintf(
        stderr,
        "%s: error: out of memory (the model or the search is too large for this machine)\n", prog);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", prog, cut_message(e.what(), kLimit).c_str());
  }
  return 1;
}

}  // namespace hap::train
