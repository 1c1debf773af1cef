#include "train/trace.h"

#include "ops/dispatch.h"

namespace hap::train {

synth::Graph trace_model(nn::Model& model, std::int64_t batch_size, DType precision) {
  const std::vector<nn::InputSpec> specs = model.inputs(batch_size);
  // The shape-only batch sits on the parameters' device, as a real batch would.
  Device device = Device::cpu();
  for (const auto& [name, p] : model.named_parameters()) {
    device = p.device();
    break;
  }
  nn::Batch batch;
  std::vector<std::pair<std::string, Tensor>> inputs;
  for (const nn::InputSpec& s : specs) {
    HAP_CHECK(s.batch_dim >= 0 && s.batch_dim < static_cast<int64_t>(s.shape.size()) &&
                  s.shape[static_cast<size_t>(s.batch_dim)] == batch_size,
              "the model declares the input ", nn::input_str(s),
              " whose batch dim does not hold the ", batch_size, " examples of the batch");
    Tensor t = Tensor::meta(s.shape, s.dtype, device);
    batch[s.name] = t;
    inputs.emplace_back(s.name, t);
  }
  const bool was_training = model.is_training();
  const uint64_t step = model.random_step();
  model.train();
  model.set_random_step(0);
  synth::Graph g = synth::trace(
      [&] {
        ops::AutocastGuard mixed(precision);  // its casts become nodes of the graph
        return model.loss(batch);
      },
      model.named_parameters(), inputs, model.named_buffers());
  model.set_random_step(step);
  model.train(was_training);
  return g;
}

}  // namespace hap::train
