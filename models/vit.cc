#include "models/vit.h"

#include "ops/functional.h"

namespace hap::nn {

void ViTConfig::validate() const {
  HAP_CHECK(image_size >= 1 && patch_size >= 1 && image_size % patch_size == 0,
            "ViTConfig: patch_size (", patch_size, ") must divide image_size (", image_size, ")");
  HAP_CHECK(in_channels >= 1 && num_classes >= 1 && n_layer >= 1 && n_head >= 1 && hidden >= 1,
            "ViTConfig: in_channels, num_classes, n_layer, n_head and hidden must be >= 1");
  HAP_CHECK(n_embd >= 1 && n_embd % n_head == 0, "ViTConfig: n_embd (", n_embd,
            ") must be a positive multiple of n_head (", n_head, ")");
  HAP_CHECK(dropout >= 0.0 && dropout < 1.0, "ViTConfig: dropout must be in [0, 1), got ", dropout);
  HAP_CHECK(layer_norm_eps > 0.0, "ViTConfig: layer_norm_eps must be > 0, got ", layer_norm_eps);
}

ViT::ViT(const ViTConfig& config) : Model("ViT"), config_(config) {
  config.validate();
  const int64_t C = config.n_embd, P = config.patch_size;
  patch = register_module(
      "patch", std::make_shared<Conv2d>(Conv2dOptions(config.in_channels, C, P).stride(P)));
  cls_token = register_parameter("cls_token", Tensor::zeros({1, 1, C}));
  pos_embed = register_parameter("pos_embed", Tensor::zeros({1, config.num_patches() + 1, C}));
  drop = register_module("drop", std::make_shared<Dropout>(config.dropout));
  blocks = register_module("blocks", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < config.n_layer; ++i)
    blocks->push_back(
        std::make_shared<TransformerBlock>(TransformerBlockOptions(C, config.n_head)
                                               .causal(false)
                                               .hidden(config.hidden)
                                               .dropout(config.dropout)
                                               .layer_norm_eps(config.layer_norm_eps)));
  ln_f = register_module(
      "ln_f", std::make_shared<LayerNorm>(LayerNormOptions(C).eps(config.layer_norm_eps)));
  head = register_module("head", std::make_shared<Linear>(LinearOptions(C, config.num_classes)));
  reset_parameters(config.seed);
  set_random_seed(config.seed);
}

std::optional<ParamInit> ViT::init_rule(const std::string& name, const Tensor&) const {
  if (name == "patch.weight" || name == "cls_token" || name == "pos_embed")
    return ParamInit::normal(0.0, 0.02);
  return std::nullopt;
}

Tensor ViT::forward(const Tensor& images) {
  const ViTConfig& c = config_;
  HAP_CHECK(images.defined() && images.dim() == 4 && images.size(1) == c.in_channels &&
                images.size(2) == c.image_size && images.size(3) == c.image_size,
            "ViT: images must be [B, ", c.in_channels, ", ", c.image_size, ", ", c.image_size,
            "], got ", images.defined() ? shape_str(images.shape()) : "undefined");
  const int64_t B = images.size(0), C = c.n_embd, N = c.num_patches();
  Tensor x = patch->forward(images);                 // [B, C, S/P, S/P]
  x = transpose(reshape(x, {B, C, N}), 1, 2);        // [B, N, C]
  x = concat({expand(cls_token, {B, 1, C}), x}, 1);  // [B, N + 1, C]
  x = drop->forward(x + pos_embed);
  for (size_t i = 0; i < blocks->size(); ++i) x = blocks->at<TransformerBlock>(i)->forward(x);
  x = ln_f->forward(x);
  Tensor logits = head->forward(reshape(slice(x, 1, 0, 1), {B, C}));  // the class token
  if (is_training()) advance_random_step();
  return logits;
}

std::vector<InputSpec> ViT::inputs(int64_t batch_size) const {
  return image_classifier_inputs(batch_size, config_.in_channels, config_.image_size,
                                 config_.num_classes);
}

Tensor ViT::loss(const Batch& batch) {
  return image_classification_loss(batch, config_.num_classes, "vit",
                                   [this](const Tensor& images) { return forward(images); });
}

ModelEntry vit_model_entry() {
  ModelEntry e;
  e.name = "vit";
  e.summary =
      "Vision Transformer: patch embedding, class token, bidirectional pre-norm blocks "
      "(inputs images f32 [batch, C, S, S], labels i64 [batch])";
  e.data = "images";
  e.options = {
      OptionSpec::integer("image_size", 32, 1, 65536, "image height and width"),
      OptionSpec::integer("patch_size", 4, 1, 65536, "patch height and width, dividing image_size"),
      OptionSpec::integer("in_channels", 3, 1, 65536, "image channels"),
      OptionSpec::integer("num_classes", 10, 1, kMaxDimension, "classes"),
      OptionSpec::integer("n_layer", 12, 1, 10000, "transformer blocks"),
      OptionSpec::integer("n_head", 12, 1, kMaxDimension, "attention heads per block"),
      OptionSpec::integer("n_embd", 768, 1, kMaxDimension, "token width, a multiple of n_head"),
      OptionSpec::integer("hidden", 3072, 1, kMaxDimension, "the MLP's hidden size"),
      OptionSpec::number("dropout", 0.0, 0.0, 1.0, "dropout probability").max_open(),
  };
  e.check = [](const Options& o, int64_t B) {
    const int64_t S = o.integer("image_size"), P = o.integer("patch_size");
    const int64_t C = o.integer("n_embd"), H = o.integer("hidden");
    if (S % P != 0)
      throw OptionError("patch_size",
                        "a divisor of model.image_size = " + number_text(S) + " (whole patches)");
    if (C % o.integer("n_head") != 0)
      throw OptionError("n_embd",
                        "a multiple of model.n_head = " + number_text(o.integer("n_head")));
    const int64_t T = (S / P) * (S / P) + 1;
    check_elements("patch_size", "the position embedding",
                   {{"(image_size / patch_size)^2 + 1", T}, {"model.n_embd", C}});
    check_elements("hidden", "an MLP weight", {{"model.hidden", H}, {"model.n_embd", C}});
    check_elements("hidden", "the MLP's hidden activation",
                   {{"train.batch_size", B}, {"tokens", T}, {"model.hidden", H}});
    check_elements("n_embd", "the attention scores of one head",
                   {{"train.batch_size", B}, {"tokens", T}, {"tokens", T}});
  };
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    ViTConfig c;
    c.image_size = o.integer("image_size");
    c.patch_size = o.integer("patch_size");
    c.in_channels = o.integer("in_channels");
    c.num_classes = o.integer("num_classes");
    c.n_layer = o.integer("n_layer");
    c.n_head = o.integer("n_head");
    c.n_embd = o.integer("n_embd");
    c.hidden = o.integer("hidden");
    c.dropout = o.number("dropout");
    c.seed = seed;
    return std::make_shared<ViT>(c);
  };
  return e;
}

}  // namespace hap::nn
