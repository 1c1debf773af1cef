#include "models/gpt.h"

#include <charconv>
#include <cmath>
#include <initializer_list>

#include "ops/functional.h"

namespace hap::nn {

void GPTConfig::validate() const {
  HAP_CHECK(vocab_size >= 1, "GPTConfig: vocab_size must be >= 1, got ", vocab_size);
  HAP_CHECK(block_size >= 1, "GPTConfig: block_size must be >= 1, got ", block_size);
  HAP_CHECK(seq_len >= 0 && seq_len <= block_size,
            "GPTConfig: seq_len must be in [0, block_size=", block_size,
            "] (0 means block_size), got ", seq_len);
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

GPT::GPT(const GPTConfig& config) : Model("GPT"), config_(config) {
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
    Tensor ids = idx.to(Device::cpu()).contiguous();
    const int64_t* p = ids.data<int64_t>();
    for (int64_t i = 0; i < B * T; ++i)
      HAP_CHECK(p[i] >= 0 && p[i] < V, "GPT: token id ", p[i], " at position [", i / T, ", ", i % T,
                "] of idx is outside [0, vocab_size=", V, ")");
  }
  Tensor tok = wte->forward(idx);            // [B, T, C]
  Tensor pos = slice(wpe->weight, 0, 0, T);  // [T, C]
  Tensor x = drop->forward(tok + pos);       // [B, T, C]
  for (const auto& block : block_list_) x = block->forward(x);
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
    Tensor tg = targets.to(Device::cpu()).contiguous();
    const int64_t* p = tg.data<int64_t>();
    for (int64_t i = 0; i < tg.numel(); ++i)
      HAP_CHECK(p[i] == -100 || (p[i] >= 0 && p[i] < V), "GPT: target ", p[i], " at position [",
                i / T, ", ", i % T, "] is outside [0, vocab_size=", V, ") and is not -100");
  }
  Tensor logits = forward(idx);  // [B, T, V]
  return cross_entropy(reshape(logits, {-1, V}), reshape(targets, {-1}), -100);
}

}  // namespace hap::nn

namespace hap::nn {

std::vector<InputSpec> GPT::inputs(int64_t batch_size) const {
  const int64_t T = config_.seq_len > 0 ? config_.seq_len : config_.block_size;
  const int64_t V = config_.vocab_size;
  return {{"idx", {batch_size, T}, DType::I64, 0, V, false},
          {"targets", {batch_size, T}, DType::I64, 0, V, true}};
}

Tensor GPT::loss(const Batch& batch) {
  return loss(input_of(batch, "idx", DType::I64, 2, "gpt"),
              input_of(batch, "targets", DType::I64, 2, "gpt"));
}

namespace {

GPTConfig gpt_config_of(const Options& o, uint64_t seed) {
  GPTConfig c;
  c.vocab_size = o.integer("vocab_size");
  c.block_size = o.integer("block_size");
  c.seq_len = o.integer("seq_len");
  c.n_layer = o.integer("n_layer");
  c.n_head = o.integer("n_head");
  c.n_embd = o.integer("n_embd");
  c.dropout = o.number("dropout");
  c.bias = o.boolean("bias");
  c.seed = seed;
  return c;
}

}  // namespace

ModelEntry gpt_model_entry() {
  ModelEntry e;
  e.name = "gpt";
  e.summary = "GPT-2: byte or token language model (inputs idx, targets: i64 [batch, seq_len])";
  e.options = {
      OptionSpec::integer("vocab_size", 256, 1, kMaxDimension, "tokens in the vocabulary"),
      OptionSpec::integer("block_size", std::nullopt, 1, kMaxDimension,
                          "maximum sequence length (positions with an embedding)"),
      OptionSpec::integer("seq_len", 0, 0, kMaxDimension,
                          "tokens per training sequence, at most block_size; 0 means block_size"),
      OptionSpec::integer("n_layer", std::nullopt, 1, 10000, "transformer blocks"),
      OptionSpec::integer("n_head", std::nullopt, 1, kMaxDimension, "attention heads per block"),
      OptionSpec::integer("n_embd", std::nullopt, 1, kMaxDimension,
                          "width of the residual stream, a multiple of n_head"),
      OptionSpec::number("dropout", 0.0, 0.0, 1.0, "dropout probability").max_open(),
      OptionSpec::boolean("bias", true, "biases in linear layers and layer norms"),
  };
  e.check = [](const Options& o, int64_t B) {
    const int64_t V = o.integer("vocab_size"), block = o.integer("block_size");
    const int64_t C = o.integer("n_embd"), n_head = o.integer("n_head");
    if (o.integer("seq_len") > block)
      throw OptionError("seq_len", "an integer in [0, model.block_size = " + number_text(block) +
                                       "] (positions past block_size have no embedding)");
    // Attention splits n_embd into n_head equal heads.
    if (C % n_head != 0)
      throw OptionError("n_embd", "a multiple of model.n_head = " + number_text(n_head));
    const int64_t T = o.integer("seq_len") > 0 ? o.integer("seq_len") : block;
    check_elements("n_embd", "the token embedding", {{"model.vocab_size", V}, {"model.n_embd", C}});
    check_elements("n_embd", "the position embedding",
                   {{"model.block_size", block}, {"model.n_embd", C}});
    check_elements("n_embd", "an MLP weight", {{"4", 4}, {"model.n_embd", C}, {"model.n_embd", C}});
    // The largest activations of one step (attention never materialises its [B, H, T, T]).
    check_elements("n_embd", "the MLP's hidden activation",
                   {{"train.batch_size", B}, {"model.seq_len", T}, {"4", 4}, {"model.n_embd", C}});
    check_elements("vocab_size", "the logits",
                   {{"train.batch_size", B}, {"model.seq_len", T}, {"model.vocab_size", V}});
  };
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    return std::make_shared<GPT>(gpt_config_of(o, seed));
  };
  return e;
}

}  // namespace hap::nn
