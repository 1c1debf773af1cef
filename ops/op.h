// The op registry: every op is declared once, as an OpDef holding its attributes type, shape and
// dtype inference, FLOP count, sharding signatures, CPU kernel, CUDA kernel slot and backward
// rule. Dispatch (ops/dispatch.h) and the synthesizer read nothing else about an op.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/attrs.h"
#include "ops/local.h"
#include "ops/sharding.h"

namespace hap::ops {

// Forward ops first, then the fused kernels that backward rules are written with.
// clang-format off
#define HAP_OP_LIST(X)                                                                        \
  X(MatMul) X(Linear) X(Add) X(Sub) X(Mul) X(Div) X(AddScalar) X(MulScalar) X(PowScalar)     \
  X(Neg) X(Exp) X(Log) X(Sqrt) X(Rsqrt) X(Tanh) X(Gelu) X(Relu) X(Sigmoid) X(Softmax)         \
  X(LogSoftmax) X(LayerNorm) X(RmsNorm) X(Embedding) X(Dropout) X(Sum) X(Mean) X(Max)         \
  X(Reshape) X(Permute) X(Slice) X(Expand) X(Concat) X(Split) X(Contiguous) X(MaskedFill)     \
  X(CrossEntropy) X(Attention) X(Argmax) X(TopK) X(Cast) X(LogSumExp) X(TargetLogit)         \
  X(CountTargets) X(SumOfSquares) X(SgdUpdate) X(AdamWUpdate) X(Conv2d) X(MaxPool2d)         \
  X(AvgPool2d) X(MaskTokens) X(MoeDispatch) X(MoeCombine) X(MoeGateGrad) X(TrainEvalSelect)   \
  X(GeluBackward) X(ReluBackward) X(SoftmaxBackward) X(LogSoftmaxBackward)                    \
  X(LayerNormBackward) X(RmsNormBackward) X(EmbeddingBackward) X(CrossEntropyBackward)        \
  X(AttentionBackward) X(SliceBackward) X(IndexBackward) X(TargetLogitBackward)              \
  X(Conv2dBackward) X(MaxPool2dBackward) X(AvgPool2dBackward)
// clang-format on

enum class OpKind : uint16_t {
#define HAP_OP_ENUM(name) name,
  HAP_OP_LIST(HAP_OP_ENUM)
#undef HAP_OP_ENUM
      kCount
};
constexpr size_t kNumOps = static_cast<size_t>(OpKind::kCount);

const char* op_name(OpKind kind);

using Metas = std::vector<TensorMeta>;

// What a kernel sees: the inputs (contiguity not guaranteed unless the op says so), the inferred
// output metadata and the attributes.
struct KernelContext {
  OpKind kind;
  const std::vector<Tensor>& inputs;
  const Metas& out_meta;
  const Attrs& attrs;
  // A fresh contiguous output tensor for output i, on the inputs' device.
  Tensor alloc(size_t i) const;
};

// What a backward rule sees. grad_outputs[i] is undefined when output i got no gradient.
struct BackwardContext {
  OpKind kind;
  const std::vector<Tensor>& inputs;
  const std::vector<Tensor>& outputs;
  const std::vector<Tensor>& grad_outputs;
  const Attrs& attrs;
  const std::vector<bool>& needs_input_grad;
};

using InferFn = Metas (*)(const Metas& in, const Attrs& attrs);
using FlopsFn = double (*)(const Metas& in, const Metas& out, const Attrs& attrs);
using ShardFn = std::vector<ShardSignature> (*)(const Metas& in, const Metas& out,
                                                const Attrs& attrs);
using KernelFn = std::vector<Tensor> (*)(const KernelContext& ctx);
// Returns one tensor per input: the gradient, or an undefined Tensor for none.
using BackwardFn = std::vector<Tensor> (*)(const BackwardContext& ctx);

// A collective that an op's sharded run (its `local` function, which the executor calls for the
// forward) makes itself, through ShardContext::all_gather or sum_over_ranks, beside the program's
// own collectives: the cost model prices it with the op (synth::CostModel::own_collectives_s).
struct OwnCollective {
  enum class Kind : uint8_t { AllGather, ReduceScatter };
  Kind kind = Kind::AllGather;
  // Padded: the regular collective on even shards; Grouped: one broadcast or reduce per rank.
  CollectiveMethod method = CollectiveMethod::Padded;
  // The shard each rank adds to the all-gather or gets of the reduce-scatter (even shards: the
  // whole tensor is P times as large).
  double bytes = 0;
  // Made by the forward (again where the node is recomputed); false: by the backward (autograd's
  // adjoint of a forward collective), which runs only where a gradient flows through the node.
  bool forward = true;
};
// The collectives of one forward and backward of a node under a sharding signature (in: the
// node's logical inputs).
using OwnCollectivesFn = std::vector<OwnCollective> (*)(const ShardSignature& sig, const Metas& in,
                                                        const Attrs& attrs);

// What mixed precision (an AutocastGuard with bf16, train.precision: bf16) does to an op's float
// inputs before it runs. Promote: when f32 and bf16 inputs meet, the bf16 ones become f32 (the
// residual stream stays f32; single-dtype ops keep their dtype). Lower: f32 inputs become bf16
// (the products: bf16 GEMMs with f32 accumulation, bf16 outputs). Float: bf16 inputs become f32
// (norms, softmax, sums and the loss: statistics and the loss in f32). Keep: never changed (casts
// and the optimizer's updates).
enum class Autocast : uint8_t { Promote, Lower, Float, Keep };

struct OpDef {
  const char* name = nullptr;
  int num_inputs = 0;  // -1: variadic (at least one)
  InferFn infer = nullptr;
  FlopsFn flops = nullptr;  // null: zero FLOPs (data movement only)
  ShardFn shard = nullptr;  // null: only the all-Replicated signature
  KernelFn cpu = nullptr;
  KernelFn cuda = nullptr;        // filled by the CUDA backend
  BackwardFn backward = nullptr;  // null: not differentiable
  // How the op runs on one rank's shards (ops/local.h); null: its kernel on the local shards with
  // the attributes unchanged.
  LocalFn local = nullptr;
  // The collectives `local` makes itself under a signature (above); null: none.
  OwnCollectivesFn own_collectives = nullptr;
  uint32_t optional_inputs = 0;  // bit i: input i may be an undefined Tensor
  // Bit i: input i holds f32 statistics of bf16 operands (attention's log-sum-exp and its
  // gradient): it goes beside bf16 inputs as it is, never cast by mixed precision or by the bf16
  // route, and is no dtype mix. (Outputs keep the dtype inference gives them: a statistics output
  // of bf16 operands is inferred f32 and the route does not round it.)
  uint32_t f32_stat_inputs = 0;
  bool saves_inputs = true;  // backward reads the inputs
  // Its backward reads only the inputs' shapes, dtypes and devices (a sum's, a reshape's, a
  // cast's): autograd keeps shape-only tensors for it, not the inputs' data.
  bool input_metas_only = false;
  bool saves_outputs = false;  // backward reads the outputs
  // A matrix product (input 1, when a parameter, is its weight: tensor parallelism stores it
  // Sharded); its backward computes one forward-sized product per input that needs a gradient.
  bool product = false;
  // Its time follows its FLOPs (products, attention) rather than the bytes it moves: hap-profile
  // rates these in FLOP/s and the others by memory bandwidth.
  bool flops_bound = false;
  // Only moves or reinterprets data: the kernel works for any dtype as is (bf16 is not routed
  // through f32).
  bool moves_data = false;
  // Its CPU kernel takes bf16 operands itself (f32 accumulation, one rounding at the end, as the
  // f32 route would give): on CPU tensors whose float inputs are all bf16, no casts are inserted.
  bool cpu_bf16 = false;
  // The same for its CUDA kernel.
  bool cuda_bf16 = false;
  // Where set, the CUDA kernel takes bf16 operands only for the inputs and attributes it accepts
  // (attention's flash kernels: head sizes up to 128); other calls go through the f32 route.
  bool (*cuda_bf16_accepts)(const std::vector<Tensor>& inputs, const Attrs& attrs) = nullptr;
  // Its CPU kernel only makes views or calls the Tensor methods every device backend provides
  // (fill_, clone, copy_from: core/tensor.h, DeviceTensorOps), so it serves tensors of any device.
  bool any_device = false;
  Autocast autocast = Autocast::Promote;  // under mixed precision (above)
};

using OpTable = std::array<OpDef, kNumOps>;

// The registry, filled once on first use; every OpKind has a complete entry.
const OpDef& op_def(OpKind kind);
const OpTable& op_table();

// Registration functions, one per family file in ops/defs/.
void register_matmul_ops(OpTable& t);
void register_elementwise_ops(OpTable& t);
void register_reduce_ops(OpTable& t);
void register_shape_ops(OpTable& t);
void register_nn_ops(OpTable& t);
void register_loss_ops(OpTable& t);
void register_attention_ops(OpTable& t);
void register_optim_ops(OpTable& t);
void register_conv_ops(OpTable& t);
void register_moe_ops(OpTable& t);

inline OpDef& def_of(OpTable& t, OpKind k) { return t[static_cast<size_t>(k)]; }

}  // namespace hap::ops
