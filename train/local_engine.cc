// The one-process engine: the model's own forward and autograd.
#include <cstdio>

#include "autograd/grad_mode.h"
#include "models/clip.h"
#include "ops/dispatch.h"
#include "ops/threads.h"
#include "train/engine.h"

namespace hap::train {

void check_batch(const nn::Batch& batch, const std::vector<nn::InputSpec>& inputs,
                 int64_t row_begin, int64_t row_end) {
  for (const nn::InputSpec& spec : inputs) {
    auto it = batch.find(spec.name);
    HAP_CHECK(it != batch.end() && it->second.defined(),
              "the dataset gave no tensor for the input '", spec.name, "' the model declares (",
              nn::input_str(spec), ")");
    Shape want = spec.shape;
    want[static_cast<size_t>(spec.batch_dim)] = row_end - row_begin;
    HAP_CHECK(it->second.shape() == want && it->second.dtype() == spec.dtype, "the dataset gave ",
              it->second.str(), " for rows [", row_begin, ", ", row_end, ") of the input '",
              spec.name, "', expected ", dtype_name(spec.dtype), shape_str(want));
  }
}

namespace {

class LocalEngine : public Engine {
 public:
  LocalEngine(std::shared_ptr<nn::Model> model, std::shared_ptr<Dataset> data,
              const TrainConfig& config)
      : model_(std::move(model)),
        data_(std::move(data)),
        config_(config),
        inputs_(model_->inputs(config.batch_size)),
        params_(model_->named_parameters()),
        buffers_(model_->named_buffers()) {
    for (const auto* list : {&params_, &buffers_})
      for (const auto& [name, p] : *list)
        HAP_CHECK(p.has_storage(), "'", name,
                  "' of the model has no data (was the model built "
                  "under a MetaGuard?); one process trains a model built with its parameters");
    model_->to(config_.device);  // parameters and buffers keep their identities
  }

  const std::vector<std::pair<std::string, Tensor>>& parameters() const override { return params_; }
  const std::vector<std::pair<std::string, Tensor>>& buffers() const override { return buffers_; }

  double forward(uint64_t step, uint64_t random_seed) override {
    model_->train();
    if (model_->random_seed() != random_seed) model_->set_random_seed(random_seed);
    model_->set_random_step(step);
    nn::Batch batch = on_device(data_->read(Split::kTrain, step, 0, config_.batch_size));
    check_batch(batch, inputs_, 0, config_.batch_size);
    {
      ops::AutocastGuard precision(config_.precision);
      loss_ = model_->loss(batch);
    }
    HAP_CHECK(loss_.defined() && loss_.numel() == 1, "the model's loss must be a scalar, got ",
              loss_.defined() ? loss_.str() : "an undefined tensor");
    return loss_.item();
  }

  void backward() override {
    loss_.backward();
    loss_ = Tensor();
  }

  double grad_norm() const override { return nn::grad_norm(model_->parameters()); }

  void update(optim::Optimizer& optimizer, double grad_scale) override {
    optimizer.step(grad_scale);
  }

  double eval_loss(uint64_t index, uint64_t random_seed) override {
    NoGradGuard no_grad;
    model_->eval();
    if (model_->random_seed() != random_seed) model_->set_random_seed(random_seed);
    nn::Batch batch = on_device(data_->read(Split::kVal, index, 0, config_.batch_size));
    check_batch(batch, inputs_, 0, config_.batch_size);
    ops::AutocastGuard precision(config_.precision);
    const double loss = model_->loss(batch).item();
    model_->train();
    return loss;
  }

  Tensor logical(const std::string&, const Tensor& local) const override { return local.detach(); }
  Tensor local_part(const std::string&, const Tensor& full, const Shape&) const override {
    return full;
  }

  bool lead() const override { return true; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  double max_over_ranks(double value) const override { return value; }
  void barrier() const override {}
  std::vector<std::string> gather_strings(const std::string& s) const override { return {s}; }
  std::string track_name() const override { return "one process"; }
  std::string placement() const override { return "one process on " + config_.device.str(); }

  void start_profile() override {
    ops::reset_dispatch_stats();
    ops::set_profiling(true);
  }

  void print_profile(double seconds, int64_t steps) override {
    ops::set_profiling(false);
    if (steps == 0) return;
    std::printf("profile: op kernels over %ld steps (%.1f ms/step):\n%s", static_cast<long>(steps),
                seconds / static_cast<double>(steps) * 1e3, ops::profile_report(25).c_str());
    std::fflush(stdout);
  }

 private:
  // The batch on the training device (datasets read into host memory).
  nn::Batch on_device(nn::Batch batch) const {
    for (auto& [name, t] : batch)
      if (t.defined()) t = t.to(config_.device);
    return batch;
  }

  std::shared_ptr<nn::Model> model_;
  std::shared_ptr<Dataset> data_;
  TrainConfig config_;
  std::vector<nn::InputSpec> inputs_;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  Tensor loss_;
};

}  // namespace

std::unique_ptr<Engine> make_local_engine(std::shared_ptr<nn::Model> model,
                                          std::shared_ptr<Dataset> data,
                                          const TrainConfig& config) {
  set_num_threads(config.threads);
  return std::make_unique<LocalEngine>(std::move(model), std::move(data), config);
}

}  // namespace hap::train
