// Typed attributes of ops. One struct per family of ops; an op's call carries exactly one of them.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/shape.h"

namespace hap::ops {

struct NoAttrs {};
struct ScalarAttrs {  // AddScalar, MulScalar, PowScalar, MaskedFill
  double value = 0;
};
enum class GeluApprox : uint8_t { None, Tanh };
struct GeluAttrs {
  GeluApprox approx = GeluApprox::Tanh;
};
struct DimAttrs {  // Softmax, LogSoftmax, Concat, Argmax
  int64_t dim = -1;
  bool keepdim = false;
};
struct ReduceAttrs {  // Sum, Mean, Max; empty dims = all dims
  std::vector<int64_t> dims;
  bool keepdim = false;
};
struct NormAttrs {  // LayerNorm, RmsNorm (normalised over the last dim)
  double eps = 1e-5;
};
// Random ops draw from the counter-based generator. `slice` says which part of the logical tensor
// the local tensor is, so that a shard draws exactly its slice of the single-device mask.
struct RandomAttrs {
  double p = 0;  // dropout probability
  uint64_t seed = 0;
  uint64_t stream = 0;
  LogicalSlice slice;
};
// MaskTokens: BERT's masked-language-model corruption of token ids. Each logical position is
// chosen with probability p; a chosen id becomes mask_id (80%), a token drawn uniformly from
// [0, vocab) (10%) or stays itself (10%). With `targets` the op gives the original id at chosen
// positions and ignore_index elsewhere, so the two calls with the same (seed, stream) pair up.
// The draws for logical element i depend only on (seed, stream, i), so shards draw their slice.
struct MaskTokensAttrs {
  double p = 0.15;
  int64_t mask_id = 0;
  int64_t vocab = 1;
  int64_t ignore_index = -100;
  bool targets = false;
  uint64_t seed = 0;
  uint64_t stream = 0;
  LogicalSlice slice;
};
// MoeDispatch, MoeCombine, MoeGateGrad (ops/defs/moe.cc): the number of experts and the slots
// each expert has per routing group.
struct MoeAttrs {
  int64_t experts = 1;
  int64_t capacity = 1;
};
struct ShapeAttrs {  // Reshape, Expand, SumTo
  Shape shape;
};
struct PermuteAttrs {
  std::vector<int64_t> perm;
};
struct SliceAttrs {  // elements [start, end) of `dim`
  int64_t dim = 0;
  int64_t start = 0;
  int64_t end = 0;
};
struct SplitAttrs {
  int64_t dim = 0;
  std::vector<int64_t> sizes;
};
// How a loss combines its rows: their mean over the counted targets, their sum, or each row's.
enum class Reduction : uint8_t { Mean, Sum, None };
// CrossEntropy(Backward), CountTargets: targets equal to ignore_index do not count (a row loss
// of 0). With label smoothing e a row's loss is (1 - e) (-log p_target) + e mean_j (-log p_j).
struct CrossEntropyAttrs {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
};
// TargetLogit: the logit of each row's target among the columns [offset, offset + V) a tensor
// holds of a vocabulary (a shard of it, or all of it with offset 0).
struct TargetAttrs {
  int64_t offset = 0;
  int64_t ignore_index = -100;
};
struct AttentionAttrs {  // q, k, v: [B, H, T, D]
  bool causal = true;
  double scale = 0;  // 0 means 1/sqrt(D)
  RandomAttrs dropout;
};
struct TopKAttrs {
  int64_t k = 1;
  int64_t dim = -1;
  bool largest = true;
};
// Backward of slicing/indexing: scatter a gradient into zeros of the input's `shape` along `dim`
// (at `start` for a slice, at the given indices for max/topk).
struct ScatterAttrs {
  int64_t dim = 0;
  int64_t start = 0;
  Shape shape;
};
struct CastAttrs {
  DType dtype = DType::F32;
};
// Conv2d over [N, C, H, W]: per spatial dim (height, width).
struct Conv2dAttrs {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};  // zeros on each side
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};
// MaxPool2d, AvgPool2d: a kernel x kernel window every stride, padding on each side (average
// pooling counts the padding in its divisor, as PyTorch's count_include_pad).
struct Pool2dAttrs {
  std::array<int64_t, 2> kernel{1, 1};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
};
// Optimizer updates (SgdUpdate, AdamWUpdate) over several parameters at once: per parameter its
// learning rate, weight decay and step, and the hyperparameters they share.
struct OptimizerAttrs {
  std::vector<double> lr, weight_decay;
  // AdamW: the step this update makes (1-based, for the bias corrections); SGD: updates so far
  // (0: the momentum buffer starts from this gradient).
  std::vector<int64_t> step;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0;                            // SGD
  bool nesterov = false;                          // SGD
  // Every gradient is used multiplied by it, in its dtype (global-norm clipping's coefficient:
  // what scaling the gradients first would give, without writing them; SGD's product with weight
  // decay may fuse it into a multiply-add); 1 changes nothing, bit for bit.
  double grad_scale = 1;
};

using Attrs =
    std::variant<NoAttrs, ScalarAttrs, GeluAttrs, DimAttrs, ReduceAttrs, NormAttrs, RandomAttrs,
                 ShapeAttrs, PermuteAttrs, SliceAttrs, SplitAttrs, CrossEntropyAttrs, TargetAttrs,
                 AttentionAttrs, TopKAttrs, ScatterAttrs, CastAttrs, OptimizerAttrs, Conv2dAttrs,
                 Pool2dAttrs, MaskTokensAttrs, MoeAttrs>;

// Human-readable "key=value" list, for graph dumps and error messages.
std::string attrs_str(const Attrs& attrs);

}  // namespace hap::ops
