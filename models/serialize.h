// Named tensors on disk in the ".hapt" format, shared with the PyTorch oracles
// (tests/oracle/hapt.py), and checkpoints (in the safetensors format, models/safetensors.h; the
// .hapt checkpoints of earlier versions stay readable).
//
// Layout (integers little-endian): "HAPT", u32 version (1), u32 tensor count, then per tensor:
// u32 name length, name bytes (UTF-8), u8 dtype code (0 f32, 1 bf16 (upper half of an f32),
// 2 f64, 3 i64, 4 u8), u32 ndim, ndim x i64 dims, raw row-major data. A scalar has ndim 0.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/safetensors.h"

namespace hap {

namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}

// Writes `tensors` (CPU, any layout) in order. The file is written to a temporary next to `path`
// and renamed over it, so an interrupted save leaves either the old file or the new one. Names
// must be non-empty and distinct.
void save_tensors(const std::string& path, const NamedTensors& tensors);

// Reads every tensor of a .hapt file, in file order, with its stored dtype. Throws hap::Error
// naming the file for a missing file, a bad magic or version, an unknown dtype code, a
// truncated file, duplicate names or trailing bytes.
NamedTensors load_tensors(const std::string& path);

// ---- checkpoints: logical (unsharded) tensors plus the counters needed to resume ----
// Tensors: "model.<name>" for every parameter and buffer, "optim.<slot>.<name>" and
// "optim.step.<name>" (i64 scalar) for every parameter the optimizer holds. Metadata
// ("__metadata__", strings): "format" (kCheckpointFormat), "step" (the caller's training step),
// "random_seed" and "random_step" (the model's dropout seed and counter), "model" and
// "model_digest" (its type and a CRC-32 of its parameters' names, shapes and dtypes), "optimizer"
// and "optimizer_slots"; a trainer adds "examples_read", "config_digest" and "plan_fingerprint".
inline constexpr const char* kCheckpointFormat = "hap-checkpoint-v2";

struct Checkpoint {
  NamedTensors tensors;
  int64_t step = 0;
  uint64_t random_seed = 0;
  uint64_t random_step = 0;
  TensorMetadata metadata;  // everything, including the fields above as decimal strings
};

// Writes `c` as a safetensors file (atomically, with checksums); "format", "step",
// "random_seed" and "random_step" in the metadata are set from the fields.
void write_checkpoint(const std::string& path, const Checkpoint& c);
// Reads a checkpoint: a safetensors file write_checkpoint wrote (checksums verified), or a .hapt
// checkpoint of HAP's first format ("meta.step", "meta.random_seed", "meta.random_step" tensors).
// Throws naming the file for anything else. Tensors of an older layout are read in the current
// one (attention's "*attn.qkv.weight" [3C, C] as [3, C, C], "*attn.qkv.bias" [3C] as [3, C]).
Checkpoint read_checkpoint(const std::string& path);
// The same, with every tensor as the file holds it.
Checkpoint read_checkpoint_as_written(const std::string& path);

// The value of an i64 scalar entry `name` of a checkpoint, exactly; throws naming `path` and
// `name` for anything else.
int64_t i64_scalar_value(const Tensor& t, const std::string& path, const std::string& name);

// "model_digest": a CRC-32 (hex) of the parameters' names, shapes and dtypes.
std::string model_digest(const std::vector<std::pair<std::string, Tensor>>& named_parameters);

// A checkpoint of a model trained by hand (with its optimizer, if given) at `step`: its
// parameters and buffers as "model.<name>".
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, int64_t step);

// Restores what save_checkpoint wrote into an existing model (and optimizer, if given) of the
// same structure: values are copied into the existing tensors (converting the dtype if needed),
// and the model's dropout seed and counter are restored (set_random_seed on `model`).
// Throws naming the first missing, unexpected or mis-shaped entry. Returns the step.
int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer);

}  // namespace hap
