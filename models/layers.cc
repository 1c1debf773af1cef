#include "models/layers.h"

#include <cmath>

#include "ops/functional.h"

namespace hap::nn {

namespace {

// A parameter drawn with its owner's rule under its local name (seed 0); the root's
// reset_parameters(seed) redraws it under its full name.
Tensor make_param(const Module& owner, const std::string& name, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  init_parameter(t, owner.init_rule(name, t).value_or(ParamInit::zeros()), 0, name);
  return t;
}

}  // namespace

// ---- Linear ----
Linear::Linear(const LinearOptions& options) : Module("Linear"), options_(options) {
  HAP_CHECK(options.in_features() >= 1 && options.out_features() >= 1,
            "Linear: in_features and out_features must be >= 1, got ", options.in_features(),
            " and ", options.out_features());
  weight = register_parameter(
      "weight", make_param(*this, "weight", {options.out_features(), options.in_features()}));
  if (options.bias())
    bias = register_parameter("bias", make_param(*this, "bias", {options.out_features()}));
}

Tensor Linear::forward(const Tensor& x) const {
  auto scope = enter_scope();
  return linear(x, weight, bias);
}

std::optional<ParamInit> Linear::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight") return ParamInit::normal(0.0, kGpt2InitStd);
  if (name == "bias") return ParamInit::zeros();
  return std::nullopt;
}

// ---- Conv2d ----
Conv2d::Conv2d(const Conv2dOptions& o) : Module("Conv2d"), options_(o) {
  HAP_CHECK(o.in_channels() >= 1 && o.out_channels() >= 1 && o.kernel_size() >= 1,
            "Conv2d: in_channels, out_channels and kernel_size must be >= 1, got ", o.in_channels(),
            ", ", o.out_channels(), " and ", o.kernel_size());
  HAP_CHECK(o.stride() >= 1 && o.dilation() >= 1 && o.padding() >= 0, "Conv2d: stride (",
            o.stride(), ") and dilation (", o.dilation(), ") must be >= 1, padding (", o.padding(),
            ") >= 0");
  HAP_CHECK(
      o.groups() >= 1 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
      "Conv2d: groups (", o.groups(), ") must divide in_channels (", o.in_channels(),
      ") and out_channels (", o.out_channels(), ")");
  weight = register_parameter("weight", make_param(*this, "weight",
                                                   {o.out_channels(), o.in_channels() / o.groups(),
                                                    o.kernel_size(), o.kernel_size()}));
  if (o.bias()) bias = register_parameter("bias", make_param(*this, "bias", {o.out_channels()}));
}

Tensor Conv2d::forward(const Tensor& x) const {
  auto scope = enter_scope();
  const Conv2dOptions& o = options_;
  return conv2d(x, weight, bias, {o.stride(), o.stride()}, {o.padding(), o.padding()},
                {o.dilation(), o.dilation()}, o.groups());
}

std::optional<ParamInit> Conv2d::init_rule(const std::string& name, const Tensor&) const {
  const Conv2dOptions& o = options_;
  if (name == "weight") {
    const double fan_out =
        static_cast<double>(o.out_channels() / o.groups() * o.kernel_size() * o.kernel_size());
    return ParamInit::normal(0.0, std::sqrt(2.0 / fan_out));
  }
  if (name == "bias") return ParamInit::zeros();
  return std::nullopt;
}

// ---- Embedding ----
Embedding::Embedding(const EmbeddingOptions& options) : Module("Embedding"), options_(options) {
  HAP_CHECK(options.num_embeddings() >= 1 && options.embedding_dim() >= 1,
            "Embedding: num_embeddings and embedding_dim must be >= 1, got ",
            options.num_embeddings(), " and ", options.embedding_dim());
  weight = register_parameter(
      "weight", make_param(*this, "weight", {options.num_embeddings(), options.embedding_dim()}));
}

Tensor Embedding::forward(const Tensor& ids) const {
  auto scope = enter_scope();
  return embedding(weight, ids);
}

std::optional<ParamInit> Embedding::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight") return ParamInit::normal(0.0, kGpt2InitStd);
  return std::nullopt;
}

