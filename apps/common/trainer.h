// Single-process training of the configured model on the byte corpus: the loop behind hap-train.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/config.h"
#include "models/optim.h"

namespace hap::app {

struct TrainOptions {
  std::string resume_path;      // checkpoint to resume from ("" = fresh start)
  std::string checkpoint_path;  // checkpoint written at the end ("" = none)
  int64_t stop_after = -1;      // stop after this step (the schedule still spans train.steps)
  bool quiet = false;           // no progress lines on stdout
  bool profile = false;         // print where the step time goes at the end (kernels; collectives)
};

struct TrainSummary {
  int64_t steps_run = 0;
  double first_loss = 0;
  double last_loss = 0;
  double last_val_loss = -1;  // -1 when no evaluation ran
  double median_step_ms = 0;
};

// "N steps, loss a -> b, val loss v, median m ms/step" (parts without data left out).
std::string summary_text(const TrainSummary& s);

// The median of step times (the upper one for an even count); 0 for none.
double median_of(std::vector<double> values);

// AdamW or SGD as train.optimizer says, with weight decay on parameters of dim >= 2 only.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& t,
                                                 const std::vector<std::pair<std::string, Tensor>>& named);

// Trains as configured. Throws hap::Error for bad data, a non-finite loss (naming the step) and
// other run-time failures.
TrainSummary train(const TrainRunConfig& config, const TrainOptions& options);

}  // namespace hap::app
