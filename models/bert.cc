#include "models/bert.h"

#include "ops/functional.h"

namespace hap::nn {

void BERTConfig::validate() const {
  HAP_CHECK(vocab_size >= 1 && seq_len >= 1 && n_layer >= 1 && n_head >= 1 && hidden >= 1,
            "BERTConfig: vocab_size, seq_len, n_layer, n_head and hidden must be >= 1");
  HAP_CHECK(n_embd >= 1 && n_embd % n_head == 0, "BERTConfig: n_embd (", n_embd,
            ") must be a positive multiple of n_head (", n_head, ")");
  HAP_CHECK(objective == "causal" || objective == "mlm",
            "BERTConfig: objective must be 'causal' or 'mlm', got '", objective, "'");
  HAP_CHECK(mask_prob > 0.0 && mask_prob <= 1.0, "BERTConfig: mask_prob must be in (0, 1], got ",
            mask_prob);
  HAP_CHECK(dropout >= 0.0 && dropout < 1.0, "BERTConfig: dropout must be in [0, 1), got ",
            dropout);
  HAP_CHECK(layer_norm_eps > 0.0, "BERTConfig: layer_norm_eps must be > 0, got ", layer_norm_eps);
  if (num_experts > 0) {
    HAP_CHECK(top_k >= 1 && top_k <= num_experts,
              "BERTConfig: top_k must be in [1, num_experts = ", num_experts, "], got ", top_k);
    HAP_CHECK(capacity_factor > 0, "BERTConfig: capacity_factor must be > 0, got ",
              capacity_factor);
    HAP_CHECK(aux_loss_coef >= 0, "BERTConfig: aux_loss_coef must be >= 0, got ", aux_loss_coef);
  }
}

BERT::BERT(const BERTConfig& config) : Model("BERT"), config_(config) {
  config.validate();
  const int64_t C = config.n_embd, V = config.table_size();
  wte = register_module("wte", std::make_shared<Embedding>(EmbeddingOptions(V, C)));
  wpe = register_module("wpe", std::make_shared<Embedding>(EmbeddingOptions(config.seq_len, C)));
  ln_emb = register_module(
      "ln_emb", std::make_shared<LayerNorm>(LayerNormOptions(C).eps(config.layer_norm_eps)));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    const auto block = TransformerBlockOptions(C, config.n_head)
                           .causal(!config.mlm())
                           .hidden(config.hidden)
                           .dropout(config.dropout)
                           .layer_norm_eps(config.layer_norm_eps);
    if (config.num_experts > 0 && i % 2 == 1)
      blocks->push_back(
          std::make_shared<MoEBlock>(block, MoEOptions(C, config.hidden, config.num_experts)
                                                .top_k(config.top_k)
                                                .capacity_factor(config.capacity_factor)
                                                .dropout(config.dropout)));
    else
      blocks->push_back(std::make_shared<TransformerBlock>(block));
  }
  ln_f = register_module(
      "ln_f", std::make_shared<LayerNorm>(LayerNormOptions(C).eps(config.layer_norm_eps)));
  head = register_module("head", std::make_shared<Module>("BERTHead"));
  head_dense = head->register_module("dense", std::make_shared<Linear>(LinearOptions(C, C)));
  head_ln = head->register_module(
      "ln", std::make_shared<LayerNorm>(LayerNormOptions(C).eps(config.layer_norm_eps)));
  head_bias = head->register_parameter("bias", Tensor::zeros({V}));
  reset_parameters(config.seed);
  set_random_seed(config.seed);
}

std::optional<ParamInit> BERT::init_rule(const std::string& name, const Tensor&) const {
  if (name == "head.bias") return ParamInit::zeros();
  return std::nullopt;
}

