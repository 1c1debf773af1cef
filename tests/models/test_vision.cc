// The image models of the zoo: their structure at the paper's size (built shape-only), their
// option checks, inputs and losses at a small size.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "models/vgg.h"
#include "models/vit.h"
#include "models/zoo.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap::nn {
namespace {

using test_util::error_of;

int64_t parameter_count(Model& m) {
  int64_t n = 0;
  for (auto& [name, p] : m.named_parameters()) n += p.numel();
  return n;
}

Options options_of(const std::string& model, std::map<std::string, OptionValue> set) {
  Options o(find_model(model).options);
  for (auto& [k, v] : set) o.set(k, v);
  return o;
}

TEST(Vgg, ThePaperSizeHasSixteenConvolutionsInFiveStagesAndA512To4096To4096To10Classifier) {
  MetaGuard meta;
  auto m = build_model(find_model("vgg19"), options_of("vgg19", {}), 32, 1);
  auto& vgg = dynamic_cast<VGG&>(*m);
  // 16 convolutions: 64 64 | 128 128 | 256 x4 | 512 x4 | 512 x4, plus 512-4096-4096-10.
  EXPECT_EQ(parameter_count(*m), 38947914);
  ASSERT_EQ(vgg.features->size(), 5u);
  std::vector<size_t> layers;
  for (size_t s = 0; s < 5; ++s) layers.push_back(vgg.features->at<ModuleList>(s)->size());
  EXPECT_EQ(layers, (std::vector<size_t>{2, 2, 4, 4, 4}));
  auto named = m->named_parameters();
  std::map<std::string, Shape> shapes;
  for (auto& [n, p] : named) shapes[n] = p.shape();
  EXPECT_EQ(shapes.at("features.0.0.weight"), (Shape{64, 3, 3, 3}));
  EXPECT_EQ(shapes.at("features.4.3.weight"), (Shape{512, 512, 3, 3}));
  EXPECT_EQ(shapes.at("classifier.fc1.weight"), (Shape{4096, 512}));
  EXPECT_EQ(shapes.at("classifier.fc2.weight"), (Shape{4096, 4096}));
  EXPECT_EQ(shapes.at("classifier.head.weight"), (Shape{10, 4096}));
  const std::vector<InputSpec> in = m->inputs(32);
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].name, "images");
  EXPECT_EQ(in[0].shape, (Shape{32, 3, 32, 32}));
  EXPECT_EQ(in[1].name, "labels");
  EXPECT_EQ(in[1].num_classes, 10);
  EXPECT_EQ(find_model("vgg19").data, "images");
}

TEST(Vgg, ShallowerDepthsAndLargerImagesChangeTheStagesAndTheClassifier) {
  MetaGuard meta;
  auto m = build_model(find_model("vgg19"),
                       options_of("vgg19", {{"depth", int64_t{11}},
                                            {"image_size", int64_t{64}},
                                            {"width", int64_t{4}},
                                            {"hidden", int64_t{16}}}),
                       2, 1);
  auto& vgg = dynamic_cast<VGG&>(*m);
  std::vector<size_t> layers;
  for (size_t s = 0; s < 5; ++s) layers.push_back(vgg.features->at<ModuleList>(s)->size());
  EXPECT_EQ(layers, (std::vector<size_t>{1, 1, 2, 2, 2}));
  EXPECT_EQ(vgg.fc1->weight.shape(), (Shape{16, 32 * 2 * 2})) << "a 2x2 map after five poolings";
}

TEST(Vgg, OptionsOutsideWhatTheModelCanTakeNameTheKey) {
  const ModelEntry& e = find_model("vgg19");
  auto key_of = [&](std::map<std::string, OptionValue> set) -> std::string {
    try {
      build_model(e, options_of("vgg19", set), 4, 1);
    } catch (const OptionError& err) {
      return err.key() + ": " + err.expectation();
    } catch (const Error& err) {
      return std::string("other: ") + err.what();
    }
    return "no error";
  };
  EXPECT_HAS(key_of({{"depth", int64_t{17}}}), "depth: 11, 13, 16 or 19");
  EXPECT_HAS(key_of({{"image_size", int64_t{48}}}), "image_size: a multiple of 32");
  EXPECT_HAS(key_of({{"image_size", int64_t{16}}}), "image_size");
  EXPECT_HAS(key_of({{"width", int64_t{1} << 16}, {"hidden", int64_t{1} << 20}}), "width");
  EXPECT_HAS(key_of({{"dropout", 1.0}}), "dropout");
}

