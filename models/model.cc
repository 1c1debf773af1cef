#include "models/model.h"

#include "ops/functional.h"

namespace hap::nn {

std::string input_str(const InputSpec& spec) {
  return spec.name + ": " + dtype_name(spec.dtype) + shape_str(spec.shape) + " (batch dim " +
         std::to_string(spec.batch_dim) + ")";
}

const Tensor& input_of(const Batch& batch, const std::string& name, DType dtype, std::int64_t rank,
                       const std::string& model) {
  auto it = batch.find(name);
  if (it == batch.end()) {
    std::string have;
    for (const auto& [n, _] : batch) have += (have.empty() ? "'" : ", '") + n + "'";
    HAP_CHECK(false, model, ": the batch has no input '", name, "' (it has ",
              have.empty() ? std::string("none") : have, ")");
  }
  const Tensor& t = it->second;
  HAP_CHECK(t.defined() && t.dtype() == dtype && t.dim() == rank, model, ": input '", name,
            "' must be ", dtype_name(dtype), " with ", rank, " dims, got ",
            t.defined() ? t.str() : "an undefined tensor");
  return t;
}

void check_class_indices(const Tensor& ids, std::int64_t classes, const std::string& model,
                         const char* what, std::optional<std::int64_t> ignore_index) {
  if (!ids.has_storage()) return;
  Tensor c = ids.to(Device::cpu()).contiguous();
  const std::int64_t* p = c.data<std::int64_t>();
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    if (ignore_index && p[i] == *ignore_index) continue;
    HAP_CHECK(p[i] >= 0 && p[i] < classes, model, ": ", what, " ", p[i], " at flat position ", i,
              " is outside [0, ", classes, ")",
              ignore_index ? " and is not the ignore index " + std::to_string(*ignore_index)
                           : std::string());
  }
}

std::vector<InputSpec> image_classifier_inputs(std::int64_t batch, std::int64_t channels,
                                               std::int64_t size, std::int64_t classes) {
  return {{"images", {batch, channels, size, size}, DType::F32, 0, 0, false},
          {"labels", {batch}, DType::I64, 0, classes, false}};
}

Tensor image_classification_loss(const Batch& batch, std::int64_t classes, const std::string& model,
                                 const std::function<Tensor(const Tensor&)>& forward) {
  const Tensor& images = input_of(batch, "images", DType::F32, 4, model);
  const Tensor& labels = input_of(batch, "labels", DType::I64, 1, model);
  check_class_indices(labels, classes, model, "label");
  HAP_CHECK(labels.size(0) == images.size(0), model, ": ", labels.size(0), " labels for ",
            images.size(0), " images");
  return cross_entropy(forward(images), labels);
}

}  // namespace hap::nn
