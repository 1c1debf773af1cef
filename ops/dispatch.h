// Running an op: check the inputs, infer the outputs, run the device kernel, and let the
// recording hook (installed by autograd/) attach history.
#pragma once
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

// Counts of op calls, for tests and profiling.
struct DispatchStats {
  std::array<uint64_t, kNumOps> calls{};
};
const DispatchStats& dispatch_stats();
void reset_dispatch_stats();

}  // namespace hap::ops
