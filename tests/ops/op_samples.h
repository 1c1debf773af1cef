// A table of samples for every op of the registry (ops/op.h, HAP_OP_LIST): inputs, attributes,
// which inputs are differentiable and which may be passed as non-contiguous views. One table
// drives the CPU tests (tests/ops/test_op_samples.cc: every op runs, views give the contiguous
// result, gradients match finite differences) and the GPU test (tests/gpu/test_cuda_registry.cc:
// every op, forward and backward, on the GPU against the CPU). Header-only, since test_ops and
// test_gpu are separate executables built from their own folders.
//
// Sizes are small and not multiples of 32 (3, 5, 7, 37...); values come from the counter-based
// generator with fixed seeds, so every sample is the same on every run and machine.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/attrs.h"
#include "ops/dispatch.h"
#include "ops/op.h"

namespace hap::op_samples {

using ops::OpKind;

struct OpSample {
  std::string name;
  OpKind kind = OpKind::MatMul;
  // Contiguous CPU tensors: f64 for float inputs, i64 for indices, u8 for masks; an undefined
  // Tensor for an omitted optional input.
  std::vector<Tensor> inputs;
  ops::Attrs attrs;
  // Per input: its gradient is checked (the op has a backward rule and the input is a float).
  std::vector<bool> differentiable;
  // Per input: the view variant passes it as a non-contiguous view (same logical values).
  std::vector<bool> viewable;
  // The op also runs with its f64 inputs cast to f32.
  bool f32 = true;
  // The op updates its inputs in place and returns nothing (the optimizer updates).
  bool in_place = false;
  // Relative tolerance of the view variant against the contiguous one; 0: bit for bit. Set
  // only where a kernel legitimately sums in another order for a view (see where it is set).
  double view_rtol = 0;
  // Non-empty: why gradcheck is not run on this sample (the CPU test prints it).
  std::string no_gradcheck;
};

inline const char* kind_name(OpKind k) { return ops::op_name(k); }

// ---------------------------------------------------------------- tensors

inline TensorOptions f64_opts() { return TensorOptions{}.with_dtype(DType::F64); }

// Standard normal values.
inline Tensor rn(const Shape& s, uint64_t seed) { return randn(s, seed, 0, f64_opts()); }
// Uniform in [lo, hi).
inline Tensor uniform(const Shape& s, uint64_t seed, double lo, double hi) {
  Tensor t = Tensor::empty(s, f64_opts());
  fill_uniform(t, seed, 1, lo, hi);
  return t;
}
// Positive values, away from 0 (log, sqrt, rsqrt, division, pow with a fractional exponent).
inline Tensor pos(const Shape& s, uint64_t seed) { return uniform(s, seed, 0.5, 2.0); }
// Integer ids in [lo, hi).
inline Tensor ids(const Shape& s, uint64_t seed, int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (double u : uniform(s, seed, 0.0, 1.0).to_vector())
    v.push_back(lo + std::min<int64_t>(hi - lo - 1, static_cast<int64_t>(u * double(hi - lo))));
  return Tensor::from_vector(v, s);
}
// A u8 mask: 1 with probability `ones`.
inline Tensor mask(const Shape& s, uint64_t seed, double ones) {
  std::vector<double> v;
  for (double u : uniform(s, seed, 0.0, 1.0).to_vector()) v.push_back(u < ones ? 1.0 : 0.0);
  return Tensor::from_vector(v, s, f64_opts()).to(DType::U8);
}

// A non-contiguous view with the logical values of `x`: for 2+ dims the last two dims are laid
// out transposed with one padding element per column, for 1 dim every other element; always at
// offset 1 inside a larger block whose other elements are 1e6 (wrong reads show). Strides >= 0.
inline Tensor noncontig(const Tensor& x) {
  const int64_t nd = x.dim();
  if (nd == 0) return x.clone();
  const Shape& s = x.shape();
  Strides st(static_cast<size_t>(nd));
  int64_t extent = 0;
  if (nd == 1) {
    st[0] = 2;
    extent = 2 * s[0] + 1;
  } else {
    const int64_t r = s[static_cast<size_t>(nd - 2)], c = s[static_cast<size_t>(nd - 1)];
    st[static_cast<size_t>(nd - 2)] = 1;
    st[static_cast<size_t>(nd - 1)] = r + 1;
    int64_t stride = (r + 1) * c;
    for (int64_t d = nd - 3; d >= 0; --d) {
      st[static_cast<size_t>(d)] = stride;
      stride *= s[static_cast<size_t>(d)];
    }
    extent = stride + 1;
  }
  // Size-1 dims can make that layout contiguous after all ([5, 1]): then every other element.
  if (Tensor::empty({extent}).as_strided(s, st, 1).is_contiguous()) {
    int64_t stride = 2;
    for (int64_t d = nd - 1; d >= 0; --d) {
      st[static_cast<size_t>(d)] = stride;
      stride *= s[static_cast<size_t>(d)];
    }
    extent = stride + 1;
  }
  Tensor block = Tensor::full({extent}, 1e6, TensorOptions{}.with_dtype(x.dtype()));
  Tensor view = block.as_strided(s, st, 1);
  view.copy_from(x);
  return view;
}

// The sample's inputs for one run: float inputs cast to `dtype` (F64: as stored), and, with
// `views`, the viewable ones as non-contiguous views. Fresh tensors each call (in-place ops).
inline std::vector<Tensor> materialize(const OpSample& s, DType dtype, bool views) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const Tensor& x = s.inputs[i];
    if (!x.defined()) {
      out.push_back(Tensor());
      continue;
    }
    Tensor t = is_floating(x.dtype()) ? x.to(dtype).clone() : x.clone();
    if (views && s.viewable[i]) t = noncontig(t);
    out.push_back(t);
  }
  return out;
}

