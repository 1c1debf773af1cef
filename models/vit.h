// Vision Transformer (Dosovitskiy et al.) for small images: a patch embedding (a convolution with
// stride = kernel = patch size), a learned class token in front of the patch tokens, learned
// position embeddings, pre-norm bidirectional transformer blocks, a final LayerNorm and a linear
// head on the class token. On 32x32 images with 4x4 patches that is 64 patch tokens plus the
// class token. The paper's size: 12 layers, width 768, MLP 3072, 12 heads.
//
// Parameter names: patch.weight [C, in_channels, P, P] / patch.bias [C], cls_token [1, 1, C],
// pos_embed [1, N + 1, C], blocks.{i}.* (as GPT's blocks, without the causal mask), ln_f.weight /
// .bias [C], head.weight [classes, C] / head.bias [classes]. Each block is a segment of the plan.
// Initialisation: every weight N(0, 0.02) (the patch embedding, class token and positions too),
// biases 0, LayerNorm weights 1.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/layers.h"
#include "models/model.h"
#include "models/zoo.h"

namespace hap::nn {

struct ViTConfig {
  int64_t image_size = 32;  // square images
  int64_t patch_size = 4;   // divides image_size
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t hidden = 3072;  // the MLP's hidden size
  double dropout = 0.0;   // on the embeddings, attention weights, residual branches and MLP
  double layer_norm_eps = 1e-5;
  uint64_t seed = 1337;

  void validate() const;
  // Patch tokens per image (without the class token).
  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// Trained as a Model: inputs "images" f32 [B, in_channels, S, S] and "labels" i64 [B]; the loss
// is the mean cross-entropy of the class token's logits.
class ViT : public Model {
 public:
  explicit ViT(const ViTConfig& config);

  // images [B, C, S, S] -> logits [B, num_classes]
  Tensor forward(const Tensor& images);

  std::vector<InputSpec> inputs(int64_t batch_size) const override;
  Tensor loss(const Batch& batch) override;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const ViTConfig& config() const { return config_; }

  std::shared_ptr<Conv2d> patch;
  Tensor cls_token;  // [1, 1, C]
  Tensor pos_embed;  // [1, N + 1, C]
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> blocks;  // TransformerBlock "0" .. "n_layer-1"
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> head;

 private:
  ViTConfig config_;
};

// The zoo entry "vit" (options image_size, patch_size, in_channels, num_classes, n_layer,
// n_head, n_embd, hidden, dropout; default data "images").
ModelEntry vit_model_entry();

}  // namespace hap::nn
