// Named tensors on disk in the ".hapt" format, shared with the PyTorch oracles
// (tests/oracle/hapt.py), and checkpoints built on it.
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

namespace hap {

namespace nn {
class Module;
}
namespace optim {
class Optimizer;
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes `tensors` (CPU, any layout) in order. The file is written to a temporary next to `path`
// and renamed over it, so an interrupted save leaves either the old file or the new one. Names
// must be non-empty and distinct.
void save_tensors(const std::string& path, const NamedTensors& tensors);

// Reads every tensor of a .hapt file, in file order, with its stored dtype. Throws hap::Error
// naming the file for a missing file, a bad magic or version, an unknown dtype code, a
// truncated file, duplicate names or trailing bytes.
NamedTensors load_tensors(const std::string& path);

// ---- checkpoints: logical (unsharded) tensors plus the counters needed to resume ----
// Entries: "model.<name>" for every parameter, "optim.<slot>.<name>" and "optim.step.<name>"
// (i64) for every parameter the optimizer holds, "meta.step" (i64, the caller's training step),
// "meta.random_seed" and "meta.random_step" (i64, the model's dropout seed and counter).
void save_checkpoint(const std::string& path, const nn::Module& model,
                     const optim::Optimizer* optimizer, int64_t step);

// Restores what save_checkpoint wrote into an existing model (and optimizer, if given) of the
// same structure: values are copied into the existing tensors (converting the dtype if needed),
// and the model's dropout seed and counter are restored (set_random_seed on `model`).
// Throws naming the first missing, unexpected or mis-shaped entry. Returns "meta.step".
int64_t load_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer* optimizer);

}  // namespace hap
