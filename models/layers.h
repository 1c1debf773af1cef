// The standard layers. Each is a Module with an options struct in the libtorch style and a
// forward(); default initialisation follows GPT-2 (see each init_rule):
//   Linear, Embedding weights ~ N(0, 0.02); biases 0; LayerNorm/RMSNorm weight 1, bias 0.
// A layer draws its parameters when constructed, with seed 0 and its local names ("weight"), since
// full names are not known yet; the root calls reset_parameters(seed) once the tree is built to
// draw every parameter under its full name (GPT's constructor does).
#pragma once
#include <cstdint>
#include <memory>

#include "models/module.h"

namespace hap::nn {

inline constexpr double kGpt2InitStd = 0.02;

// ---- Linear: y = x W^T + b, weight [out, in], bias [out] ----
struct LinearOptions {
  LinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  HAP_ARG(int64_t, in_features);
  HAP_ARG(int64_t, out_features);
  HAP_ARG(bool, bias) = true;
};

class Linear : public Module {
 public:
  explicit Linear(const LinearOptions& options);
  // x: [..., in] -> [..., out]
  Tensor forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const LinearOptions& options() const { return options_; }

  Tensor weight;  // [out, in]
  Tensor bias;    // [out], undefined without bias

 private:
  LinearOptions options_;
};

// ---- Conv2d: images [N, C, H, W] -> [N, O, OH, OW], weight [O, C / groups, KH, KW] ----
// Weights ~ N(0, 2 / (O / groups x KH x KW)) (He, fan-out, for ReLU networks), biases 0.
struct Conv2dOptions {
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  HAP_ARG(int64_t, in_channels);
  HAP_ARG(int64_t, out_channels);
  HAP_ARG(int64_t, kernel_size);  // square kernels
  HAP_ARG(int64_t, stride) = 1;
  HAP_ARG(int64_t, padding) = 0;
  HAP_ARG(int64_t, dilation) = 1;
  HAP_ARG(int64_t, groups) = 1;
  HAP_ARG(bool, bias) = true;
};

class Conv2d : public Module {
 public:
  explicit Conv2d(const Conv2dOptions& options);
  Tensor forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const Conv2dOptions& options() const { return options_; }

  Tensor weight;  // [out, in / groups, k, k]
  Tensor bias;    // [out], undefined without bias

 private:
  Conv2dOptions options_;
};

// ---- Embedding: rows of weight [num_embeddings, embedding_dim] picked by i64 ids ----
struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  HAP_ARG(int64_t, num_embeddings);
  HAP_ARG(int64_t, embedding_dim);
};

class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  // ids: i64 [...] -> [..., embedding_dim]
  Tensor forward(const Tensor& ids) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const EmbeddingOptions& options() const { return options_; }

  Tensor weight;  // [num_embeddings, embedding_dim]

 private:
  EmbeddingOptions options_;
};

// ---- LayerNorm over the last dim ----
struct LayerNormOptions {
  explicit LayerNormOptions(int64_t dim) : dim_(dim) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(double, eps) = 1e-5;
  HAP_ARG(bool, bias) = true;  // a learned bias next to the learned weight
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  Tensor forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const LayerNormOptions& options() const { return options_; }

  Tensor weight;  // [dim]
  Tensor bias;    // [dim], undefined without bias

 private:
  LayerNormOptions options_;
};

// ---- BatchNorm over channels (dim 1) of [N, C, ...] ----
// Training normalises by the batch's statistics, which are global over the logical batch under
// every sharding (a distributed run equals one device's), and updates the running statistics
// (buffers running_mean, running_var: [C]) as PyTorch does: running = (1 - momentum) * running +
// momentum * batch statistic, the variance unbiased. Evaluation normalises by the running
// statistics. With track_running_stats(false) both modes use the batch's statistics and there
// are no buffers.
struct BatchNormOptions {
  explicit BatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  HAP_ARG(int64_t, num_features);
  HAP_ARG(double, eps) = 1e-5;
  HAP_ARG(double, momentum) = 0.1;
  HAP_ARG(bool, affine) = true;  // a learned per-channel weight and bias
  HAP_ARG(bool, track_running_stats) = true;
};

class BatchNorm : public Module {
 public:
  explicit BatchNorm(const BatchNormOptions& options);
  Tensor forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const BatchNormOptions& options() const { return options_; }

  Tensor weight;        // [C], undefined without affine
  Tensor bias;          // [C], undefined without affine
  Tensor running_mean;  // [C] buffer (zeros at first), undefined without track_running_stats
  Tensor running_var;   // [C] buffer (ones at first), undefined without track_running_stats

 private:
  BatchNormOptions options_;
};

