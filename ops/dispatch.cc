#include "ops/dispatch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <thread>

#include "core/allocator.h"
#include "core/timeline.h"

namespace hap::ops {

namespace {
RecordHook g_record_hook = nullptr;
DispatchStats g_stats;
bool g_profiling = false;
thread_local TraceHook* t_trace = nullptr;
struct ScopePart {
  std::string name;
  bool absolute;
};
thread_local std::vector<ScopePart> t_scope;

thread_local DType t_autocast = DType::F32;
thread_local bool t_bf16_route = false;
thread_local bool t_route_scope = false;
thread_local const std::vector<Tensor>* t_routed_outputs = nullptr;

// Gives a thread-local a value for a scope and restores it after.
template <typename T>
struct Scoped {
  T& var;
  T previous;
  Scoped(T& v, T value) : var(v), previous(v) { var = value; }
  ~Scoped() { var = previous; }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;
};

// Whether mixed precision casts this op's bf16 operands to f32: a Float op's always, a Promote
// op's where bf16 meets f32 (inputs holding f32 statistics aside).
bool widens_bf16(const OpDef& def, const std::vector<Tensor>& inputs) {
  if (def.autocast != Autocast::Float && def.autocast != Autocast::Promote) return false;
  bool bf = false, f32 = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || (def.f32_stat_inputs & (1u << i))) continue;
    bf = bf || inputs[i].dtype() == DType::BF16;
    f32 = f32 || inputs[i].dtype() == DType::F32;
  }
  return bf && (def.autocast == Autocast::Float || f32);
}

// The casts mixed precision makes before an op runs (OpDef::autocast).
// Inputs holding f32 statistics (OpDef::f32_stat_inputs) are left as they are.
void apply_autocast(const OpDef& def, std::vector<Tensor>& inputs) {
  auto operand = [&](size_t i) {
    return inputs[i].defined() && !(def.f32_stat_inputs & (1u << i));
  };
  auto cast_all = [&](DType from, DType to) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (operand(i) && inputs[i].dtype() == from)
        inputs[i] = call1(OpKind::Cast, {inputs[i]}, CastAttrs{to});
  };
  switch (def.autocast) {
    case Autocast::Keep:
      return;
    case Autocast::Lower:
      cast_all(DType::F32, DType::BF16);
      return;
    case Autocast::Float:
    case Autocast::Promote:
      if (widens_bf16(def, inputs)) cast_all(DType::BF16, DType::F32);
      return;
  }
}

bool needs_f32_compute(OpKind kind, const std::vector<Tensor>& inputs, const Attrs& attrs,
                       Device device) {
  const OpDef& def = op_def(kind);
  if (def.moves_data) return false;
  const Tensor* bf = nullptr;
  const Tensor* other = nullptr;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !is_floating(t.dtype())) continue;
    if ((def.f32_stat_inputs & (1u << i)) && t.dtype() == DType::F32) continue;
    (t.dtype() == DType::BF16 ? bf : other) = &t;
  }
  // Mixing bf16 with another float type would silently round the other operand's result to
  // bf16: ask for an explicit cast instead, as for any other dtype mismatch.
  HAP_CHECK(!(bf && other), "op ", op_def(kind).name, ": inputs mix bf16 and ",
            other ? dtype_name(other->dtype()) : "", " (", bf ? bf->str() : "", " and ",
            other ? other->str() : "", "); cast one of them first");
  if (bf == nullptr) return false;
  // A traced graph is the same whatever device traced it (a plan file made on a CPU serves GPU
  // ranks): under tracing, ops take bf16 themselves only where the CPU's kernel does, and the
  // others' casts become nodes, which the executor runs on any device.
  if (device.is_cpu() || t_trace) return !def.cpu_bf16;
  return !(def.cuda_bf16 &&
           (def.cuda_bf16_accepts == nullptr || def.cuda_bf16_accepts(inputs, attrs)));
}