Tensor BERT::forward(const Tensor& idx) {
  const BERTConfig& c = config_;
  HAP_CHECK(
      idx.defined() && idx.dtype() == DType::I64 && idx.dim() == 2 && idx.size(1) == c.seq_len,
      "BERT: idx must be i64 [B, ", c.seq_len, "], got ", idx.defined() ? idx.str() : "undefined");
  const int64_t V = c.table_size();
  if (idx.has_storage()) check_class_indices(idx, V, "bert", "token id");
  Tensor x = wte->forward(idx) + wpe->weight;  // [B, T, C]
  x = drop->forward(ln_emb->forward(x));
  aux_total_ = Tensor();
  for (size_t i = 0; i < blocks->size(); ++i) {
    if (auto moe = std::dynamic_pointer_cast<MoEBlock>((*blocks)[i])) {
      x = moe->forward(x);
      // A running sum, so that one scalar (not one per MoE block) stays live to the loss.
      const Tensor& aux = moe->moe->aux_loss();
      aux_total_ = aux_total_.defined() ? aux_total_ + aux : aux;
    } else
      x = blocks->at<TransformerBlock>(i)->forward(x);
  }
  x = ln_f->forward(x);
  x = head_ln->forward(gelu(head_dense->forward(x)));
  Tensor logits = linear(x, wte->weight, head_bias);  // [B, T, V]
  if (is_training()) advance_random_step();
  return logits;
}

std::pair<Tensor, Tensor> BERT::masked(const Tensor& idx) const {
  // The root's own stream of the step (module index 0 draws nothing else); evaluation uses the
  // draw of step 0, so every evaluation masks its batches alike.
  const uint64_t step = is_training() ? random_step() : 0;
  const uint64_t stream = step * kRandomStreamsPerStep + module_index();
  return mask_tokens(idx, config_.mask_prob, config_.vocab_size, config_.vocab_size, random_seed(),
                     stream);
}

std::vector<InputSpec> BERT::inputs(int64_t batch_size) const {
  const int64_t T = config_.seq_len, V = config_.vocab_size;
  if (config_.mlm()) return {{"idx", {batch_size, T}, DType::I64, 0, V, false}};
  return {{"idx", {batch_size, T}, DType::I64, 0, V, false},
          {"targets", {batch_size, T}, DType::I64, 0, V, true}};
}

Tensor BERT::loss(const Batch& batch) {
  const Tensor& idx = input_of(batch, "idx", DType::I64, 2, "bert");
  const int64_t V = config_.table_size();
  if (config_.mlm()) {
    if (idx.has_storage()) check_class_indices(idx, config_.vocab_size, "bert", "token id");
    auto [corrupted, targets] = masked(idx);
    return with_aux_loss(
        cross_entropy(reshape(forward(corrupted), {-1, V}), reshape(targets, {-1}), -100));
  }
  const Tensor& targets = input_of(batch, "targets", DType::I64, 2, "bert");
  HAP_CHECK(targets.shape() == idx.shape(), "bert: targets ", shape_str(targets.shape()),
            " and idx ", shape_str(idx.shape()), " differ in shape");
  if (targets.has_storage())
    check_class_indices(targets, config_.vocab_size, "bert", "target", int64_t{-100});
  return with_aux_loss(cross_entropy(reshape(forward(idx), {-1, V}), reshape(targets, {-1}), -100));
}

Tensor BERT::with_aux_loss(const Tensor& loss) const {
  if (!aux_total_.defined() || config_.aux_loss_coef == 0) return loss;
  return loss + aux_total_ * config_.aux_loss_coef;
}

