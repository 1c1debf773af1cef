#include "train/trainer.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/atomic_file.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif
#include "core/timeline.h"
#include "models/lr_schedule.h"
#include "models/serialize.h"
#include "ops/cpu/blas.h"
#include "parallel/mpi.h"
#include "train/engine.h"
#include "train/metrics_log.h"
#include "train/plan_io.h"
#include "train/timeline_file.h"
#include "train/trace.h"

namespace hap::train {

std::string summary_text(const TrainSummary& s) {
  char buf[160];
  std::string out = std::to_string(s.steps_run) + " steps";
  if (s.steps_run > 0) {
    std::snprintf(buf, sizeof buf, ", loss %.4f -> %.4f", s.first_loss, s.last_loss);
    out += buf;
  }
  if (s.last_val_loss >= 0) {
    std::snprintf(buf, sizeof buf, ", val loss %.4f", s.last_val_loss);
    out += buf;
  }
  if (s.steps_run > 0) {
    std::snprintf(buf, sizeof buf, ", median %.1f ms/step", s.median_step_ms);
    out += buf;
  }
  return out;
}

// The peak MFU is measured against when one process trains: the best of 5 square matrix
// products on the training device in the run's precision (bf16 operands under bf16 mixed
// precision), 512^3 on a CPU, 4096^3 on a GPU (large enough to fill it), after a warm-up.
struct GemmPeak {
  double flops_per_s = 0;
  std::string source;  // "a 4096^3 bf16 matrix product measured on cuda:0"
};

GemmPeak measured_gemm_peak(Device device, DType precision) {
  NoGradGuard no_grad;
  const int64_t n = device.is_cpu() ? 512 : 4096;
  const DType dtype = precision == DType::BF16 ? DType::BF16 : DType::F32;
  const TensorOptions o = TensorOptions{}.with_dtype(dtype).with_device(device);
  const Tensor a = Tensor::full({n, n}, 0.5, o), b = Tensor::full({n, n}, 0.25, o);
  auto product = [&] {
    Tensor c = ops::call1(ops::OpKind::MatMul, {a, b}, {});
    hap::synchronize(device);  // the kernel ran, not only launched
  };
  product();  // warm-up: libraries load, the GEMM heuristics choose
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    product();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return {best, detail::concat("a ", n, "^3 ", dtype_name(dtype), " matrix product measured on ",
                               device.str())};
}

// "1m05s", "2h03m", "12s".
std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", static_cast<long>(s / 3600),
                  static_cast<long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", static_cast<long>(s / 60),
                  static_cast<long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%lds", static_cast<long>(s));
  return buf;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::unique_ptr<optim::Optimizer> make_optimizer(
    const TrainConfig& t, const std::vector<std::pair<std::string, Tensor>>& named) {
  auto groups = optim::weight_decay_groups(named, t.weight_decay);
  if (t.optimizer == Optimizer::kSgd)
    return std::make_unique<optim::SGD>(groups,
                                        optim::SGDOptions{t.lr, t.momentum, t.weight_decay, false});
  return std::make_unique<optim::AdamW>(
      groups, optim::AdamWOptions{t.lr, {t.beta1, t.beta2}, t.eps, t.weight_decay});
}

int optimizer_state_slots(const TrainConfig& t) {
  return static_cast<int>(make_optimizer(t, {})->state_slots().size());
}

// One process trains on the CPU or on a GPU it sees: anything else is an error naming the device
// and why (no GPU visible, no such index, or no CUDA backend in this build).
void check_training_device(Device device) {
  if (device.is_cpu()) return;
  try {
    Tensor::empty({1}, TensorOptions{}.with_device(device));
  } catch (const Error& e) {
    HAP_CHECK(false, "train.device: ", e.what());
  }
}

// The GPU a rank trains on: with train.device=cuda:N, node-local rank k takes
// cuda:((N + k) mod the GPUs it sees), so ranks spread over a node's GPUs and share them when
// there are more ranks than GPUs (their collectives then go through the host).
int visible_gpus(Device device) {
#ifdef HAP_HAVE_CUDA
  return device.is_cuda() ? cuda::device_count() : 0;
#else
  (void)device;
  return 0;
#endif
}

bool gpu_cluster_emulated() {
  const char* sms = std::getenv("HAP_EMULATE_SMS");
  return sms != nullptr && *sms != '\0';
}

std::string gpu_sharing_error(int node_ranks, int visible, bool emulated, bool share_gpus) {
  if (visible == 0 || node_ranks <= visible || emulated || share_gpus) return "";
  return detail::concat(
      "train.device=cuda: ", node_ranks, " ranks on this node but ", visible,
      " GPU(s) visible: each rank of a cluster file stands for a GPU of its own, with the speed "
      "and memory the file gives it, and ranks sharing a GPU would get neither; run one rank per "
      "GPU, emulate a mixed GPU cluster on one GPU (scripts/hap-emulate with sm_count devices), "
      "or let ranks share GPUs anyway with parallel.share_gpus=true");
}

Device rank_device(Device device, const parallel::Communicator& comm) {
  const int local = comm.split_by_node().rank();
  const int visible = visible_gpus(device);
  if (visible == 0) return device;  // the device check names why
  return Device{device.kind, static_cast<int>((int64_t{device.index} + local) % visible)};
}

Trainer::Trainer(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data,
                 TrainConfig config)
    : model_(std::move(model)), data_(std::move(data)), config_(std::move(config)) {
  HAP_CHECK(model_ && data_, "Trainer: the model and the dataset must not be null");
  cpu::gemm_path();  // HAP_CPU_GEMM is checked before anything runs
  check_training_device(config_.device);
  // Every module draws dropout from one state the trainer steps (models/module.h).
  model_->set_random_seed(model_->random_seed());
  engine_ = make_local_engine(model_, data_, config_);
  optimizer_ = make_optimizer(config_, engine_->parameters());
  random_seed_ = model_->random_seed();
}

Trainer::Trainer(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data,
                 TrainConfig config, parallel::Communicator comm, DistributedOptions distributed)
    : model_(std::move(model)), data_(std::move(data)), config_(std::move(config)) {
  HAP_CHECK(model_ && data_, "Trainer: the model and the dataset must not be null");
  cpu::gemm_path();  // HAP_CPU_GEMM is checked before anything runs
  if (!config_.device.is_cpu()) {
    const std::string sharing =
        gpu_sharing_error(comm.split_by_node().size(), visible_gpus(config_.device),
                          gpu_cluster_emulated(), distributed.share_gpus);
    HAP_CHECK(sharing.empty(), sharing);
    config_.device = rank_device(config_.device, comm);
    check_training_device(config_.device);
  }
  // The planner's memory model counts this run's optimizer state.
  distributed.synthesis.optimizer_state_slots = optimizer_state_slots(config_);
  // Every module draws dropout from one state the trainer steps (models/module.h), traced at
  // step 0.
  model_->set_random_seed(model_->random_seed());
  collective_timeout_s_ = distributed.collective_timeout_s;
  engine_ = make_spmd_engine(model_, data_, config_, std::move(comm), std::move(distributed));
  optimizer_ = make_optimizer(config_, engine_->parameters());
  random_seed_ = model_->random_seed();
}

Trainer::~Trainer() = default;

bool Trainer::is_lead() const { return engine_->lead(); }
bool Trainer::left_out() const { return engine_->left_out(); }
int Trainer::world_size() const { return engine_->world_size(); }
const synth::DistributedProgram* Trainer::program() const { return engine_->program(); }
const synth::CostModel* Trainer::cost_model() const { return engine_->cost_model(); }

std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& [name, p] : engine_->parameters()) names.push_back(name);
  return names;
}