inline bool has_views(const OpSample& s) {
  for (bool v : s.viewable)
    if (v) return true;
  return false;
}

inline bool has_differentiable(const OpSample& s) {
  for (bool d : s.differentiable)
    if (d) return true;
  return false;
}

// Runs an op outside the table (to make the inputs of the backward ops).
inline std::vector<Tensor> run(OpKind k, std::vector<Tensor> in, ops::Attrs a = ops::NoAttrs{}) {
  return ops::call(k, std::move(in), std::move(a));
}

// A sample with the defaults: every defined float input differentiable (when the op has a
// backward rule) and viewable.
inline OpSample sample(OpKind k, std::string name, std::vector<Tensor> inputs,
                       ops::Attrs attrs = ops::NoAttrs{}) {
  OpSample s;
  s.kind = k;
  s.name = std::move(name);
  s.inputs = std::move(inputs);
  s.attrs = std::move(attrs);
  const bool bw = ops::op_def(k).backward != nullptr;
  for (const Tensor& x : s.inputs) {
    const bool fl = x.defined() && is_floating(x.dtype());
    s.differentiable.push_back(fl && bw);
    s.viewable.push_back(fl && x.dim() > 0);  // a scalar has no other layout
  }
  return s;
}

// ---------------------------------------------------------------- the table

inline ops::Conv2dAttrs conv_attrs(int64_t groups) {
  ops::Conv2dAttrs a;
  a.stride = {2, 1};
  a.padding = {1, 2};
  a.dilation = {1, 2};
  a.groups = groups;
  return a;
}

inline ops::Pool2dAttrs pool_attrs() {
  ops::Pool2dAttrs a;
  a.kernel = {3, 3};
  a.stride = {2, 2};
  a.padding = {1, 1};
  return a;
}

inline ops::OptimizerAttrs optimizer_attrs(bool sgd) {
  ops::OptimizerAttrs a;
  a.lr = {0.1, 0.03};
  a.weight_decay = {0.01, 0.0};
  a.step = sgd ? std::vector<int64_t>{2, 0} : std::vector<int64_t>{3, 1};
  a.momentum = sgd ? 0.9 : 0.0;
  a.nesterov = sgd;
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  return a;
}

inline ops::AttentionAttrs attention_attrs(bool causal, double dropout) {
  ops::AttentionAttrs a;
  a.causal = causal;
  a.dropout.p = dropout;
  a.dropout.seed = 11;
  a.dropout.stream = 3;
  return a;
}