namespace {

std::vector<OptionSpec> bert_options() {
  return {
      OptionSpec::integer("vocab_size", 256, 1, kMaxDimension, "tokens in the vocabulary"),
      OptionSpec::integer("seq_len", 128, 1, kMaxDimension, "tokens per sequence"),
      OptionSpec::integer("n_layer", 12, 1, 10000, "transformer blocks"),
      OptionSpec::integer("n_head", 12, 1, kMaxDimension, "attention heads per block"),
      OptionSpec::integer("n_embd", 768, 1, kMaxDimension, "token width, a multiple of n_head"),
      OptionSpec::integer("hidden", 3072, 1, kMaxDimension, "the MLP's hidden size"),
      OptionSpec::number("dropout", 0.0, 0.0, 1.0, "dropout probability").max_open(),
      OptionSpec::string("objective", "causal",
                         "causal: next-token loss under a causal mask; mlm: masked-LM, "
                         "bidirectional",
                         {"causal", "mlm"}),
      OptionSpec::number("mask_prob", 0.15, 0.0, 1.0, "mlm: share of positions predicted")
          .min_open(),
  };
}

void check_bert(const Options& o, int64_t B) {
  const int64_t C = o.integer("n_embd"), H = o.integer("hidden"), T = o.integer("seq_len");
  const int64_t V = o.integer("vocab_size") + (o.string("objective") == "mlm" ? 1 : 0);
  if (C % o.integer("n_head") != 0)
    throw OptionError("n_embd", "a multiple of model.n_head = " + number_text(o.integer("n_head")));
  check_elements("n_embd", "the token embedding", {{"model.vocab_size", V}, {"model.n_embd", C}});
  check_elements("hidden", "an MLP weight", {{"model.hidden", H}, {"model.n_embd", C}});
  check_elements("hidden", "the MLP's hidden activation",
                 {{"train.batch_size", B}, {"model.seq_len", T}, {"model.hidden", H}});
  check_elements("vocab_size", "the logits",
                 {{"train.batch_size", B}, {"model.seq_len", T}, {"model.vocab_size", V}});
}

BERTConfig bert_config_of(const Options& o, uint64_t seed) {
  BERTConfig c;
  c.vocab_size = o.integer("vocab_size");
  c.seq_len = o.integer("seq_len");
  c.n_layer = o.integer("n_layer");
  c.n_head = o.integer("n_head");
  c.n_embd = o.integer("n_embd");
  c.hidden = o.integer("hidden");
  c.dropout = o.number("dropout");
  c.objective = o.string("objective");
  c.mask_prob = o.number("mask_prob");
  c.seed = seed;
  return c;
}

}  // namespace

ModelEntry bert_model_entry() {
  ModelEntry e;
  e.name = "bert";
  e.summary =
      "BERT encoder: causal next-token (the paper's setting) or bidirectional masked-LM "
      "(inputs idx [, targets]: i64 [batch, seq_len])";
  e.data = "bytes";
  e.options = bert_options();
  e.check = check_bert;
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    return std::make_shared<BERT>(bert_config_of(o, seed));
  };
  return e;
}

ModelEntry bert_moe_model_entry() {
  ModelEntry e;
  e.name = "bert_moe";
  e.summary =
      "BERT with a top-k mixture of experts in every second block (GShard routing per "
      "sequence, capacity, load-balancing loss)";
  e.data = "bytes";
  e.options = bert_options();
  e.options.push_back(OptionSpec::integer("num_experts", 8, 1, 65536,
                                          "experts per MoE block (the paper: 2 x devices)"));
  e.options.push_back(
      OptionSpec::integer("top_k", 2, 1, 65536, "experts each token is sent to, <= num_experts"));
  e.options.push_back(OptionSpec::number("capacity_factor", 2.5, 0.0, 1e6,
                                         "slots per expert = ceil(seq_len x this / num_experts)")
                          .min_open());
  e.options.push_back(
      OptionSpec::number("aux_loss_coef", 0.01, 0.0, 1e6, "weight of the load-balancing loss"));
  e.check = [](const Options& o, int64_t B) {
    check_bert(o, B);
    const int64_t E = o.integer("num_experts"), C = o.integer("n_embd"), H = o.integer("hidden");
    if (o.integer("top_k") > E)
      throw OptionError("top_k", "at most model.num_experts = " + number_text(E));
    check_elements("num_experts", "an MoE block's expert weights",
                   {{"model.num_experts", E}, {"model.n_embd", C}, {"model.hidden", H}});
  };
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    BERTConfig c = bert_config_of(o, seed);
    c.num_experts = o.integer("num_experts");
    c.top_k = o.integer("top_k");
    c.capacity_factor = o.number("capacity_factor");
    c.aux_loss_coef = o.number("aux_loss_coef");
    return std::make_shared<BERT>(c);
  };
  return e;
}

}  // namespace hap::nn
