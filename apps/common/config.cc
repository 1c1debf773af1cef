#include "apps/common/config.h"

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

#include "apps/common/config_reader.h"

namespace hap::app {
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
constexpr std::array<std::string_view, 3> kParallelKeys = {"strategy", "segments", "search_budget"};
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
  if (section == "parallel") return kParallelKeys;
  return {};
}

constexpr std::array<Choice<ModelName>, 1> kModelNames = {{{"gpt", ModelName::kGpt}}};
constexpr std::array<Choice<Strategy>, 4> kStrategies = {{{"hap", Strategy::kHap},
                                                          {"dp-ev", Strategy::kDpEv},
                                                          {"dp-cp", Strategy::kDpCp},
                                                          {"tp", Strategy::kTp}}};
constexpr std::array<Choice<Segments>, 2> kSegmentModes = {
    {{"per-block", Segments::kPerBlock}, {"single", Segments::kSingle}}};
constexpr std::array<Choice<Optimizer>, 2> kOptimizers = {
    {{"adamw", Optimizer::kAdamW}, {"sgd", Optimizer::kSgd}}};

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

    const std::span<const std::string_view> keys = keys_of(section);
    if (keys.empty())
      fail(origin, key_path,
           argument + ": unknown section '" + section + "'; valid sections: " + join(kSections));
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      fail(origin, key_path, argument + ": " + detail::unknown_key_problem(section, key, keys));

    // The value is a YAML scalar, so `--set train.lr=1e-3` means what `lr: 1e-3` means in the file.
    YAML::Node value;
    try {
      value = YAML::Load(text.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      fail(origin, key_path, argument + ": the value is not valid YAML: " + e.msg);
    }

    // A malformed tree is left as it is: the section reader reports it.
    if (!root.IsNull() && root.IsDefined() && !root.IsMap()) continue;
    YAML::Node section_node = root[section];
    if (section_node.IsDefined() && !section_node.IsNull() && !section_node.IsMap()) continue;
    section_node[key] = value;
    origin.overrides[key_path] = argument;
  }
}

// ---- size limits ----

// Every dimension of the model and the batch fits in 32 bits, and no tensor of the model or of
// one step's activations has more than 2^40 elements (4 TiB of f32): far beyond any machine, and
// far from overflowing the 64-bit element counts and byte sizes derived from them.
constexpr std::int64_t kMaxDimension = (std::int64_t{1} << 31) - 1;
constexpr std::int64_t kMaxLayers = 10000;
constexpr double kMaxTensorElements = 1099511627776.0;  // 2^40

struct Factor {
  std::string_view key_path;
  std::int64_t value;
};

// Fails on `key` (the last factor read) when the product of `factors`, the elements of `tensor`,
// exceeds kMaxTensorElements; names every factor with its value. Computed in double: exact up to
// 2^53, and a product that large is over the limit however it rounds.
void check_elements(const SectionReader& s, std::string_view key, std::string_view tensor,
                    std::initializer_list<Factor> factors) {
  double product = 1;
  for (const Factor& f : factors) product *= static_cast<double>(f.value);
  if (product <= kMaxTensorElements) return;
  std::string names, values;
  for (const Factor& f : factors) {
    if (!names.empty()) {
      names += " x ";
      values += " x ";
    }
    names.append(f.key_path);
    values += format_number(f.value);
  }
  s.fail_value(key, "an integer with " + names + " <= 2^40 (the elements of " +
                        std::string(tensor) + "; here " + values + " = " + format_number(product) +
                        ")");
}

// ---- the sections ----

ModelConfig read_model(SectionReader& s) {
  ModelConfig m;
  m.name = s.choice("name", kModelNames, ModelName::kGpt);
  m.vocab_size = s.integer("vocab_size", m.vocab_size, IntRange::closed(1, kMaxDimension));
  m.block_size = s.integer("block_size", std::nullopt, IntRange::closed(1, kMaxDimension));
  m.n_layer = s.integer("n_layer", std::nullopt, IntRange::closed(1, kMaxLayers));
  m.n_head = s.integer("n_head", std::nullopt, IntRange::closed(1, kMaxDimension));
  m.n_embd = s.integer("n_embd", std::nullopt, IntRange::closed(1, kMaxDimension));
  // Attention splits n_embd into n_head equal heads.
  if (m.n_embd % m.n_head != 0)
    s.fail_value("n_embd", "a multiple of model.n_head = " + format_number(m.n_head));
  check_elements(s, "n_embd", "the token embedding",
                 {{"model.vocab_size", m.vocab_size}, {"model.n_embd", m.n_embd}});
  check_elements(s, "n_embd", "the position embedding",
                 {{"model.block_size", m.block_size}, {"model.n_embd", m.n_embd}});
  check_elements(s, "n_embd", "an MLP weight",
                 {{"4", 4}, {"model.n_embd", m.n_embd}, {"model.n_embd", m.n_embd}});
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
  t.batch_size = s.integer("batch_size", std::nullopt, IntRange::closed(1, kMaxDimension));
  // Positions past block_size have no position embedding.
  t.seq_len = s.integer("seq_len", std::nullopt,
                        IntRange::closed(1, model.block_size)
                            .because("train.seq_len may not exceed model.block_size"));
  // The largest activations of one step (attention never materialises its [B, H, T, T]).
  check_elements(s, "batch_size", "the MLP's hidden activation",
                 {{"train.batch_size", t.batch_size},
                  {"train.seq_len", t.seq_len},
                  {"4", 4},
                  {"model.n_embd", model.n_embd}});
  check_elements(s, "batch_size", "the logits",
                 {{"train.batch_size", t.batch_size},
                  {"train.seq_len", t.seq_len},
                  {"model.vocab_size", model.vocab_size}});
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

ParallelConfig read_parallel(SectionReader& s) {
  ParallelConfig p;
  p.strategy = s.choice("strategy", kStrategies, p.strategy);
  p.segments = s.choice("segments", kSegmentModes, p.segments);
  // Fewer states than this cannot plan even the smallest model.
  p.search_budget = s.integer("search_budget", p.search_budget, IntRange::at_least(1000));
  s.finish();
  return p;
}

}  // namespace

std::string_view to_string(Strategy strategy) { return name_of(kStrategies, strategy); }
std::string_view to_string(Segments segments) { return name_of(kSegmentModes, segments); }
std::string_view to_string(ModelName name) { return name_of(kModelNames, name); }
std::string_view to_string(Optimizer optimizer) { return name_of(kOptimizers, optimizer); }

TrainRunConfig load_train_config(const std::string& path,
                                 const std::vector<ConfigOverride>& overrides) {
  Origin origin{.file = path, .overrides = {}};
  YAML::Node root = detail::parse_yaml_file(origin, "config file");
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
  SectionReader parallel = document.section("parallel", kParallelKeys, /*optional=*/true);
  config.parallel = read_parallel(parallel);
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
      {"parallel",
       {{"strategy", std::string(to_string(config.parallel.strategy))},
        {"segments", std::string(to_string(config.parallel.segments))},
        {"search_budget", config.parallel.search_budget}}},
  };
}

int report_current_exception(const char* prog) {
  try {
    throw;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: config error: %s\n", prog, e.what());
    return 2;
  } catch (const hap::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: error: out of memory (the model or the search is too large for this machine)\n",
                 prog);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", prog, e.what());
  }
  return 1;
}

}  // namespace hap::app
