// A user-defined model through the public API only: a 2-layer MLP regressor, trained with AdamW
// on synthetic data. Exits 0 if the final loss is below 10% of the initial loss.
#include <hap/hap.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

// y = fc2(tanh(fc1(x))): [N, in] -> [N, 1]
class Regressor : public hap::nn::Module {
 public:
  Regressor(int64_t in, int64_t hidden) : Module("Regressor") {
    fc1 = register_module("fc1",
                          std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(in, hidden)));
    fc2 = register_module("fc2",
                          std::make_shared<hap::nn::Linear>(hap::nn::LinearOptions(hidden, 1)));
  }

  hap::Tensor forward(const hap::Tensor& x) const {
    return fc2->forward(hap::tanh(fc1->forward(x)));
  }

  // Scaled initialisation for a small tanh network (the layers default to GPT-2's N(0, 0.02)).
  std::optional<hap::nn::ParamInit> init_rule(const std::string& name,
                                              const hap::Tensor& p) const override {
    if (name.ends_with(".weight"))
      return hap::nn::ParamInit::normal(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));
    return std::nullopt;
  }

  std::shared_ptr<hap::nn::Linear> fc1, fc2;
};

// Targets of a smooth nonlinear function of the inputs.
hap::Tensor targets_for(const hap::Tensor& x) {
  std::vector<double> v = x.to_vector(), y;
  const int64_t n = x.size(0), d = x.size(1);
  for (int64_t i = 0; i < n; ++i) {
    const double* r = &v[i * d];
    y.push_back(std::sin(r[0]) + 0.5 * r[1] * r[2] - 0.3 * r[0] * r[0]);
  }
  return hap::Tensor::from_vector(y, {n, 1});
}

}  // namespace

int main() {
  const int64_t kSamples = 256, kInputs = 3, kHidden = 64, kSteps = 200;
  auto model = std::make_shared<Regressor>(kInputs, kHidden);
  model->reset_parameters(/*seed=*/2024);

  hap::Tensor x = hap::randn({kSamples, kInputs}, /*seed=*/7);
  hap::Tensor y = targets_for(x);

  hap::optim::AdamW opt(hap::optim::weight_decay_groups(model->named_parameters(), 1e-4),
                        {.lr = 1e-2, .betas = {0.9, 0.999}, .eps = 1e-8, .weight_decay = 1e-4});
  hap::optim::WarmupCosineSchedule schedule{
      .lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 10, .total_steps = kSteps};
  double initial = 0, last = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    hap::Tensor diff = model->forward(x) - y;
    hap::Tensor loss = hap::mean(diff * diff);
    loss.backward();
    hap::nn::clip_grad_norm_(model->parameters(), 1.0);
    opt.set_lr(schedule.at(step));
    opt.step();
    last = loss.item();
    if (step == 0) initial = last;
    if (step % 20 == 0 || step == kSteps - 1)
      std::printf("step %3lld  loss %.6f\n", static_cast<long long>(step), last);
  }
  const bool ok = last < 0.1 * initial;
  std::printf("initial loss %.6f, final loss %.6f (%.1f%% of initial): %s\n", initial, last,
              100.0 * last / initial, ok ? "ok" : "did not converge");
  return ok ? 0 : 1;
}