Tensor Trainer::parameter(const std::string& name) const {
  for (const auto& [n, p] : engine_->parameters())
    if (n == name) return engine_->logical(name, p);
  HAP_CHECK(false, "Trainer: the model has no parameter '", name, "'");
  return Tensor();
}

double Trainer::evaluate() {
  double sum = 0;
  for (int64_t b = 0; b < config_.eval_batches; ++b)
    sum += engine_->eval_loss(static_cast<uint64_t>(b), random_seed_);
  return sum / static_cast<double>(config_.eval_batches);
}

// Checkpoints hold logical (unsharded) tensors, so a run on any plan, cluster, or one process can
// resume them: "model.<name>", "optim.<slot>.<name>" and "optim.step.<name>" per parameter,
// "model.<name>" per buffer (running statistics), and
// the metadata models/serialize.h describes (what save_checkpoint writes for a model trained by
// hand, plus the data position, the config's digest and the plan's fingerprint).
void Trainer::save_checkpoint(const std::string& path, int64_t step) const {
  Checkpoint c;
  auto i64 = [](int64_t v) { return Tensor::from_vector(std::vector<int64_t>{v}, {}); };
  for (const auto& [name, p] : engine_->parameters())
    c.tensors.emplace_back("model." + name, engine_->logical(name, p));
  for (const auto& [name, b] : engine_->buffers()) c.tensors.emplace_back("model." + name, b);
  for (const auto& [name, p] : engine_->parameters()) {
    const optim::Optimizer::ParamState* st = optimizer_->state(p);
    HAP_ASSERT(st != nullptr, "parameter ", name, " is not in the optimizer");
    for (size_t s = 0; s < st->slots.size(); ++s)
      c.tensors.emplace_back("optim." + optimizer_->state_slots()[s] + "." + name,
                             engine_->logical(name, st->slots[s]));
    c.tensors.emplace_back("optim.step." + name, i64(st->step));
  }
  for (auto& [name, t] : c.tensors) t = t.to(Device::cpu());  // from a GPU: to the host
  c.step = step;
  c.random_seed = random_seed_;
  c.random_step = static_cast<uint64_t>(step);
  c.metadata = checkpoint_metadata_;
  c.metadata["examples_read"] = std::to_string(step * config_.batch_size);
  if (engine_->lead()) write_checkpoint(path, c);
  engine_->barrier();
}

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
// When the first stop request arrived (CLOCK_MONOTONIC, ns).
std::atomic<int64_t> g_stop_since_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free, "the signal handler needs it lock-free");

