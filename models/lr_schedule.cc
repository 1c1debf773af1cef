#include "models/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace hap::optim {

void WarmupCosineSchedule::validate() const {
  HAP_CHECK(lr >= 0, "lr schedule: lr must be >= 0, got ", lr);
  HAP_CHECK(min_lr >= 0, "lr schedule: min_lr must be >= 0, got ", min_lr);
  HAP_CHECK(warmup_steps >= 0, "lr schedule: warmup_steps must be >= 0, got ", warmup_steps);
  HAP_CHECK(total_steps >= 0, "lr schedule: total_steps must be >= 0, got ", total_steps);
}

double WarmupCosineSchedule::at(int64_t step) const {
  validate();
  HAP_CHECK(step >= 0, "lr schedule: step must be >= 0, got ", step);
  if (step < warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  double ratio = static_cast<double>(step - warmup_steps) /
                 static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  ratio = std::clamp(ratio, 0.0, 1.0);
  double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
  return min_lr + coeff * (lr - min_lr);
}

double warmup_cosine_lr(int64_t step, double lr, double min_lr, int64_t warmup_steps,
                        int64_t total_steps) {
  return WarmupCosineSchedule{lr, min_lr, warmup_steps, total_steps}.at(step);
}

}  // namespace hap::optim
