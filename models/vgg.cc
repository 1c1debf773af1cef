#include "models/vgg.h"

#include "ops/functional.h"

namespace hap::nn {

std::vector<int64_t> VGGConfig::stage_layers() const {
  switch (depth) {
    case 11:
      return {1, 1, 2, 2, 2};
    case 13:
      return {2, 2, 2, 2, 2};
    case 16:
      return {2, 2, 3, 3, 3};
    case 19:
      return {2, 2, 4, 4, 4};
    default:
      HAP_CHECK(false, "VGGConfig: depth must be 11, 13, 16 or 19, got ", depth);
  }
  return {};
}

void VGGConfig::validate() const {
  stage_layers();
  HAP_CHECK(num_classes >= 1, "VGGConfig: num_classes must be >= 1, got ", num_classes);
  HAP_CHECK(image_size >= 32 && image_size % 32 == 0,
            "VGGConfig: image_size must be a positive multiple of 32 (five 2x2 poolings), got ",
            image_size);
  HAP_CHECK(in_channels >= 1 && width >= 1 && hidden >= 1,
            "VGGConfig: in_channels, width and hidden must be >= 1, got ", in_channels, ", ", width,
            " and ", hidden);
  HAP_CHECK(dropout >= 0.0 && dropout < 1.0, "VGGConfig: dropout must be in [0, 1), got ", dropout);
}

namespace {
const int64_t kStageWidth[5] = {1, 2, 4, 8, 8};  // x width
}  // namespace

VGG::VGG(const VGGConfig& config) : Model("VGG"), config_(config) {
  config.validate();
  features = register_module("features", std::make_shared<ModuleList>());
  const std::vector<int64_t> layers = config.stage_layers();
  int64_t channels = config.in_channels;
  for (size_t s = 0; s < layers.size(); ++s) {
    auto stage = std::make_shared<ModuleList>();
    const int64_t out = config.width * kStageWidth[s];
    norms.emplace_back();
    for (int64_t j = 0; j < layers[s]; ++j) {
      // Before a BatchNorm a convolution's bias would be cancelled by the normalisation (its
      // gradient is zero), so it has none.
      stage->push_back(std::make_shared<Conv2d>(
          Conv2dOptions(channels, out, 3).padding(1).bias(!config.batch_norm)));
      channels = out;
    }
    // The stage's norms sit beside its convolutions ("norm{j}"), in the stage's segment.
    if (config.batch_norm)
      for (int64_t j = 0; j < layers[s]; ++j)
        norms.back().push_back(stage->register_module(
            "norm" + std::to_string(j), std::make_shared<BatchNorm>(BatchNormOptions(out))));
    features->push_back(stage);
  }
  const int64_t side = config.image_size / 32;
  classifier_ = register_module("classifier", std::make_shared<Module>("Classifier"));
  fc1 = classifier_->register_module(
      "fc1", std::make_shared<Linear>(LinearOptions(channels * side * side, config.hidden)));
  fc2 = classifier_->register_module(
      "fc2", std::make_shared<Linear>(LinearOptions(config.hidden, config.hidden)));
  head = classifier_->register_module(
      "head", std::make_shared<Linear>(LinearOptions(config.hidden, config.num_classes)));
  drop1_ = classifier_->register_module("drop1", std::make_shared<Dropout>(config.dropout));
  drop2_ = classifier_->register_module("drop2", std::make_shared<Dropout>(config.dropout));
  reset_parameters(config.seed);
  set_random_seed(config.seed);
}

std::optional<ParamInit> VGG::init_rule(const std::string& name, const Tensor&) const {
  if (name.rfind("classifier.", 0) == 0 && name.size() > 7 &&
      name.compare(name.size() - 7, 7, ".weight") == 0)
    return ParamInit::normal(0.0, 0.01);
  return std::nullopt;
}

Tensor VGG::forward(const Tensor& images) {
  const VGGConfig& c = config_;
  HAP_CHECK(images.defined() && images.dim() == 4 && images.size(1) == c.in_channels &&
                images.size(2) == c.image_size && images.size(3) == c.image_size,
            "VGG: images must be [B, ", c.in_channels, ", ", c.image_size, ", ", c.image_size,
            "], got ", images.defined() ? shape_str(images.shape()) : "undefined");
  Tensor x = images;
  for (size_t s = 0; s < features->size(); ++s) {
    auto stage = features->at<ModuleList>(s);
    for (size_t j = 0; j < stage->size(); ++j) {
      x = stage->at<Conv2d>(j)->forward(x);
      if (config_.batch_norm) x = norms[s][j]->forward(x);
      x = relu(x);
    }
    x = max_pool2d(x, {2, 2});
  }
  x = reshape(x, {x.size(0), -1});  // [B, channels x side x side]
  x = drop1_->forward(relu(fc1->forward(x)));
  x = drop2_->forward(relu(fc2->forward(x)));
  Tensor logits = head->forward(x);
  if (is_training()) advance_random_step();
  return logits;
}

std::vector<InputSpec> VGG::inputs(int64_t batch_size) const {
  return image_classifier_inputs(batch_size, config_.in_channels, config_.image_size,
                                 config_.num_classes);
}

Tensor VGG::loss(const Batch& batch) {
  return image_classification_loss(batch, config_.num_classes, "vgg19",
                                   [this](const Tensor& images) { return forward(images); });
}

ModelEntry vgg_model_entry() {
  ModelEntry e;
  e.name = "vgg19";
  e.summary =
      "VGG (CIFAR variant): 3x3 convolutions in 5 stages, fully connected classifier "
      "(inputs images f32 [batch, C, S, S], labels i64 [batch])";
  e.data = "images";
  e.options = {
      OptionSpec::integer("depth", 19, 11, 19, "layers: 11, 13, 16 or 19"),
      OptionSpec::integer("num_classes", 10, 1, kMaxDimension, "classes"),
      OptionSpec::integer("image_size", 32, 32, 65536, "image height and width, a multiple of 32"),
      OptionSpec::integer("in_channels", 3, 1, 65536, "image channels"),
      OptionSpec::integer("width", 64, 1, 65536, "channels of the first stage (x1, 2, 4, 8, 8)"),
      OptionSpec::integer("hidden", 4096, 1, kMaxDimension, "the classifier's hidden width"),
      OptionSpec::number("dropout", 0.0, 0.0, 1.0, "dropout in the classifier").max_open(),
      OptionSpec::boolean("batch_norm", false, "BatchNorm after every convolution (VGG19-BN)"),
  };
  e.check = [](const Options& o, int64_t B) {
    const int64_t depth = o.integer("depth"), S = o.integer("image_size");
    if (depth != 11 && depth != 13 && depth != 16 && depth != 19)
      throw OptionError("depth", "11, 13, 16 or 19");
    if (S % 32 != 0)
      throw OptionError("image_size", "a multiple of 32 (VGG halves the image five times)");
    const int64_t W = o.integer("width"), H = o.integer("hidden");
    check_elements("width", "the first stage's activation",
                   {{"train.batch_size", B},
                    {"model.width", W},
                    {"model.image_size", S},
                    {"model.image_size", S}});
    check_elements("width", "a last-stage weight",
                   {{"8", 8}, {"model.width", W}, {"8", 8}, {"model.width", W}, {"9", 9}});
    check_elements("hidden", "the first classifier weight",
                   {{"model.hidden", H},
                    {"8", 8},
                    {"model.width", W},
                    {"model.image_size / 32", S / 32},
                    {"model.image_size / 32", S / 32}});
    check_elements("hidden", "the second classifier weight",
                   {{"model.hidden", H}, {"model.hidden", H}});
  };
  e.build = [](const Options& o, uint64_t seed) -> std::shared_ptr<Model> {
    VGGConfig c;
    c.depth = o.integer("depth");
    c.num_classes = o.integer("num_classes");
    c.image_size = o.integer("image_size");
    c.in_channels = o.integer("in_channels");
    c.width = o.integer("width");
    c.hidden = o.integer("hidden");
    c.dropout = o.number("dropout");
    c.batch_norm = o.boolean("batch_norm");
    c.seed = seed;
    return std::make_shared<VGG>(c);
  };
  return e;
}

}  // namespace hap::nn