int64_t monotonic_ns() {  // async-signal-safe (clock_gettime)
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int signo) {
  const int64_t now = monotonic_ns();
  if (g_stop_signal != 0) {
    // The same request delivered again: `timeout` signals its child and then the child's
    // process group, a launcher may relay what the group got too.
    if (now - g_stop_since_ns.load() < kStopRepeatWindowNs) return;
    std::signal(signo, SIG_DFL);  // asked again: stop now
    std::raise(signo);
    return;
  }
  g_stop_since_ns.store(now);
  g_stop_signal = signo;
}

}  // namespace

void install_stop_signals() {
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) std::signal(s, on_stop_signal);
}
int stop_signal() { return static_cast<int>(g_stop_signal); }
void request_stop(int signo) {
  g_stop_since_ns.store(monotonic_ns());
  g_stop_signal = signo;
}

namespace {

// Steps of the periodic checkpoints in `dir`, ascending.
std::vector<std::pair<int64_t, std::string>> periodic_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::string ext = name.size() > 13 ? name.substr(13) : "";
    if (!e.is_regular_file() || name.rfind("step_", 0) != 0 ||
        (ext != ".safetensors" && ext != ".hapt") ||
        !std::all_of(name.begin() + 5, name.begin() + 13, ::isdigit))
      continue;
    found.emplace_back(std::stoll(name.substr(5, 8)), e.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

std::string checkpoint_file(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08ld.safetensors", static_cast<long>(step));
  return (std::filesystem::path(dir) / name).string();
}

std::string newest_checkpoint(const std::string& dir) {
  const auto found = periodic_checkpoints(dir);
  return found.empty() ? "" : found.back().second;
}

void Trainer::save_periodic_checkpoint(int64_t step) const {
  const std::string& dir = config_.checkpoint_dir;
  save_checkpoint(checkpoint_file(dir, step), step);
  if (!engine_->lead()) return;
  auto found = periodic_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(config_.keep_checkpoints) < found.size(); ++i) {
    std::error_code ec;  // one that cannot be removed stays: the run goes on
    if (!std::filesystem::remove(found[i].second, ec) && ec)
      std::fprintf(stderr, "hap-train: warning: cannot remove the old checkpoint %s: %s\n",
                   found[i].second.c_str(), ec.message().c_str());
  }
}

int64_t Trainer::load_checkpoint(const std::string& path) {
  const Checkpoint checkpoint = read_checkpoint(path);
  std::map<std::string, Tensor> by_name(checkpoint.tensors.begin(), checkpoint.tensors.end());
  std::set<std::string> used;
  auto take = [&](const std::string& n) {
    auto it = by_name.find(n);
    HAP_CHECK(it != by_name.end(), path, ": the checkpoint has no tensor '", n, "'");
    used.insert(n);
    return it->second;
  };
  // The model's own (logical, whole) shapes: on ranks a parameter's local part is a shard, and a
  // larger tensor would still have a slice of the right size.
  std::map<std::string, Shape> logical;
  for (const auto& [name, p] : model_->named_parameters()) logical[name] = p.shape();
  NoGradGuard no_grad;
  auto place = [&](const Tensor& local, const std::string& entry, const std::string& name) {
    const Tensor full = take(entry);
    HAP_CHECK(full.shape() == logical.at(name), path, ": '", entry, "' has shape ",
              shape_str(full.shape()), " but the model's is ", shape_str(logical.at(name)));
    HAP_CHECK(full.dtype() == local.dtype(), path, ": '", entry, "' is ", dtype_name(full.dtype()),
              " but the model's is ", dtype_name(local.dtype()));
    Tensor part = engine_->local_part(name, full, local.shape());
    HAP_CHECK(part.shape() == local.shape(), path, ": '", entry, "' has shape ",
              shape_str(full.shape()), ", which does not fit the model's parameter");
    local.copy_from(part);
  };
  for (const auto& [name, p] : engine_->parameters()) {
    place(p, "model." + name, name);
    optim::Optimizer::ParamState* st = optimizer_->state(p);
    for (size_t s = 0; s < st->slots.size(); ++s)
      place(st->slots[s], "optim." + optimizer_->state_slots()[s] + "." + name, name);
    st->step = i64_scalar_value(take("optim.step." + name), path, "optim.step." + name);
  }
  for (const auto& [name, b] : engine_->buffers()) {
    const Tensor full = take("model." + name);
    HAP_CHECK(full.shape() == b.shape() && full.dtype() == b.dtype(), path, ": 'model.", name,
              "' is ", full.str(), " but the model's buffer is ", b.str());
    b.copy_from(full);
  }
  random_seed_ = checkpoint.random_seed;
  const int64_t step = checkpoint.step;
  // A checkpoint of another model (a deeper one, say) holds tensors this one does not read.
  std::vector<std::string> unknown;
  for (const auto& [name, value] : by_name)
    if (!used.count(name)) unknown.push_back(name);
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 5; ++i) list += (i ? ", " : "") + unknown[i];
    HAP_CHECK(false, path, ": the checkpoint holds ", unknown.size(),
              " tensor(s) this model does not have (", list, unknown.size() > 5 ? ", ..." : "",
              "): it was written for another model");
  }
  HAP_CHECK(step >= 0 && step <= config_.steps, path, ": the checkpoint is at step ", step,
            ", past this run's train.steps = ", config_.steps,
            " (raise train.steps to train further)");
  return step;
}

