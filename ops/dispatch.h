// Running an op: check the inputs, infer the outputs, run the device kernel, and let the
// recording hook (installed by autograd/) attach history.
#pragma once
#include <string>
#include <vector>

#include "ops/op.h"

namespace hap::ops {

std::vector<Tensor> call(OpKind kind, std::vector<Tensor> inputs, Attrs attrs = NoAttrs{});
// For ops with exactly one output.
Tensor call1(OpKind kind, std::vector<Tensor> inputs, Attrs attrs = NoAttrs{});

// Called after every op with its inputs and outputs. autograd/ installs one to record history;
// ops/ itself never records anything.
using RecordHook = void (*)(OpKind kind, const std::vector<Tensor>& inputs,
                            std::vector<Tensor>& outputs, const Attrs& attrs);
void set_record_hook(RecordHook hook);
RecordHook record_hook();  // the one installed now (null: none), for a hook that chains to it

// Whether this thread is inside an op that was given bf16 inputs and computes in f32 between
// casts (an op without a bf16 kernel for its device: the inputs are widened, the op runs in f32,
// its f32 outputs are rounded to bf16). Its kernels may then form f32 products in TF32 on a GPU
// (tensor cores; 10 mantissa bits, against bf16's 7 that the run keeps): the CUDA GEMMs and cuDNN
// convolutions inside such ops do. Plain f32 ops never do.
bool in_bf16_route();

// Such an op (above) is seen by the record hook once per kernel it runs (the casts and its f32
// kernel, each while in_route_scope()) and then once as itself, with its bf16 inputs and outputs,
// while recording_routed_call(): autograd records only that call, saving the bf16 inputs (not
// their f32 copies) and, where the op saves outputs, its f32 outputs before the rounding
// (routed_f32_outputs(), valid during that hook call); its backward runs in f32 on the widened
// tensors, as the casts' would. Hooks that want kernel calls only skip recording_routed_call().
// Mixed precision's casts of bf16 operands to f32 (Autocast::Float, and Promote where bf16 meets
// f32) are recorded the same way: the op once, as itself, with its bf16 operands (the casts are
// exact, so the widened operands are the f32 copies bit for bit).
bool in_route_scope();
bool recording_routed_call();
const std::vector<Tensor>& routed_f32_outputs();

// Tracing: while a TraceHook is installed on this thread, op calls run no kernel; their outputs
// are shape-only tensors from the op's inference, and the hook sees every call. synth/ uses it
// to capture a model's graph.
class TraceHook {
 public:
  virtual ~TraceHook() = default;
  virtual void on_call(OpKind kind, const std::vector<Tensor>& inputs,
                       const std::vector<Tensor>& outputs, const Attrs& attrs) = 0;
  // A module's state (a running statistic) is to become keep * state + take * value after the
  // forward (update_running_average in ops/functional.h).
  virtual void on_state_update(const Tensor& state, const Tensor& value, double keep,
                               double take) = 0;
};
class TraceGuard {
 public:
  explicit TraceGuard(TraceHook* hook);
  ~TraceGuard();
  TraceGuard(const TraceGuard&) = delete;
  TraceGuard& operator=(const TraceGuard&) = delete;

 private:
  TraceHook* prev_;
};
bool is_tracing();
// The installed hook (null when not tracing).
TraceHook* trace_hook();

// The module path of the code now running ("blocks.3.attn"), kept by ScopeGuard; recorded with
// each traced call so that graphs and error messages can name the module an op came from.
// A relative guard appends a part to the enclosing path; an absolute one (what nn::Module's
// layers enter) replaces it with a module's full path until it ends.
class ScopeGuard {
 public:
  enum Kind { kRelative, kAbsolute };
  explicit ScopeGuard(const std::string& name, Kind kind = kRelative);
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
};
std::string current_scope();

// Mixed precision on this thread: while an AutocastGuard with DType::BF16 is alive, each op's
// float inputs are cast as its OpDef::autocast says (differentiable casts, so gradients reach the
// f32 parameters in f32) before it runs or is traced. F32 turns it off (the default). The
// backward pass always runs with it off: backward ops see the dtypes the forward ops saw.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};
// DType::BF16 while mixed precision is on, else DType::F32.
DType autocast_dtype();

// Counts of op calls, for tests and profiling.
struct DispatchStats {
  std::array<uint64_t, kNumOps> calls{};
  std::array<double, kNumOps> kernel_s{};  // filled while profiling is on
  // The process's CPU time in CPU kernels while profiling is on: unlike the wall clock, it leaves
  // out the time a CPU quota throttles the process, which lands on whichever kernel runs then.
  std::array<double, kNumOps> kernel_cpu_s{};
};
const DispatchStats& dispatch_stats();
void reset_dispatch_stats();
// Times every kernel (wall clock, per op kind) into dispatch_stats().kernel_s, and a CPU
// kernel's CPU time into kernel_cpu_s.
void set_profiling(bool on);
// The CPU time of this process (all its threads), in seconds.
double process_cpu_s();
// The ops by kernel time, one per line: name, calls, seconds, share.
std::string profile_report(size_t top = 20);

// An emulated slower device (scripts/hap-emulate --throttle ops): every CPU kernel is made to
// take its CPU time divided by `speed` (in (0, 1]) of wall time, by sleeping after it. The sleeps
// are owed per kernel and paid once at least `kPayAtLeastS` is owed (what a sleep oversleeps is
// credited to the next kernels), so that short kernels are slowed on average without a sleep
// each; time spent outside kernels (waiting for a collective, say) earns no credit, unlike a CPU
// quota, under which a rank that waited runs its next kernels at full speed.
class EmulatedSpeed {
 public:
  static constexpr double kPayAtLeastS = 2e-4;
  explicit EmulatedSpeed(double speed);
  double speed() const { return speed_; }
  // After a kernel that used `cpu_s` of CPU time in `wall_s`: how long to sleep now (0: not
  // yet). Call paid() with what the sleep really took.
  double owe(double cpu_s, double wall_s);
  void paid(double slept_s) { debt_s_ -= slept_s; }
  double debt_s() const { return debt_s_; }

 private:
  double speed_;
  double debt_s_ = 0;
};
// The speed the process emulates: HAP_EMULATE_SPEED (read once; unset or 1: none, kernels run
// as they are). Out of (0, 1] is an error naming the variable.
double emulated_speed();

}  // namespace hap::ops