// The op's output metas for these inputs (an error names the module running it).
Metas infer_outputs(const OpDef& def, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  Metas in_meta;
  in_meta.reserve(inputs.size());
  for (const Tensor& t : inputs)
    in_meta.push_back(t.defined() ? TensorMeta{t.shape(), t.dtype(), true}
                                  : TensorMeta{{}, DType::F32, false});
  try {
    return def.infer(in_meta, attrs);
  } catch (const Error& e) {
    std::string scope = current_scope();
    if (scope.empty()) throw;
    throw Error(std::string(e.what()) + " (in module '" + scope + "')");
  }
}
}  // namespace

void set_record_hook(RecordHook hook) { g_record_hook = hook; }
RecordHook record_hook() { return g_record_hook; }
bool in_bf16_route() { return t_bf16_route; }
bool in_route_scope() { return t_route_scope; }
bool recording_routed_call() { return t_routed_outputs != nullptr; }
const std::vector<Tensor>& routed_f32_outputs() {
  HAP_CHECK(t_routed_outputs != nullptr,
            "routed_f32_outputs: called outside the record hook's call for a routed op");
  return *t_routed_outputs;
}

AutocastGuard::AutocastGuard(DType dtype) : prev_(t_autocast) {
  HAP_CHECK(dtype == DType::F32 || dtype == DType::BF16,
            "mixed precision: expected f32 (off) or bf16, got ", dtype_name(dtype));
  t_autocast = dtype;
}
AutocastGuard::~AutocastGuard() { t_autocast = prev_; }
DType autocast_dtype() { return t_autocast; }

TraceGuard::TraceGuard(TraceHook* hook) : prev_(t_trace) { t_trace = hook; }
TraceGuard::~TraceGuard() { t_trace = prev_; }
bool is_tracing() { return t_trace != nullptr; }
TraceHook* trace_hook() { return t_trace; }

ScopeGuard::ScopeGuard(const std::string& name, Kind kind) {
  t_scope.push_back({name, kind == kAbsolute});
}
ScopeGuard::~ScopeGuard() { t_scope.pop_back(); }
std::string current_scope() {
  size_t first = 0;
  for (size_t i = t_scope.size(); i-- > 0;)
    if (t_scope[i].absolute) {
      first = i;
      break;
    }
  std::string s;
  for (size_t i = first; i < t_scope.size(); ++i) {
    if (t_scope[i].name.empty()) continue;
    if (!s.empty()) s += '.';
    s += t_scope[i].name;
  }
  return s;
}
const DispatchStats& dispatch_stats() { return g_stats; }
void reset_dispatch_stats() { g_stats = DispatchStats{}; }
void set_profiling(bool on) { g_profiling = on; }

EmulatedSpeed::EmulatedSpeed(double speed) : speed_(speed) {
  HAP_CHECK(speed > 0 && speed <= 1, "emulated speed ", speed, " is not in (0, 1]");
}

double EmulatedSpeed::owe(double cpu_s, double wall_s) {
  debt_s_ += std::max(0.0, cpu_s) / speed_ - std::max(0.0, wall_s);
  // (A kernel slowed by other processes past its emulated time owes nothing and earns at most
  // kPayAtLeastS of credit: time lost to them is not made up later.)
  if (debt_s_ < -kPayAtLeastS) debt_s_ = -kPayAtLeastS;
  return debt_s_ >= kPayAtLeastS ? debt_s_ : 0.0;
}

double emulated_speed() {
  static const double speed = [] {
    const char* v = std::getenv("HAP_EMULATE_SPEED");
    if (v == nullptr || *v == '\0') return 1.0;
    char* end = nullptr;
    const double x = std::strtod(v, &end);
    HAP_CHECK(end != v && *end == '\0' && x > 0 && x <= 1, "HAP_EMULATE_SPEED='", v,
              "': expected a number in (0, 1], the share of full speed this process emulates");
    return x;
  }();
  return speed;
}