// ---- LayerNorm ----
LayerNorm::LayerNorm(const LayerNormOptions& options) : Module("LayerNorm"), options_(options) {
  HAP_CHECK(options.dim() >= 1, "LayerNorm: dim must be >= 1, got ", options.dim());
  HAP_CHECK(options.eps() > 0, "LayerNorm: eps must be > 0, got ", options.eps());
  weight = register_parameter("weight", make_param(*this, "weight", {options.dim()}));
  if (options.bias()) bias = register_parameter("bias", make_param(*this, "bias", {options.dim()}));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  auto scope = enter_scope();
  return layer_norm(x, weight, bias, options_.eps());
}

std::optional<ParamInit> LayerNorm::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight") return ParamInit::ones();
  if (name == "bias") return ParamInit::zeros();
  return std::nullopt;
}

// ---- BatchNorm ----
BatchNorm::BatchNorm(const BatchNormOptions& options) : Module("BatchNorm"), options_(options) {
  HAP_CHECK(options.num_features() >= 1, "BatchNorm: num_features must be >= 1, got ",
            options.num_features());
  HAP_CHECK(options.eps() > 0, "BatchNorm: eps must be > 0, got ", options.eps());
  HAP_CHECK(options.momentum() >= 0 && options.momentum() <= 1,
            "BatchNorm: momentum must be in [0, 1], got ", options.momentum());
  if (options.affine()) {
    weight = register_parameter("weight", make_param(*this, "weight", {options.num_features()}));
    bias = register_parameter("bias", make_param(*this, "bias", {options.num_features()}));
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", Tensor::zeros({options.num_features()}));
    running_var = register_buffer("running_var", Tensor::ones({options.num_features()}));
  }
}

Tensor BatchNorm::forward(const Tensor& x) const {
  auto scope = enter_scope();
  HAP_CHECK(x.defined() && x.dim() >= 2 && x.size(1) == options_.num_features(),
            "BatchNorm: x must be [N, ", options_.num_features(), ", ...], got ",
            x.defined() ? x.str() : "undefined");
  if (!options_.track_running_stats()) return batch_norm(x, weight, bias, options_.eps());
  return batch_norm(x, weight, bias, running_mean, running_var, is_training(), options_.momentum(),
                    options_.eps());
}

std::optional<ParamInit> BatchNorm::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight" || name == "running_var") return ParamInit::ones();
  if (name == "bias" || name == "running_mean") return ParamInit::zeros();
  return std::nullopt;
}

// ---- RMSNorm ----
RMSNorm::RMSNorm(const RMSNormOptions& options) : Module("RMSNorm"), options_(options) {
  HAP_CHECK(options.dim() >= 1, "RMSNorm: dim must be >= 1, got ", options.dim());
  HAP_CHECK(options.eps() > 0, "RMSNorm: eps must be > 0, got ", options.eps());
  weight = register_parameter("weight", make_param(*this, "weight", {options.dim()}));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  auto scope = enter_scope();
  return rms_norm(x, weight, options_.eps());
}

std::optional<ParamInit> RMSNorm::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight") return ParamInit::ones();
  return std::nullopt;
}

// ---- Dropout ----
Dropout::Dropout(const DropoutOptions& options) : Module("Dropout"), options_(options) {
  HAP_CHECK(options.p() >= 0.0 && options.p() < 1.0, "Dropout: p must be in [0, 1), got ",
            options.p());
}

Tensor Dropout::forward(const Tensor& x) {
  auto scope = enter_scope();
  if (!is_training() || options_.p() == 0.0) return x;
  RandomDraw d = next_random_draw();
  return dropout(x, options_.p(), true, d.seed, d.stream);
}

// ---- MLP ----
MLP::MLP(const MLPOptions& options) : Module("MLP"), options_(options) {
  fc = register_module("fc",
                       std::make_shared<Linear>(
                           LinearOptions(options.dim(), options.hidden()).bias(options.bias())));
  proj = register_module("proj",
                         std::make_shared<Linear>(
                             LinearOptions(options.hidden(), options.dim()).bias(options.bias())));
  drop = register_module("drop", std::make_shared<Dropout>(options.dropout()));
}

Tensor MLP::forward(const Tensor& x) {
  auto scope = enter_scope();
  Tensor h = gelu(fc->forward(x), GeluApprox::Tanh);  // [..., hidden]
  return drop->forward(proj->forward(h));
}

// ---- CausalSelfAttention ----
// ---- QkvProjection ----
QkvProjection::QkvProjection(int64_t dim, bool bias) : Module("QkvProjection") {
  HAP_CHECK(dim >= 1, "QkvProjection: dim must be >= 1, got ", dim);
  weight = register_parameter("weight", make_param(*this, "weight", {3, dim, dim}));
  if (bias) this->bias = register_parameter("bias", make_param(*this, "bias", {3, dim}));
}