std::map<std::string, std::string> Trainer::run_metadata(const nlohmann::json& run_config) const {
  auto digest = [](const std::string& text) {
    return crc32_hex(crc32_of(text.data(), text.size()));
  };
  std::string slots;
  for (const std::string& s : optimizer_->state_slots()) slots += (slots.empty() ? "" : ",") + s;
  std::map<std::string, std::string> meta = {
      {"model", model_->type_name()},
      {"model_digest", model_digest(model_->named_parameters())},
      {"optimizer", optimizer_->name()},
      {"optimizer_slots", slots},
      {"batch_size", std::to_string(config_.batch_size)},
      {"world_size", std::to_string(engine_->world_size())},
      {"config_digest", run_config.is_null() ? "none" : digest(run_config.dump())},
      {"plan_fingerprint", "one process"}};
  if (engine_->program())
    meta["plan_fingerprint"] =
        digest(
            plan_to_json(*engine_->cost_model(), *engine_->program()).at("instructions").dump()) +
        " (" + engine_->program()->strategy + ")";
  return meta;
}

// Rank 0 writes every rank's spans as one timeline file.
void Trainer::write_trace(const std::string& path, const std::vector<timeline::Span>& spans) const {
  const std::vector<std::string> events =
      engine_->gather_strings(timeline_events_json(spans, engine_->rank(), engine_->track_name()));
  if (engine_->lead()) write_timeline_file(path, events);
  engine_->barrier();
}