namespace {
double clock_s(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double thread_cpu_s() { return clock_s(CLOCK_THREAD_CPUTIME_ID); }
}  // namespace

double process_cpu_s() { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

std::string profile_report(size_t top) {
  std::vector<size_t> order;
  double total = 0;
  for (size_t i = 0; i < kNumOps; ++i) {
    total += g_stats.kernel_s[i];
    if (g_stats.calls[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [](size_t a, size_t b) { return g_stats.kernel_s[a] > g_stats.kernel_s[b]; });
  std::string out;
  char line[160];
  for (size_t j = 0; j < order.size() && j < top; ++j) {
    size_t i = order[j];
    std::snprintf(line, sizeof(line), "  %-22s %8llu calls %10.3f s %6.1f%%\n",
                  op_name(static_cast<OpKind>(i)),
                  static_cast<unsigned long long>(g_stats.calls[i]), g_stats.kernel_s[i],
                  total > 0 ? 100.0 * g_stats.kernel_s[i] / total : 0.0);
    out += line;
  }
  return out;
}

Tensor KernelContext::alloc(size_t i) const {
  HAP_ASSERT(i < out_meta.size());
  Device dev = inputs.empty() ? Device::cpu() : inputs[0].device();
  return Tensor::empty(out_meta[i].shape,
                       TensorOptions{}.with_dtype(out_meta[i].dtype).with_device(dev));
}

std::vector<Tensor> call(OpKind kind, std::vector<Tensor> inputs, Attrs attrs) {
  const OpDef& def = op_def(kind);
  if (def.num_inputs >= 0) {
    HAP_CHECK(static_cast<int>(inputs.size()) == def.num_inputs, "op ", def.name, ": expected ",
              def.num_inputs, " inputs, got ", inputs.size());
  } else {
    HAP_CHECK(!inputs.empty(), "op ", def.name, ": expected at least one input");
  }
  Device device = Device::cpu();
  bool have_device = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      HAP_CHECK(def.optional_inputs & (1u << i), "op ", def.name, ": input ", i,
                " is an undefined tensor");
      continue;
    }
    if (!have_device) {
      device = inputs[i].device();
      have_device = true;
    }
    HAP_CHECK(inputs[i].device() == device, "op ", def.name, ": input ", i, " is on ",
              inputs[i].device().str(), " but input 0 is on ", device.str());
  }

  if (t_autocast == DType::BF16) {
    // Float ops (and Promote ones where bf16 meets f32) take f32 copies of bf16 operands. The
    // casts are exact, so autograd records the op once, as itself, keeping the bf16 operands
    // (half the bytes) and widening them in backward, as for a routed op below.
    if (widens_bf16(def, inputs)) {
      const std::vector<Tensor> given = inputs;
      std::vector<Tensor> outs;
      {
        Scoped<bool> scope(t_route_scope, true);
        apply_autocast(def, inputs);
        outs = call(kind, std::move(inputs), attrs);
      }
      if (g_record_hook && !t_trace && !t_route_scope) {
        Scoped<const std::vector<Tensor>*> routed(t_routed_outputs, &outs);
        g_record_hook(kind, given, outs, attrs);
      }
      return outs;
    }
    apply_autocast(def, inputs);
  }

  // bf16 is a storage type: compute in f32 through differentiable casts, then cast back the
  // outputs that inference gives as bf16 (statistics, such as attention's log-sum-exp, stay f32).
  if (needs_f32_compute(kind, inputs, attrs, device)) {
    const Metas want = infer_outputs(def, inputs, attrs);
    const std::vector<Tensor> given = inputs;
    std::vector<Tensor> inner, outs;
    {
      Scoped<bool> scope(t_route_scope, true);  // autograd records the op once, below
      for (Tensor& t : inputs)
        if (t.defined() && t.dtype() == DType::BF16)
          t = call1(OpKind::Cast, {t}, CastAttrs{DType::F32});
      {
        AutocastGuard as_cast(DType::F32);       // the op itself, on the f32 copies
        Scoped<bool> route(t_bf16_route, true);  // the op's own kernels, not the casts
        inner = call(kind, std::move(inputs), attrs);
      }
      HAP_ASSERT(want.size() == inner.size());
      outs = inner;
      for (size_t i = 0; i < outs.size(); ++i)
        if (outs[i].dtype() == DType::F32 && want[i].dtype == DType::BF16)
          outs[i] = call1(OpKind::Cast, {outs[i]}, CastAttrs{DType::BF16});
    }
    if (g_record_hook && !t_trace && !t_route_scope) {
      Scoped<const std::vector<Tensor>*> routed(t_routed_outputs, &inner);
      g_record_hook(kind, given, outs, attrs);
    }
    return outs;
  }

  const Metas out_meta = infer_outputs(def, inputs, attrs);

  if (t_trace) {
    std::vector<Tensor> outputs;
    for (const TensorMeta& m : out_meta) outputs.push_back(Tensor::meta(m.shape, m.dtype, device));
    t_trace->on_call(kind, inputs, outputs, attrs);
    return outputs;
  }

  KernelFn kernel = device.is_cpu() || def.any_device ? def.cpu : def.cuda;
  HAP_CHECK(kernel != nullptr, "op ", def.name, " has no kernel for device ", device.str());
  KernelContext ctx{kind, inputs, out_meta, attrs};
  std::optional<timeline::Scope> span;  // in --trace timelines: the kernel and its module
  if (timeline::recording()) span.emplace("op", def.name, current_scope());
  // A GPU's kernels run after their launch: profiling waits for the device around each op.
  auto wait_for_device = [&] {
    if (g_profiling) hap::synchronize(device);
  };
  wait_for_device();
  // An emulated slower device (HAP_EMULATE_SPEED): its CPU kernels slowed to that speed.
  static thread_local std::optional<EmulatedSpeed> emulated;
  const bool slowed = device.is_cpu() && emulated_speed() < 1;
  if (slowed && !emulated) emulated.emplace(emulated_speed());
  const double cpu0 = slowed ? thread_cpu_s() : 0;
  const auto w0 =
      slowed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  auto t0 =
      g_profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  const bool cpu_profiled = g_profiling && device.is_cpu();
  const double process0 = cpu_profiled ? process_cpu_s() : 0;
  std::vector<Tensor> outputs = kernel(ctx);
  wait_for_device();
  if (slowed) {
    const auto w1 = std::chrono::steady_clock::now();
    const double sleep_s =
        emulated->owe(thread_cpu_s() - cpu0, std::chrono::duration<double>(w1 - w0).count());
    if (sleep_s > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
      emulated->paid(std::chrono::duration<double>(std::chrono::steady_clock::now() - w1).count());
    }
  }
  span.reset();
  if (g_profiling)
    g_stats.kernel_s[static_cast<size_t>(kind)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cpu_profiled) g_stats.kernel_cpu_s[static_cast<size_t>(kind)] += process_cpu_s() - process0;
  HAP_ASSERT(outputs.size() == out_meta.size(), "op ", def.name, " kernel returned ",
             outputs.size(), " outputs, inferred ", out_meta.size());
  // History is attached to outputs, so an output must never be an input's own impl.
  for (Tensor& out : outputs)
    for (const Tensor& in : inputs)
      if (out.same(in)) out = out.detach();
  ++g_stats.calls[static_cast<size_t>(kind)];
  if (g_record_hook) g_record_hook(kind, inputs, outputs, attrs);
  return outputs;
}

Tensor call1(OpKind kind, std::vector<Tensor> inputs, Attrs attrs) {
  std::vector<Tensor> outs = call(kind, std::move(inputs), std::move(attrs));
  HAP_ASSERT(outs.size() == 1, "op ", op_name(kind), " returned ", outs.size(), " outputs");
  return outs[0];
}

}  // namespace hap::ops
