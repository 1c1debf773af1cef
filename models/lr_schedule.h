// Learning-rate schedule: linear warmup, then cosine decay to a floor (nanoGPT's get_lr).
#pragma once
#include <cstdint>

namespace hap::optim {

struct WarmupCosineSchedule {
  double lr = 0;             // peak learning rate, reached at the end of warmup
  double min_lr = 0;         // the floor at the end of the decay
  int64_t warmup_steps = 0;  // linear warmup over steps [0, warmup_steps)
  int64_t total_steps = 0;   // the decay ends here; later steps stay at min_lr

  // Throws naming the first bad field (lr, min_lr >= 0; warmup_steps, total_steps >= 0).
  void validate() const;
  // The learning rate of 0-based step `step`:
  //   step < warmup:  lr * (step + 1) / warmup
  //   otherwise:      ratio = (step - warmup) / max(1, total - warmup), clamped to [0, 1],
  //                   min_lr + 0.5 * (1 + cos(pi * ratio)) * (lr - min_lr)
  double at(int64_t step) const;
};

// WarmupCosineSchedule{lr, min_lr, warmup_steps, total_steps}.at(step).
double warmup_cosine_lr(int64_t step, double lr, double min_lr, int64_t warmup_steps,
                        int64_t total_steps);

}  // namespace hap::optim