TEST(Vgg, TheLossIsTheCrossEntropyOfTheLogitsAndRejectsBadLabels) {
  auto m = build_model(
      find_model("vgg19"),
      options_of("vgg19",
                 {{"width", int64_t{2}}, {"hidden", int64_t{8}}, {"num_classes", int64_t{4}}}),
      3, 7);
  auto& vgg = dynamic_cast<VGG&>(*m);
  Tensor images = randn({3, 3, 32, 32}, 5, 0);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{0, 3, 1}, {3});
  m->eval();
  const Tensor logits = vgg.forward(images);
  EXPECT_EQ(logits.shape(), (Shape{3, 4}));
  const double loss = m->loss({{"images", images}, {"labels", labels}}).item();
  EXPECT_NEAR(loss, cross_entropy(logits, labels).item(), 1e-6);
  EXPECT_NEAR(loss, std::log(4.0), 0.05) << "N(0, 0.01) classifier weights: near-uniform guesses";
  Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 4, 1}, {3});
  const std::string m1 = error_of([&] { m->loss({{"images", images}, {"labels", bad}}); });
  EXPECT_HAS(m1, "vgg19");
  EXPECT_HAS(m1, "4");
  EXPECT_HAS(error_of([&] { vgg.forward(randn({3, 3, 16, 16}, 5, 0)); }), "[B, 3, 32, 32]");
}

TEST(Vit, ThePaperSizeHas64PatchTokensPlusAClassTokenAndTwelveBlocksOfWidth768) {
  MetaGuard meta;
  auto m = build_model(find_model("vit"), options_of("vit", {}), 32, 1);
  auto& vit = dynamic_cast<ViT&>(*m);
  EXPECT_EQ(parameter_count(*m), 85152010);
  EXPECT_EQ(vit.blocks->size(), 12u);
  EXPECT_EQ(vit.pos_embed.shape(), (Shape{1, 65, 768}));
  EXPECT_EQ(vit.cls_token.shape(), (Shape{1, 1, 768}));
  EXPECT_EQ(vit.patch->weight.shape(), (Shape{768, 3, 4, 4}));
  EXPECT_EQ(vit.blocks->at<TransformerBlock>(0)->mlp->fc->weight.shape(), (Shape{3072, 768}));
  EXPECT_FALSE(vit.blocks->at<TransformerBlock>(0)->attn->options().causal());
  EXPECT_EQ(find_model("vit").data, "images");
}

TEST(Vit, OptionsOutsideWhatTheModelCanTakeNameTheKey) {
  const ModelEntry& e = find_model("vit");
  auto key_of = [&](std::map<std::string, OptionValue> set) -> std::string {
    try {
      build_model(e, options_of("vit", set), 4, 1);
    } catch (const OptionError& err) {
      return err.key() + ": " + err.expectation();
    }
    return "no error";
  };
  EXPECT_HAS(key_of({{"patch_size", int64_t{5}}}),
             "patch_size: a divisor of model.image_size = 32");
  EXPECT_HAS(key_of({{"n_head", int64_t{7}}}), "n_embd: a multiple of model.n_head = 7");
}

TEST(Vit, EveryPositionSeesEveryOtherAndTheHeadReadsTheClassToken) {
  auto m = build_model(find_model("vit"),
                       options_of("vit", {{"image_size", int64_t{8}},
                                          {"patch_size", int64_t{4}},
                                          {"n_layer", int64_t{1}},
                                          {"n_head", int64_t{2}},
                                          {"n_embd", int64_t{8}},
                                          {"hidden", int64_t{16}},
                                          {"num_classes", int64_t{3}}}),
                       2, 3);
  auto& vit = dynamic_cast<ViT&>(*m);
  m->eval();
  Tensor images = randn({2, 3, 8, 8}, 4, 0);
  const std::vector<double> before = vit.forward(images).to_vector();
  // Changing only the last patch (bottom right) of the first image changes the class token's
  // logits of that image alone: attention is bidirectional and examples are independent.
  std::vector<double> px = images.to_vector();
  for (int c = 0; c < 3; ++c)
    for (int y = 4; y < 8; ++y)
      for (int x = 4; x < 8; ++x) px[(c * 8 + y) * 8 + x] += 1.0;
  std::vector<float> pf(px.begin(), px.end());
  const std::vector<double> after = vit.forward(Tensor::from_vector(pf, {2, 3, 8, 8})).to_vector();
  double changed = 0;
  for (int k = 0; k < 3; ++k) changed += std::abs(after[k] - before[k]);
  EXPECT_GT(changed, 1e-4);
  for (int k = 3; k < 6; ++k) EXPECT_EQ(after[k], before[k]);
  Tensor labels = Tensor::from_vector(std::vector<int64_t>{2, 0}, {2});
  EXPECT_NEAR(m->loss({{"images", images}, {"labels", labels}}).item(),
              cross_entropy(vit.forward(images), labels).item(), 1e-6);
}

}  // namespace
}  // namespace hap::nn
