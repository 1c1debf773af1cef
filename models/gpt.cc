#include "models/gpt.h"

#include <cmath>

#include "ops/dispatch.h"
#include "ops/functional.h"

namespace hap::nn {

void GPTConfig::validate() const {
  HAP_CHECK(vocab_size >= 1, "GPTConfig: vocab_size must be >= 1, got ", vocab_size);
  HAP_CHECK(block_size >= 1, "GPTConfig: block_size must be >= 1, got ", block_size);
  HAP_CHECK(n_layer >= 1, "GPTConfig: n_layer must be >= 1, got ", n_layer);
  HAP_CHECK(n_head >= 1, "GPTConfig: n_head must be >= 1, got ", n_head);
  HAP_CHECK(n_embd >= 1, "GPTConfig: n_embd must be >= 1, got ", n_embd);
  HAP_CHECK(n_embd % n_head == 0, "GPTConfig: n_embd (", n_embd, ") must be a multiple of n_head (",
            n_head, ")");
  HAP_CHECK(dropout >= 0.0 && dropout < 1.0, "GPTConfig: dropout must be in [0, 1), got ", dropout);
  HAP_CHECK(layer_norm_eps > 0.0, "GPTConfig: layer_norm_eps must be > 0, got ", layer_norm_eps);
}

int64_t GPTConfig::num_parameters() const {
  int64_t C = n_embd, b = bias ? 1 : 0;
  int64_t per_block = 12 * C * C + 2 * C * (1 + b) + b * (3 * C + C + 4 * C + C);
  return vocab_size * C + block_size * C + n_layer * per_block + C * (1 + b);
}

GPT::GPT(const GPTConfig& config) : Module("GPT"), config_(config) {
  config.validate();
  int64_t C = config.n_embd;
  wte = register_module("wte", std::make_shared<Embedding>(EmbeddingOptions(config.vocab_size, C)));
  wpe = register_module("wpe", std::make_shared<Embedding>(EmbeddingOptions(config.block_size, C)));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    auto block = std::make_shared<TransformerBlock>(TransformerBlockOptions(C, config.n_head)
                                                        .bias(config.bias)
                                                        .dropout(config.dropout)
                                                        .layer_norm_eps(config.layer_norm_eps));
    blocks->push_back(block);
    block_list_.push_back(block);
  }
  ln_f = register_module("ln_f",
                         std::make_shared<LayerNorm>(
                             LayerNormOptions(C).eps(config.layer_norm_eps).bias(config.bias)));
  reset_parameters(config.seed);
  set_random_seed(config.seed);
}

std::optional<ParamInit> GPT::init_rule(const std::string& name, const Tensor&) const {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  // Residual projections: the residual stream sums 2 n_layer of them (GPT-2 paper, 2.3).
  if (name.rfind("blocks.", 0) == 0 &&
      (ends_with(".attn.proj.weight") || ends_with(".mlp.proj.weight")))
    return ParamInit::normal(0.0,
                             kGpt2InitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer)));
  return std::nullopt;
}

Tensor GPT::forward(const Tensor& idx) {
  HAP_CHECK(idx.defined() && idx.dtype() == DType::I64 && idx.dim() == 2,
            "GPT: idx must be i64 [B, T], got ", idx.defined() ? idx.str() : "undefined");
  int64_t B = idx.size(0), T = idx.size(1), V = config_.vocab_size;
  HAP_CHECK(T >= 1 && T <= config_.block_size, "GPT: sequence length T=", T,
            " must be in [1, block_size=", config_.block_size, "]");
  if (idx.has_storage()) {  // a traced (shape-only) batch has no ids to check
    Tensor ids = idx.contiguous();
    const int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0; i < B * T; ++i)
      HAP_CHECK(p[i] >= 0 && p[i] < V, "GPT: token id ", p[i], " at position [", i / T, ", ", i % T,
                "] of idx is outside [0, vocab_size=", V, ")");
  }
  Tensor x;
  {
    ops::ScopeGuard scope("embed");
    Tensor tok = wte->forward(idx);            // [B, T, C]
    Tensor pos = slice(wpe->weight, 0, 0, T);  // [T, C]
    x = drop->forward(tok + pos);              // [B, T, C]
  }
  for (size_t i = 0; i < block_list_.size(); ++i) {
    ops::ScopeGuard scope("blocks." + std::to_string(i));
    x = block_list_[i]->forward(x);
  }
  ops::ScopeGuard scope("head");
  x = ln_f->forward(x);
  Tensor logits = linear(x, wte->weight);  // [B, T, V]
  if (is_training()) advance_random_step();
  return logits;
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  HAP_CHECK(targets.defined() && targets.dtype() == DType::I64 && targets.dim() == 2,
            "GPT: targets must be i64 [B, T], got ",
            targets.defined() ? targets.str() : "undefined");
  HAP_CHECK(idx.defined() && targets.shape() == idx.shape(), "GPT: targets shape ",
            shape_str(targets.shape()), " differs from idx shape ",
            idx.defined() ? shape_str(idx.shape()) : "undefined");
  int64_t T = targets.size(1), V = config_.vocab_size;
  if (targets.has_storage()) {
    Tensor tg = targets.contiguous();
    const int64_t* p = tg.data<int64_t>();
    for (int64_t i = 0; i < tg.numel(); ++i)
      HAP_CHECK(p[i] == -100 || (p[i] >= 0 && p[i] < V), "GPT: target ", p[i], " at position [",
                i / T, ", ", i % T, "] is outside [0, vocab_size=", V, ") and is not -100");
  }
  Tensor logits = forward(idx);  // [B, T, V]
  return cross_entropy(reshape(logits, {-1, V}), reshape(targets, {-1}), -100);
}

}  // namespace hap::nn
