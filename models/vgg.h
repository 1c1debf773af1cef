// VGG for small images (the CIFAR variant of Simonyan and Zisserman's configurations): stages of
// 3x3 convolutions (padding 1) with ReLU, each stage closed by 2x2 max pooling, then a fully
// connected classifier. VGG19 ("E") has 16 convolutions in 5 stages of 2, 2, 4, 4 and 4 layers
// with width x {1, 2, 4, 8, 8} channels, and the classifier (width x 8 x (S/32)^2) -> hidden ->
// hidden -> classes; HAP's setting is width 64, hidden 4096, 10 classes on 32x32x3 images.
//
// Parameter names: features.{s}.{j}.weight [out, in, 3, 3] / .bias [out] (stage s, layer j), with
// batch_norm also features.{s}.norm{j}.weight / .bias [out] (convolution without bias ->
// BatchNorm -> ReLU),
// classifier.fc1, classifier.fc2, classifier.head (.weight, .bias). Each stage is a segment of
// the plan (its own ratios under per-block synthesis). Initialisation: convolutions He fan-out
// normal, linear weights N(0, 0.01), biases 0 (torchvision's VGG).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/layers.h"
#include "models/model.h"
#include "models/zoo.h"

namespace hap::nn {

struct VGGConfig {
  int64_t depth = 19;  // 11, 13, 16 or 19 convolution + linear layers
  int64_t num_classes = 10;
  int64_t image_size = 32;  // square images, a multiple of 32 (five 2x2 poolings)
  int64_t in_channels = 3;
  int64_t width = 64;       // channels of the first stage
  int64_t hidden = 4096;    // the classifier's hidden width
  double dropout = 0.0;     // before each hidden linear layer of the classifier
  bool batch_norm = false;  // BatchNorm after each convolution (VGG19-BN)
  uint64_t seed = 1337;

  void validate() const;
  // Convolutions per stage for `depth`.
  std::vector<int64_t> stage_layers() const;
};

// Trained as a Model: inputs "images" f32 [B, in_channels, S, S] and "labels" i64 [B]; the loss
// is the mean cross-entropy of the logits.
class VGG : public Model {
 public:
  explicit VGG(const VGGConfig& config);

  // images [B, C, S, S] -> logits [B, num_classes]
  Tensor forward(const Tensor& images);

  std::vector<InputSpec> inputs(int64_t batch_size) const override;
  Tensor loss(const Batch& batch) override;
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const VGGConfig& config() const { return config_; }

  std::shared_ptr<ModuleList> features;  // ModuleList per stage, of Conv2d
  // With batch_norm: per stage, its BatchNorm layers (registered as features.{s}.norm{j}).
  std::vector<std::vector<std::shared_ptr<BatchNorm>>> norms;
  std::shared_ptr<Linear> fc1, fc2, head;

 private:
  VGGConfig config_;
  std::shared_ptr<Module> classifier_;
  std::shared_ptr<Dropout> drop1_, drop2_;
};

// The zoo entry "vgg19" (options depth, num_classes, image_size, in_channels, width, hidden,
// dropout; default data "images").
ModelEntry vgg_model_entry();

}  // namespace hap::nn