// ---- RMSNorm over the last dim ----
struct RMSNormOptions {
  explicit RMSNormOptions(int64_t dim) : dim_(dim) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(double, eps) = 1e-6;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(const RMSNormOptions& options);
  Tensor forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const RMSNormOptions& options() const { return options_; }

  Tensor weight;  // [dim]

 private:
  RMSNormOptions options_;
};

// ---- Dropout: identity in eval(); masks from the module's random stream (models/module.h) ----
struct DropoutOptions {
  /* implicit */ DropoutOptions(double p = 0.5) : p_(p) {}
  HAP_ARG(double, p);
};

class Dropout : public Module {
 public:
  explicit Dropout(const DropoutOptions& options = {});
  Tensor forward(const Tensor& x);
  const DropoutOptions& options() const { return options_; }

 private:
  DropoutOptions options_;
};

// ---- MLP: fc -> gelu(tanh) -> proj -> dropout ----
struct MLPOptions {
  explicit MLPOptions(int64_t dim) : dim_(dim), hidden_(4 * dim) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(int64_t, hidden);
  HAP_ARG(bool, bias) = true;
  HAP_ARG(double, dropout) = 0.0;
};

class MLP : public Module {
 public:
  explicit MLP(const MLPOptions& options);
  // x: [..., dim] -> [..., dim]
  Tensor forward(const Tensor& x);
  const MLPOptions& options() const { return options_; }

  std::shared_ptr<Linear> fc;    // dim -> hidden
  std::shared_ptr<Linear> proj;  // hidden -> dim
  std::shared_ptr<Dropout> drop;

 private:
  MLPOptions options_;
};

// ---- QkvProjection: x [..., C] -> q, k, v [..., C] ----
// The three projections of attention as one parameter: weight [3, C, C] (q's, k's and v's [out,
// in] matrices stacked; the same numbers, in the same order, as one [3C, C] linear), bias [3, C].
// Each projection is a linear by its own [C, C] slice, so a weight stored Sharded(1) gives each
// rank whole columns (output features) of q, k and v alike: the column-parallel projections of
// head-parallel attention (Megatron's). Initialised as Linear: weights N(0, 0.02), biases 0.
class QkvProjection : public Module {
 public:
  QkvProjection(int64_t dim, bool bias);
  // x: [..., C] -> {q, k, v}, each [..., C].
  std::vector<Tensor> forward(const Tensor& x) const;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;

  Tensor weight;  // [3, C, C]
  Tensor bias;    // [3, C], undefined without bias
};

// ---- SelfAttention: qkv -> heads -> attention (causal or bidirectional) -> proj -> dropout ----
struct SelfAttentionOptions {
  SelfAttentionOptions(int64_t dim, int64_t n_head) : dim_(dim), n_head_(n_head) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(int64_t, n_head);
  HAP_ARG(bool, bias) = true;
  HAP_ARG(double, dropout) = 0.0;  // on the attention weights and on the output
  HAP_ARG(bool, causal) = true;    // false: every position attends to every other (an encoder)
};

class SelfAttention : public Module {
 public:
  explicit SelfAttention(const SelfAttentionOptions& options);
  // x: [B, T, C] -> [B, T, C]. key_mask: u8 [B, T] (1: a real token, 0: padding no position
  // attends to) or undefined. A position with no key left gets zeros from the attention.
  Tensor forward(const Tensor& x, const Tensor& key_mask = Tensor());
  const SelfAttentionOptions& options() const { return options_; }

  std::shared_ptr<QkvProjection> qkv;  // C -> q, k, v
  std::shared_ptr<Linear> proj;        // C -> C
  std::shared_ptr<Dropout> resid_drop;

 private:
  SelfAttentionOptions options_;
};

// The decoder's attention under its earlier name (causal is SelfAttentionOptions' default).
using CausalSelfAttention = SelfAttention;
using CausalSelfAttentionOptions = SelfAttentionOptions;

// ---- TransformerBlock (pre-norm): x + attn(ln1(x)), then x + mlp(ln2(x)) ----
struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t dim, int64_t n_head) : dim_(dim), n_head_(n_head) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(int64_t, n_head);
  HAP_ARG(bool, bias) = true;
  HAP_ARG(double, dropout) = 0.0;
  HAP_ARG(double, layer_norm_eps) = 1e-5;
  HAP_ARG(bool, causal) = true;  // false: a bidirectional (encoder) block
  HAP_ARG(int64_t, hidden) = 0;  // the MLP's hidden size; 0: 4 x dim
};

class TransformerBlock : public Module {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& options);
  // x: [B, T, C] -> [B, T, C]; key_mask as SelfAttention's.
  Tensor forward(const Tensor& x, const Tensor& key_mask = Tensor());
  const TransformerBlockOptions& options() const { return options_; }

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<MLP> mlp;

 private:
  TransformerBlockOptions options_;
};

}  // namespace hap::nn