inline ops::MaskTokensAttrs mask_tokens_attrs(bool targets) {
  ops::MaskTokensAttrs a;
  a.p = 0.3;
  a.mask_id = 3;
  a.vocab = 50;
  a.targets = targets;
  a.seed = 9;
  a.stream = 2;
  return a;
}

// Targets with every fifth one ignored (-100).
inline Tensor targets(int64_t n, int64_t v, uint64_t seed) {
  std::vector<double> t = ids({n}, seed, 0, v).to_vector();
  std::vector<int64_t> out;
  for (size_t i = 0; i < t.size(); ++i)
    out.push_back(i % 5 == 2 ? -100 : static_cast<int64_t>(t[i]));
  return Tensor::from_vector(out, {n});
}

inline std::vector<OpSample> op_samples(OpKind k) {
  using namespace ops;
  std::vector<OpSample> v;
  auto add = [&](OpSample s) { v.push_back(std::move(s)); };
  switch (k) {
    case OpKind::MatMul:
      add(sample(k, "2d", {rn({5, 37}, 1), rn({37, 7}, 2)}));
      add(sample(k, "batched", {rn({3, 5, 7}, 3), rn({3, 7, 4}, 4)}));
      add(sample(k, "broadcast batch", {rn({2, 3, 5, 7}, 5), rn({7, 3}, 6)}));
      break;
    case OpKind::Linear:
      add(sample(k, "bias", {rn({3, 5, 37}, 7), rn({7, 37}, 8), rn({7}, 9)}));
      add(sample(k, "no bias", {rn({5, 37}, 10), rn({3, 37}, 11), Tensor()}));
      // A transposed weight view is multiplied in place by the GEMM with the other transpose
      // flag (ops/defs/matmul.cc, gemm_ready), whose kernel accumulates the 37 products in
      // another order (vector lanes, blocking): f32 results differ in the last bits (1 ulp seen).
      for (OpSample& s : v) s.view_rtol = 1e-6;
      break;
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
      add(sample(k, "same shapes", {rn({5, 37}, 12), rn({5, 37}, 13)}));
      add(sample(k, "broadcast", {rn({3, 5, 7}, 14), rn({5, 1}, 15)}));
      break;
    case OpKind::Div:
      add(sample(k, "same shapes", {rn({5, 37}, 16), pos({5, 37}, 17)}));
      add(sample(k, "broadcast", {rn({3, 5, 7}, 18), pos({5, 1}, 19)}));
      break;
    case OpKind::AddScalar:
      add(sample(k, "", {rn({7, 37}, 20)}, ScalarAttrs{1.5}));
      break;
    case OpKind::MulScalar:
      add(sample(k, "", {rn({7, 37}, 21)}, ScalarAttrs{-2.25}));
      break;
    case OpKind::PowScalar:
      add(sample(k, "square", {rn({7, 37}, 22)}, ScalarAttrs{2.0}));
      add(sample(k, "cube", {rn({7, 5}, 23)}, ScalarAttrs{3.0}));
      add(sample(k, "fractional", {pos({7, 5}, 24)}, ScalarAttrs{1.7}));
      break;
    case OpKind::Neg:
    case OpKind::Exp:
    case OpKind::Tanh:
    case OpKind::Relu:
    case OpKind::Sigmoid:
      add(sample(k, "", {rn({7, 37}, 25)}));
      add(sample(k, "3d", {rn({3, 5, 7}, 26)}));
      break;
    case OpKind::Log:
    case OpKind::Sqrt:
    case OpKind::Rsqrt:
      add(sample(k, "", {pos({7, 37}, 27)}));
      break;
    case OpKind::Gelu:
      add(sample(k, "tanh", {rn({7, 37}, 28)}, GeluAttrs{GeluApprox::Tanh}));
      add(sample(k, "erf", {rn({7, 37}, 29)}, GeluAttrs{GeluApprox::None}));
      break;
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      add(sample(k, "last dim", {rn({5, 37}, 30)}, DimAttrs{-1, false}));
      add(sample(k, "middle dim", {rn({3, 7, 5}, 31)}, DimAttrs{1, false}));
      break;
    case OpKind::LayerNorm:
      add(sample(k, "affine", {rn({3, 5, 37}, 32), rn({37}, 33), rn({37}, 34)}, NormAttrs{1e-5}));
      add(sample(k, "plain", {rn({5, 7}, 35), Tensor(), Tensor()}, NormAttrs{1e-5}));
      break;
    case OpKind::RmsNorm:
      add(sample(k, "weight", {rn({3, 5, 37}, 36), rn({37}, 37)}, NormAttrs{1e-6}));
      add(sample(k, "plain", {rn({5, 7}, 38), Tensor()}, NormAttrs{1e-6}));
      break;
    case OpKind::Embedding:
      add(sample(k, "", {rn({11, 7}, 39), ids({3, 5}, 40, 0, 11)}));
      break;
    case OpKind::Dropout: {
      // A fixed (seed, stream): a deterministic linear map of x, so gradcheck applies.
      RandomAttrs a;
      a.p = 0.3;
      a.seed = 5;
      a.stream = 1;
      add(sample(k, "p=0.3", {rn({7, 37}, 41)}, a));
      a.p = 0;
      add(sample(k, "p=0", {rn({5, 7}, 42)}, a));
      break;
    }
    case OpKind::Sum:
    case OpKind::Mean:
      add(sample(k, "all", {rn({3, 5, 37}, 43)}, ReduceAttrs{{}, false}));
      add(sample(k, "dim 1 keepdim", {rn({3, 5, 37}, 44)}, ReduceAttrs{{1}, true}));
      add(sample(k, "dims 0 2", {rn({3, 5, 7}, 45)}, ReduceAttrs{{0, 2}, false}));
      break;
    case OpKind::Max:
    case OpKind::Argmax:
      // Normal values have no ties (a tie would make max's gradient ambiguous).
      add(sample(k, "last dim", {rn({5, 37}, 46)}, DimAttrs{-1, false}));
      add(sample(k, "dim 1 keepdim", {rn({3, 5, 7}, 47)}, DimAttrs{1, true}));
      break;
    case OpKind::TopK:
      add(sample(k, "largest", {rn({5, 37}, 48)}, TopKAttrs{3, -1, true}));
      add(sample(k, "smallest dim 0", {rn({7, 5}, 49)}, TopKAttrs{2, 0, false}));
      break;
    case OpKind::Reshape:
      add(sample(k, "", {rn({5, 37}, 50)}, ShapeAttrs{{37, 5}}));
      add(sample(k, "infer", {rn({3, 5, 7}, 51)}, ShapeAttrs{{-1, 7}}));
      break;
    case OpKind::Permute:
      add(sample(k, "", {rn({3, 5, 7}, 52)}, PermuteAttrs{{2, 0, 1}}));
      break;
    case OpKind::Slice:
      add(sample(k, "", {rn({7, 37}, 53)}, SliceAttrs{1, 3, 20}));
      add(sample(k, "dim 0", {rn({7, 5}, 54)}, SliceAttrs{0, 2, 7}));
      break;
    case OpKind::Expand:
      add(sample(k, "", {rn({5, 1}, 55)}, ShapeAttrs{{3, 5, 7}}));
      break;
    case OpKind::Concat:
      add(sample(k, "dim 1", {rn({5, 3}, 56), rn({5, 7}, 57), rn({5, 2}, 58)}, DimAttrs{1, false}));
      add(sample(k, "dim 0", {rn({3, 5}, 59), rn({7, 5}, 60)}, DimAttrs{0, false}));
      break;
    case OpKind::Split:
      add(sample(k, "", {rn({5, 37}, 61)}, SplitAttrs{1, {3, 7, 27}}));
      break;
    case OpKind::Contiguous:
      add(sample(k, "", {rn({7, 37}, 62)}));
      break;
    case OpKind::MaskedFill:
      add(sample(k, "full mask", {rn({5, 37}, 63), mask({5, 37}, 64, 0.4)}, ScalarAttrs{-3.5}));
      add(sample(k, "broadcast mask", {rn({3, 5, 7}, 65), mask({5, 7}, 66, 0.4)},
                 ScalarAttrs{0.25}));
      break;
    case OpKind::CrossEntropy: {
      add(sample(k, "mean", {rn({7, 37}, 67), targets(7, 37, 68)}, CrossEntropyAttrs{}));
      add(sample(k, "sum smoothed", {rn({7, 37}, 69), targets(7, 37, 70)},
                 CrossEntropyAttrs{-100, 0.1, Reduction::Sum}));
      add(sample(k, "none", {rn({5, 7}, 71), targets(5, 7, 72)},
                 CrossEntropyAttrs{-100, 0.0, Reduction::None}));
      break;
    }
    case OpKind::Attention: {
      add(sample(k, "causal",
                 {rn({2, 3, 5, 7}, 73), rn({2, 3, 5, 7}, 74), rn({2, 3, 5, 4}, 75), Tensor()},
                 attention_attrs(true, 0)));
      Tensor keys = mask({2, 5}, 76, 0.6);
      keys.data<uint8_t>()[0] = 1;  // every query of batch b attends key 0 at least (no empty row)
      keys.data<uint8_t>()[5] = 1;
      add(sample(k, "key mask",
                 {rn({2, 3, 5, 7}, 77), rn({2, 3, 5, 7}, 78), rn({2, 3, 5, 7}, 79), keys},
                 attention_attrs(false, 0)));
      add(sample(k, "dropout",
                 {rn({1, 2, 7, 5}, 80), rn({1, 2, 7, 5}, 81), rn({1, 2, 7, 5}, 82), Tensor()},
                 attention_attrs(true, 0.25)));
      break;
    }
    case OpKind::Cast:
      add(sample(k, "to f32", {rn({7, 37}, 83)}, CastAttrs{DType::F32}));
      add(sample(k, "to f64", {rn({7, 5}, 84)}, CastAttrs{DType::F64}));
      add(sample(k, "to bf16", {rn({7, 5}, 85)}, CastAttrs{DType::BF16}));
      add(sample(k, "i64 to f64", {ids({5, 7}, 86, -20, 20)}, CastAttrs{DType::F64}));
      break;
    case OpKind::LogSumExp:
      add(sample(k, "", {rn({5, 37}, 87)}));
      add(sample(k, "3d", {rn({3, 5, 7}, 88)}));
      break;
    case OpKind::TargetLogit:
      add(sample(k, "", {rn({7, 37}, 89), targets(7, 37, 90)}, TargetAttrs{0, -100}));
      // A shard of the vocabulary: columns [10, 47); targets outside it give 0.
      add(sample(k, "offset", {rn({7, 37}, 91), targets(7, 60, 92)}, TargetAttrs{10, -100}));
      break;
    case OpKind::CountTargets:
      add(sample(k, "", {targets(37, 11, 93)}, CrossEntropyAttrs{}));
      break;
    case OpKind::SumOfSquares:
      add(sample(k, "", {rn({5, 37}, 94), rn({7}, 95)}));
      break;
    case OpKind::SgdUpdate:
    case OpKind::AdamWUpdate: {
      // Two parameters: (p, g, state...) each. The states must be contiguous (written in place);
      // only the gradients may be views. AdamW's second moment is >= 0.
      const bool sgd = k == OpKind::SgdUpdate;
      const size_t group = sgd ? 3 : 4;
      std::vector<Tensor> in;
      uint64_t seed = sgd ? 96 : 104;
      for (const Shape& s : {Shape{5, 37}, Shape{7}})
        for (size_t j = 0; j < group; ++j) in.push_back(j == 3 ? pos(s, seed++) : rn(s, seed++));
      OpSample smp = sample(k, "", in, optimizer_attrs(sgd));
      smp.in_place = true;
      for (size_t i = 0; i < in.size(); ++i) {
        smp.differentiable[i] = false;
        smp.viewable[i] = i % group == 1;
      }
      add(smp);
      break;
    }
    case OpKind::Conv2d:
      add(sample(k, "bias", {rn({2, 3, 9, 11}, 112), rn({5, 3, 3, 3}, 113), rn({5}, 114)},
                 conv_attrs(1)));
      add(sample(k, "groups", {rn({2, 6, 7, 5}, 115), rn({9, 2, 3, 2}, 116), Tensor()},
                 conv_attrs(3)));
      break;
    case OpKind::MaxPool2d:
    case OpKind::AvgPool2d:
      add(sample(k, "", {rn({2, 3, 9, 11}, 117)}, pool_attrs()));
      break;
    case OpKind::MaskTokens:
      add(sample(k, "inputs", {ids({5, 37}, 118, 0, 50)}, mask_tokens_attrs(false)));
      add(sample(k, "targets", {ids({5, 37}, 118, 0, 50)}, mask_tokens_attrs(true)));
      break;
    case OpKind::MoeDispatch:
      // 2 groups of 7 tokens, top-2 of 3 experts with 3 slots each: some choices overflow.
      add(sample(k, "weighted", {rn({2, 7, 5}, 119), ids({2, 7, 2}, 120, 0, 3), rn({2, 7, 2}, 121)},
                 MoeAttrs{3, 3}));
      add(sample(k, "unweighted", {rn({2, 7, 5}, 122), ids({2, 7, 2}, 123, 0, 3), Tensor()},
                 MoeAttrs{3, 3}));
      break;
    case OpKind::MoeCombine:
      add(sample(k, "gated", {rn({2, 3, 3, 5}, 124), ids({2, 7, 2}, 125, 0, 3), rn({2, 7, 2}, 126)},
                 MoeAttrs{3, 3}));
      add(sample(k, "ungated", {rn({2, 3, 3, 5}, 127), ids({2, 7, 2}, 128, 0, 3), Tensor()},
                 MoeAttrs{3, 3}));
      break;
    case OpKind::MoeGateGrad:
      add(sample(k, "", {rn({2, 7, 5}, 129), rn({2, 3, 3, 5}, 130), ids({2, 7, 2}, 131, 0, 3)},
                 MoeAttrs{3, 3}));
      break;
    case OpKind::TrainEvalSelect:
      add(sample(k, "", {rn({5, 37}, 132), rn({5, 37}, 133)}));
      break;
    case OpKind::GeluBackward:
      add(sample(k, "tanh", {rn({7, 37}, 134), rn({7, 37}, 135)}, GeluAttrs{GeluApprox::Tanh}));
      add(sample(k, "erf", {rn({7, 5}, 136), rn({7, 5}, 137)}, GeluAttrs{GeluApprox::None}));
      break;
    case OpKind::ReluBackward:
      add(sample(k, "", {rn({7, 37}, 138), run(OpKind::Relu, {rn({7, 37}, 139)})[0]}));
      break;
    case OpKind::SoftmaxBackward:
    case OpKind::LogSoftmaxBackward: {
      const OpKind fwd = k == OpKind::SoftmaxBackward ? OpKind::Softmax : OpKind::LogSoftmax;
      add(sample(k, "last dim",
                 {rn({5, 37}, 140), run(fwd, {rn({5, 37}, 141)}, DimAttrs{-1, false})[0]},
                 DimAttrs{-1, false}));
      add(sample(k, "middle dim",
                 {rn({3, 7, 5}, 142), run(fwd, {rn({3, 7, 5}, 143)}, DimAttrs{1, false})[0]},
                 DimAttrs{1, false}));
      break;
    }
    case OpKind::LayerNormBackward:
    case OpKind::RmsNormBackward: {
      const NormAttrs a{k == OpKind::LayerNormBackward ? 1e-5 : 1e-6};
      add(sample(k, "weight", {rn({3, 5, 37}, 144), rn({3, 5, 37}, 145), rn({37}, 146)}, a));
      add(sample(k, "plain", {rn({5, 7}, 147), rn({5, 7}, 148), Tensor()}, a));
      break;
    }
    case OpKind::EmbeddingBackward:
      add(sample(k, "", {rn({3, 5, 7}, 149), ids({3, 5}, 150, 0, 11)},
                 ScatterAttrs{0, 0, {11, 7}}));
      break;
    case OpKind::CrossEntropyBackward:
      add(sample(k, "mean", {rn({}, 151), rn({7, 37}, 152), targets(7, 37, 153)},
                 CrossEntropyAttrs{}));
      add(sample(k, "sum smoothed", {rn({}, 154), rn({7, 37}, 155), targets(7, 37, 156)},
                 CrossEntropyAttrs{-100, 0.1, Reduction::Sum}));
      add(sample(k, "none", {rn({5}, 157), rn({5, 7}, 158), targets(5, 7, 159)},
                 CrossEntropyAttrs{-100, 0.0, Reduction::None}));
      break;
    case OpKind::AttentionBackward: {
      // The forward's q, k, v, out and lse, a gradient of out and (or not) of lse, the key mask.
      for (int variant = 0; variant < 3; ++variant) {
        const bool masked = variant == 1, dropout = variant == 2;
        const Shape s = dropout ? Shape{1, 2, 7, 5} : Shape{2, 3, 5, 7};
        const uint64_t seed = 160 + 10 * static_cast<uint64_t>(variant);
        Tensor q = rn(s, seed), kk = rn(s, seed + 1), vv = rn(s, seed + 2), keys;
        if (masked) {
          keys = mask({s[0], s[2]}, seed + 3, 0.6);
          for (int64_t b = 0; b < s[0]; ++b) keys.data<uint8_t>()[b * s[2]] = 1;
        }
        const AttentionAttrs a = attention_attrs(!masked, dropout ? 0.25 : 0);
        std::vector<Tensor> o = run(OpKind::Attention, {q, kk, vv, keys}, a);
        Tensor glse = variant == 0 ? Tensor() : rn(o[1].shape(), seed + 4);
        add(sample(k,
                   masked    ? "key mask"
                   : dropout ? "dropout"
                             : "causal",
                   {q, kk, vv, o[0], o[1], rn(o[0].shape(), seed + 5), glse, keys}, a));
      }
      break;
    }
    case OpKind::SliceBackward:
      add(sample(k, "", {rn({7, 17}, 190)}, ScatterAttrs{1, 3, {7, 37}}));
      break;
    case OpKind::IndexBackward: {
      // Indices from topk (distinct per row) and from argmax (one per row).
      Tensor idx = run(OpKind::TopK, {rn({5, 37}, 191)}, TopKAttrs{3, 1, true})[1];
      add(sample(k, "topk", {rn({5, 3}, 192), idx}, ScatterAttrs{1, 0, {5, 37}}));
      Tensor am = run(OpKind::Argmax, {rn({3, 5, 7}, 193)}, DimAttrs{1, true})[0];
      add(sample(k, "argmax", {rn({3, 1, 7}, 194), am}, ScatterAttrs{1, 0, {3, 5, 7}}));
      break;
    }
    case OpKind::TargetLogitBackward:
      add(sample(k, "", {rn({7}, 195), rn({7, 37}, 196), targets(7, 37, 197)},
                 TargetAttrs{0, -100}));
      add(sample(k, "offset", {rn({7}, 198), rn({7, 37}, 199), targets(7, 60, 200)},
                 TargetAttrs{10, -100}));
      break;
    case OpKind::Conv2dBackward: {
      for (int64_t groups : {1, 3}) {
        const uint64_t seed = 201 + 3 * static_cast<uint64_t>(groups);
        Tensor x = groups == 1 ? rn({2, 3, 9, 11}, seed) : rn({2, 6, 7, 5}, seed);
        Tensor w = groups == 1 ? rn({5, 3, 3, 3}, seed + 1) : rn({9, 2, 3, 2}, seed + 1);
        Tensor y = run(OpKind::Conv2d, {x, w, Tensor()}, conv_attrs(groups))[0];
        add(sample(k, groups == 1 ? "plain" : "groups", {rn(y.shape(), seed + 2), x, w},
                   conv_attrs(groups)));
      }
      break;
    }
    case OpKind::MaxPool2dBackward:
    case OpKind::AvgPool2dBackward: {
      const OpKind fwd = k == OpKind::MaxPool2dBackward ? OpKind::MaxPool2d : OpKind::AvgPool2d;
      Tensor x = rn({2, 3, 9, 11}, 210);
      Tensor y = run(fwd, {x}, pool_attrs())[0];
      add(sample(k, "", {rn(y.shape(), 211), x}, pool_attrs()));
      break;
    }
    case OpKind::kCount:
      break;
  }
  for (OpSample& s : v) s.kind = k;
  return v;
}

// Every OpKind of the registry, in HAP_OP_LIST order.
inline std::vector<OpKind> all_kinds() {
  std::vector<OpKind> out;
  for (size_t i = 0; i < ops::kNumOps; ++i) out.push_back(static_cast<OpKind>(i));
  return out;
}

}  // namespace hap::op_samples