std::vector<Tensor> QkvProjection::forward(const Tensor& x) const {
  auto scope = enter_scope();
  const int64_t C = weight.size(1);
  std::vector<Tensor> w = split(weight, {1, 1, 1}, 0), b;
  if (bias.defined()) b = split(bias, {1, 1, 1}, 0);
  std::vector<Tensor> out;
  for (size_t i = 0; i < 3; ++i)
    out.push_back(linear(x, reshape(w[i], {C, C}), bias.defined() ? reshape(b[i], {C}) : Tensor()));
  return out;
}

std::optional<ParamInit> QkvProjection::init_rule(const std::string& name, const Tensor&) const {
  if (name == "weight") return ParamInit::normal(0.0, kGpt2InitStd);
  if (name == "bias") return ParamInit::zeros();
  return std::nullopt;
}

SelfAttention::SelfAttention(const SelfAttentionOptions& options)
    : Module("SelfAttention"), options_(options) {
  HAP_CHECK(options.n_head() >= 1 && options.dim() >= 1,
            "SelfAttention: dim and n_head must be >= 1, got ", options.dim(), " and ",
            options.n_head());
  HAP_CHECK(options.dim() % options.n_head() == 0, "SelfAttention: dim (", options.dim(),
            ") must be divisible by n_head (", options.n_head(), ")");
  HAP_CHECK(options.dropout() >= 0.0 && options.dropout() < 1.0,
            "SelfAttention: dropout must be in [0, 1), got ", options.dropout());
  int64_t C = options.dim();
  qkv = register_module("qkv", std::make_shared<QkvProjection>(C, options.bias()));
  proj =
      register_module("proj", std::make_shared<Linear>(LinearOptions(C, C).bias(options.bias())));
  resid_drop = register_module("resid_drop", std::make_shared<Dropout>(options.dropout()));
}

Tensor SelfAttention::forward(const Tensor& x, const Tensor& key_mask) {
  auto scope = enter_scope();
  HAP_CHECK(x.dim() == 3 && x.size(2) == options_.dim(), "SelfAttention: expected x of ",
            "shape [B, T, ", options_.dim(), "], got ", shape_str(x.shape()));
  int64_t B = x.size(0), T = x.size(1), C = options_.dim(), H = options_.n_head(), D = C / H;
  std::vector<Tensor> parts = qkv->forward(x);  // 3 x [B, T, C]
  auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, H, D}), 1, 2); };
  Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);  // [B, H, T, D]
  double p = is_training() ? options_.dropout() : 0.0;
  RandomDraw d = p > 0.0 ? next_random_draw() : RandomDraw{};
  Tensor y =
      scaled_dot_product_attention(q, k, v, options_.causal(), p, d.seed, d.stream, 0.0, key_mask);
  y = reshape(transpose(y, 1, 2), {B, T, C});  // [B, T, C]
  return resid_drop->forward(proj->forward(y));
}

// ---- TransformerBlock ----
TransformerBlock::TransformerBlock(const TransformerBlockOptions& options)
    : Module("TransformerBlock"), options_(options) {
  int64_t C = options.dim();
  auto ln = [&] {
    return std::make_shared<LayerNorm>(
        LayerNormOptions(C).eps(options.layer_norm_eps()).bias(options.bias()));
  };
  ln1 = register_module("ln1", ln());
  attn = register_module("attn",
                         std::make_shared<SelfAttention>(SelfAttentionOptions(C, options.n_head())
                                                             .bias(options.bias())
                                                             .dropout(options.dropout())
                                                             .causal(options.causal())));
  ln2 = register_module("ln2", ln());
  HAP_CHECK(options.hidden() >= 0, "TransformerBlock: hidden must be >= 0 (0: 4 x dim), got ",
            options.hidden());
  MLPOptions mlp_options(C);
  if (options.hidden() > 0) mlp_options.hidden(options.hidden());
  mlp = register_module(
      "mlp", std::make_shared<MLP>(mlp_options.bias(options.bias()).dropout(options.dropout())));
}

Tensor TransformerBlock::forward(const Tensor& x, const Tensor& key_mask) {
  auto scope = enter_scope();
  Tensor h = x + attn->forward(ln1->forward(x), key_mask);
  return h + mlp->forward(ln2->forward(h));
}

}  // namespace hap::nn
