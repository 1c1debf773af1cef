#include "ops/dispatch.h"

namespace hap::ops {

namespace {
RecordHook g_record_hook = nullptr;
DispatchStats g_stats;

bool needs_f32_compute(OpKind kind, const std::vector<Tensor>& inputs) {
  if (kind == OpKind::Cast) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.dtype() == DType::BF16) return true;
  return false;
}
}  // namespace

void set_record_hook(RecordHook hook) { g_record_hook = hook; }
const DispatchStats& dispatch_stats() { return g_stats; }
void reset_dispatch_stats() { g_stats = DispatchStats{}; }

Tensor KernelContext::alloc(size_t i) const {
  HAP_ASSERT(i < out_meta.size());
  Device dev = inputs.empty() ? Device::cpu() : inputs[0].device();
  return Tensor::empty(out_meta[i].shape, TensorOptions{}.with_dtype(out_meta[i].dtype).with_device(dev));
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

  // bf16 is a storage type: compute in f32 through differentiable casts, then cast back.
  if (needs_f32_compute(kind, inputs)) {
    for (Tensor& t : inputs)
      if (t.defined() && t.dtype() == DType::BF16) t = call1(OpKind::Cast, {t}, CastAttrs{DType::F32});
    std::vector<Tensor> outs = call(kind, std::move(inputs), attrs);
    for (Tensor& t : outs)
      if (t.dtype() == DType::F32) t = call1(OpKind::Cast, {t}, CastAttrs{DType::BF16});
    return outs;
  }

  Metas in_meta;
  in_meta.reserve(inputs.size());
  for (const Tensor& t : inputs)
    in_meta.push_back(t.defined() ? TensorMeta{t.shape(), t.dtype(), true} : TensorMeta{{}, DType::F32, false});
  Metas out_meta = def.infer(in_meta, attrs);

  KernelFn kernel = device.is_cpu() ? def.cpu : def.cuda;
  HAP_CHECK(kernel != nullptr, "op ", def.name, " has no kernel for device ", device.str());
  KernelContext ctx{kind, inputs, out_meta, attrs};
  std::vector<Tensor> outputs = kernel(ctx);
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
