// Model: a Module that trains. It declares the inputs one training step reads (name, shape for a
// given global batch size, dtype, which dimension is the batch) and computes a scalar loss from
// them. That is all train::Trainer needs to train it on one process or, through trace ->
// synthesize -> executor, on MPI ranks: nothing in the runtime assumes a particular model.
//
//   class Regressor : public hap::nn::Model {
//    public:
//     std::vector<InputSpec> inputs(int64_t batch) const override {
//       return {{"x", {batch, 3}, DType::F32}, {"y", {batch, 1}, DType::F32}};
//     }
//     Tensor loss(const Batch& b) override {
//       Tensor d = forward(b.at("x")) - b.at("y");
//       return hap::mean(d * d);
//     }
//   };
//
// The loss must be a mean over the batch with global counts (sums divided by the number of
// examples or targets), so that the distributed program computes exactly the single-device loss.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "models/module.h"

namespace hap::nn {

// One input of a training step.
struct InputSpec {
  std::string name;
  Shape shape;  // of the whole global batch
  DType dtype = DType::F32;
  std::int64_t batch_dim = 0;  // the dimension that indexes examples (rows)
  // Integer inputs (token ids, labels): values lie in [0, num_classes); 0 when not a class index.
  // `ignore_index` (a target that does not count, -100 by default) is also allowed when
  // `may_ignore`.
  std::int64_t num_classes = 0;
  bool may_ignore = false;
};

// The tensors of one batch (or of this rank's rows of it), by input name.
using Batch = std::map<std::string, Tensor>;

// "idx: i64[16, 128] (batch dim 0)".
std::string input_str(const InputSpec& spec);

class Model : public Module {
 public:
  using Module::Module;

  // The inputs of one training step of `batch_size` examples.
  virtual std::vector<InputSpec> inputs(std::int64_t batch_size) const = 0;

  // The scalar training loss of `batch` (one tensor per declared input, by name). In training
  // mode, dropout draws from the model's random state (models/module.h); the trainer sets the
  // random step before each step, so a model need not advance it.
  virtual Tensor loss(const Batch& batch) = 0;

  // Tokens in one example, for a throughput in tokens/s (a sequence model's sequence length);
  // 0 (the default) when the model does not count in tokens.
  virtual std::int64_t tokens_per_example() const { return 0; }
};

// Finds `name` in `batch`, checking its dtype and rank against what the model declared; throws
// naming the model and the input.
const Tensor& input_of(const Batch& batch, const std::string& name, DType dtype, std::int64_t rank,
                       const std::string& model);

// Checks that every element of `ids` (i64) is a class index in [0, classes), or `ignore_index`
// where allowed; throws naming the model, what the ids are ("label", "target") and the first bad
// one with its position. Tensors without values (traced shapes) pass.
// Image classifiers' inputs: "images" f32 [batch, channels, size, size] and "labels" i64 [batch]
// in [0, classes), both with batch dim 0 (what the dataset "images" gives).
std::vector<InputSpec> image_classifier_inputs(std::int64_t batch, std::int64_t channels,
                                               std::int64_t size, std::int64_t classes);
// The mean cross-entropy of forward(images) against the labels of `batch`, after checking both
// inputs (naming `model`).
Tensor image_classification_loss(const Batch& batch, std::int64_t classes, const std::string& model,
                                 const std::function<Tensor(const Tensor&)>& forward);

void check_class_indices(const Tensor& ids, std::int64_t classes, const std::string& model,
                         const char* what, std::optional<std::int64_t> ignore_index = std::nullopt);

}  // namespace hap::nn