TrainSummary Trainer::fit(const FitOptions& options) {
  if (engine_->left_out()) {
    engine_->wait_for_the_others();
    return {};
  }
  using Clock = std::chrono::steady_clock;
  const TrainConfig& t = config_;
  const bool lead = engine_->lead();
  const bool print = lead && !options.quiet;
  int64_t start = 0;
  if (!t.checkpoint_dir.empty() && lead) {
    // Found now, not at the first checkpoint; and what a killed write left behind goes.
    std::error_code ec;
    std::filesystem::create_directories(t.checkpoint_dir, ec);
    HAP_CHECK(!ec, "train.checkpoint_dir: cannot create '", t.checkpoint_dir, "': ", ec.message());
    const std::string probe = checkpoint_file(t.checkpoint_dir, 0);
    const std::string reason = unwritable_reason(probe);
    HAP_CHECK(reason.empty(), "train.checkpoint_dir: cannot write '", probe, "': ", reason);
    for (const auto& e : std::filesystem::directory_iterator(t.checkpoint_dir, ec))
      if (e.path().filename().string().rfind("step_", 0) == 0 &&
          e.path().filename().string().find(kTemporaryInfix) != std::string::npos)
        std::filesystem::remove(e.path(), ec);
  }
  if (!options.resume_path.empty()) start = load_checkpoint(options.resume_path);
  checkpoint_metadata_ = run_metadata(options.run_config);

  JsonlLog log(lead ? t.log_file : "", /*append=*/start > 0);
  nlohmann::json config_record = {{"type", "config"},
                                  {"ranks", engine_->world_size()},
                                  {"start_step", start},
                                  {"data", data_->describe()}};
  int64_t num_parameters = 0;
  for (const auto& [name, p] : model_->named_parameters()) num_parameters += p.numel();
  config_record["parameters"] = num_parameters;
  if (!options.run_config.is_null()) config_record["config"] = options.run_config;
  if (const synth::DistributedProgram* plan = engine_->program())
    config_record["plan"] = plan_to_json(*engine_->cost_model(), *plan);
  // MFU: the model's FLOPs per step (forward + backward = 3 x the traced forward's) per second,
  // over the peak: the cluster file's FLOP/s of every device on ranks, the measured matrix
  // product rate on one process.
  double step_flops = 0, peak_flops = 0;
  std::string peak_source;
  if (const synth::CostModel* cm = engine_->cost_model()) {
    step_flops = 3.0 * cm->graph().total_flops();
    for (const synth::Device& d : cm->cluster().devices) peak_flops += d.flops_per_s;
    peak_source = "the cluster file's FLOP/s";
  } else {
    step_flops = 3.0 * trace_model(*model_, t.batch_size, t.precision).total_flops();
    const GemmPeak peak = measured_gemm_peak(config_.device, t.precision);
    peak_flops = peak.flops_per_s;
    peak_source = peak.source;
  }
  config_record["placement"] = engine_->placement();
  const std::string cpu_gemm = config_.device.is_cpu() ? cpu::gemm_description() : "";
  if (!cpu_gemm.empty()) config_record["cpu_gemm"] = cpu_gemm;
  config_record["flops_per_step"] = step_flops;
  config_record["peak_flops_per_s"] = peak_flops;
  log.write(config_record);
  if (print) {
    std::printf("hap-train: %s with %ld parameters; %s\n", model_->type_name().c_str(),
                static_cast<long>(num_parameters), data_->describe().c_str());
    std::printf("hap-train: training on %s\n", engine_->placement().c_str());
    if (!cpu_gemm.empty()) std::printf("hap-train: %s\n", cpu_gemm.c_str());
    std::printf("hap-train: %.3g GFLOP per step; MFU against %.3g GFLOP/s (%s)\n", step_flops / 1e9,
                peak_flops / 1e9, peak_source.c_str());
    std::fflush(stdout);
  }

  optim::WarmupCosineSchedule schedule{t.lr, t.min_lr, t.warmup_steps, t.steps};
  TrainSummary summary;
  std::vector<double> step_ms;
  double window_ms = 0, window_loss = 0;  // since the last progress line
  int64_t window_steps = 0;
  const double tokens_per_step = static_cast<double>(t.batch_size * model_->tokens_per_example());
  bool mfu_warned = false;
  const int64_t end = options.stop_after >= 0 ? std::min(t.steps, options.stop_after) : t.steps;
  double profiled_s = 0;  // wall time of the profiled steps (the first is warm-up)
  int64_t profiled_steps = 0;
  // --trace: [trace_begin, trace_end) of this run's steps; by default the second (the first also
  // warms up).
  int64_t trace_begin = -1, trace_end = -1;
  bool tracing = false;
  if (!options.trace_path.empty()) {
    trace_begin = options.trace_first >= 0 ? options.trace_first : std::min(start + 1, end - 1);
    trace_end = (options.trace_last >= 0 ? options.trace_last : trace_begin) + 1;
    HAP_CHECK(trace_begin < trace_end, "--trace-steps: the last step traced (", trace_end,
              ") is before the first (", trace_begin + 1, ")");
    HAP_CHECK(trace_begin >= start && trace_begin < end, "--trace-steps: step ", trace_begin + 1,
              " is not run (this run runs steps ", start + 1, " to ", end, ")");
  }
  for (int64_t step = start; step < end; ++step) {
    if (options.profile && step == start + 1) engine_->start_profile();
    if (step == trace_begin) {
      engine_->barrier();  // every rank's time counts from the same moment
      timeline::start();
      tracing = true;
    }
    std::optional<timeline::Scope> step_span;
    if (timeline::recording()) step_span.emplace("step", "step " + std::to_string(step + 1));
    // The watchdog (on ranks): the first step also warms up, and gets 4 times as long.
    parallel::set_current_step(step);
    parallel::set_collective_timeout(collective_timeout_s_ * (step == start ? 4 : 1));
    const auto t0 = Clock::now();
    const double lr = schedule.at(step);
    optimizer_->set_lr(lr);
    std::optional<timeline::Scope> phase;
    phase.emplace("phase", "forward");
    const double loss = engine_->forward(static_cast<uint64_t>(step), random_seed_);
    phase.emplace("phase", "backward");
    HAP_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step,
              " (lower train.lr, or enable train.grad_clip)");
    optimizer_->zero_grad();
    engine_->backward();
    phase.emplace("phase", "grad_norm");
    const double norm = engine_->grad_norm();
    HAP_CHECK(std::isfinite(norm), "training diverged: the gradient norm is ", norm, " at step ",
              step);
    // torch.nn.utils.clip_grad_norm_'s rule; the optimizer multiplies each gradient as it reads it.
    const double clip = t.grad_clip > 0 ? t.grad_clip / (norm + 1e-6) : 1.0;
    phase.emplace("phase", "update");
    engine_->update(*optimizer_, clip < 1 ? clip : 1.0);
    phase.reset();
    step_span.reset();
    // The slowest rank sets the pace: a step takes its time.
    const double ms = engine_->max_over_ranks(
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    step_ms.push_back(ms);
    if (tracing && (step + 1 == trace_end || step + 1 == end)) {
      tracing = false;
      write_trace(options.trace_path, timeline::stop());
    }
    if (options.profile && step > start) {
      profiled_s += ms / 1e3;
      ++profiled_steps;
    }
    if (summary.steps_run == 0) summary.first_loss = loss;
    summary.last_loss = loss;
    ++summary.steps_run;
    window_ms += ms;
    window_loss += loss;
    ++window_steps;

    const bool last = step + 1 == end;
    if ((step + 1) % t.log_every == 0 || last) {
      // Time and loss averaged over the steps since the last line.
      const double avg_ms = window_ms / static_cast<double>(window_steps);
      const double examples_s = static_cast<double>(t.batch_size) / (avg_ms / 1000.0);
      nlohmann::json record = {{"type", "train"},
                               {"step", step + 1},
                               {"loss", loss},
                               {"avg_loss", window_loss / static_cast<double>(window_steps)},
                               {"lr", lr},
                               {"grad_norm", norm},
                               {"ms_per_step", avg_ms},
                               {"examples_per_s", examples_s}};
      if (tokens_per_step > 0) record["tokens_per_s"] = tokens_per_step / (avg_ms / 1000.0);
      const double mfu = peak_flops > 0 ? step_flops / (avg_ms / 1000.0) / peak_flops : 0.0;
      // Time left at the median pace so far.
      const double left_s = static_cast<double>(end - step - 1) * median_of(step_ms) / 1000.0;
      record["mfu"] = mfu;
      record["time_left_s"] = left_s;
      log.write(record);
      if (print) {
        std::printf("step %6ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %8.1f ms/step | ",
                    static_cast<long>(step + 1), static_cast<long>(t.steps), loss, lr, norm,
                    avg_ms);
        if (tokens_per_step > 0)
          std::printf("%9.0f tok/s", tokens_per_step / (avg_ms / 1000.0));
        else
          std::printf("%9.1f ex/s", examples_s);
        std::printf(" | MFU %5.1f%% | %s left\n", 100.0 * mfu, duration_text(left_s).c_str());
        if (mfu > 1.0 && !mfu_warned) {
          // Effective figures from an older profile, or a peak measured while the machine was busy.
          std::printf(
              "hap-train: note: MFU above 100%%: the peak (%s, %.3g GFLOP/s) is below what "
              "the devices reach now%s\n",
              peak_source.c_str(), peak_flops / 1e9,
              engine_->cost_model() ? "; re-measure the cluster with hap-profile" : "");
          mfu_warned = true;
        }
        std::fflush(stdout);
      }
      window_ms = window_loss = 0;
      window_steps = 0;
    }
    // A stop request on any rank stops every rank here, after the same step.
    if (const int signo = static_cast<int>(engine_->max_over_ranks(stop_signal())); signo > 0) {
      std::string saved = "no checkpoint (set train.checkpoint_dir or --save to keep the run)";
      if (!t.checkpoint_dir.empty()) {
        save_periodic_checkpoint(step + 1);
        saved = "checkpoint " + checkpoint_file(t.checkpoint_dir, step + 1);
      } else if (!options.checkpoint_path.empty()) {
        save_checkpoint(options.checkpoint_path, step + 1);
        saved = "checkpoint " + options.checkpoint_path;
      }
      log.write({{"type", "stopped"}, {"step", step + 1}, {"signal", signo}});
      engine_->finish();
      throw StopRequested("stopped by signal " + std::to_string(signo) + " (" + strsignal(signo) +
                              ") after step " + std::to_string(step + 1) + "; " + saved,
                          signo);
    }
    if (t.checkpoint_every > 0 && (step + 1) % t.checkpoint_every == 0 && !last)
      save_periodic_checkpoint(step + 1);
    if ((step + 1) % t.eval_every == 0 || last) {
      if (options.profile && last) engine_->print_profile(profiled_s, profiled_steps);
      summary.last_val_loss = evaluate();
      log.write({{"type", "eval"}, {"step", step + 1}, {"val_loss", summary.last_val_loss}});
      if (print) {
        std::printf("step %6ld/%ld | val loss %.4f\n", static_cast<long>(step + 1),
                    static_cast<long>(t.steps), summary.last_val_loss);
        std::fflush(stdout);
      }
    }
  }
  summary.median_step_ms = median_of(step_ms);
  if (!t.checkpoint_dir.empty() && end > start) save_periodic_checkpoint(end);
  if (!options.checkpoint_path.empty()) save_checkpoint(options.checkpoint_path, end);
  log.write({{"type", "done"},
             {"steps", summary.steps_run},
             {"first_loss", summary.first_loss},
             {"last_loss", summary.last_loss},
             {"last_val_loss", summary.last_val_loss},
             {"median_ms_per_step", summary.median_step_ms}});
  engine_->finish();
  return summary;
}

}  // namespace hap::train
