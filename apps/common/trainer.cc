#include "apps/common/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "apps/common/data.h"
#include "apps/common/jsonl_log.h"
#include "apps/common/model_graph.h"
#include "autograd/grad_mode.h"
#include "models/clip.h"
#include "models/gpt.h"
#include "models/lr_schedule.h"
#include "models/optim.h"
#include "models/serialize.h"
#include "ops/dispatch.h"
#include "ops/threads.h"

namespace hap::app {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}


double evaluate(nn::GPT& model, const TextCorpus& corpus, const TrainConfig& t) {
  NoGradGuard no_grad;
  model.eval();
  double sum = 0;
  for (int64_t b = 0; b < t.eval_batches; ++b) {
    Batch batch = corpus.batch(Split::kVal, t.seq_len, t.seed, static_cast<uint64_t>(b), 0, t.batch_size);
    sum += model.loss(batch.idx, batch.targets).item();
  }
  model.train();
  return sum / static_cast<double>(t.eval_batches);
}

}  // namespace

std::string summary_text(const TrainSummary& s) {
  char buf[160];
  std::string out = std::to_string(s.steps_run) + " steps";
  if (s.steps_run > 0) {
    std::snprintf(buf, sizeof buf, ", loss %.4f -> %.4f", s.first_loss, s.last_loss);
    out += buf;
  }
  if (s.last_val_loss >= 0) {
    std::snprintf(buf, sizeof buf, ", val loss %.4f", s.last_val_loss);
    out += buf;
  }
  if (s.steps_run > 0) {
    std::snprintf(buf, sizeof buf, ", median %.1f ms/step", s.median_step_ms);
    out += buf;
  }
  return out;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& t,
                                                 const std::vector<std::pair<std::string, Tensor>>& named) {
  auto groups = optim::weight_decay_groups(named, t.weight_decay);
  if (t.optimizer == Optimizer::kSgd)
    return std::make_unique<optim::SGD>(groups, optim::SGDOptions{t.lr, t.momentum, t.weight_decay, false});
  return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{t.lr, {t.beta1, t.beta2}, t.eps, t.weight_decay});
}

TrainSummary train(const TrainRunConfig& config, const TrainOptions& options) {
  const TrainConfig& t = config.train;
  set_num_threads(t.threads);
  if (config.model.vocab_size < 256)
    throw ConfigError(config.source_file + ": model.vocab_size: expected an integer >= 256 (the corpus is "
                      "read as byte tokens), got " + std::to_string(config.model.vocab_size));
  TextCorpus corpus = TextCorpus::load(config.data.path, config.data.val_fraction, t.seq_len);

  auto model = std::make_shared<nn::GPT>(gpt_config(config));
  model->train();
  auto opt = make_optimizer(t, model->named_parameters());
  optim::WarmupCosineSchedule schedule{t.lr, t.min_lr, t.warmup_steps, t.steps};
  std::vector<Tensor> params = model->parameters();

  int64_t start = 0;
  if (!options.resume_path.empty()) start = load_checkpoint(options.resume_path, *model, opt.get());

  JsonlLog log(t.log_file);
  log.write({{"type", "config"}, {"config", to_json(config)}, {"parameters", model->num_parameters()},
             {"threads", num_threads()}, {"corpus_bytes", corpus.total_bytes()}, {"start_step", start}});
  if (!options.quiet) {
    std::printf("hap-train: GPT with %ld parameters, corpus %ld bytes from %ld file(s), %d thread(s)\n",
                static_cast<long>(model->num_parameters()), static_cast<long>(corpus.total_bytes()),
                static_cast<long>(corpus.num_files()), num_threads());
    std::fflush(stdout);
  }

  TrainSummary summary;
  std::vector<double> step_ms;
  double window_ms = 0, window_loss = 0;
  int64_t window_steps = 0;
  const double tokens_per_step = static_cast<double>(t.batch_size * t.seq_len);
  int64_t end = options.stop_after >= 0 ? std::min(t.steps, options.stop_after) : t.steps;
  for (int64_t step = start; step < end; ++step) {
    if (options.profile && step == start + 1) {
      ops::reset_dispatch_stats();
      ops::set_profiling(true);
    }
    auto t0 = Clock::now();
    double lr = schedule.at(step);
    opt->set_lr(lr);
    Batch batch = corpus.batch(Split::kTrain, t.seq_len, t.seed, static_cast<uint64_t>(step), 0, t.batch_size);
    Tensor loss = model->loss(batch.idx, batch.targets);
    double loss_value = loss.item();
    HAP_CHECK(std::isfinite(loss_value), "training diverged: the loss is ", loss_value, " at step ", step,
              " (lower train.lr, or enable train.grad_clip)");
    opt->zero_grad();
    loss.backward();
    double norm = t.grad_clip > 0 ? nn::clip_grad_norm_(params, t.grad_clip) : nn::grad_norm(params);
    HAP_CHECK(std::isfinite(norm), "training diverged: the gradient norm is ", norm, " at step ", step);
    opt->step();
    double ms = ms_since(t0);
    step_ms.push_back(ms);
    if (summary.steps_run == 0) summary.first_loss = loss_value;
    summary.last_loss = loss_value;
    ++summary.steps_run;
    window_ms += ms;
    window_loss += loss_value;
    ++window_steps;

    bool last = step + 1 == end;
    if ((step + 1) % t.log_every == 0 || last) {
      double avg_ms = window_ms / static_cast<double>(window_steps);
      double tok_s = tokens_per_step / (avg_ms / 1000.0);
      log.write({{"type", "train"}, {"step", step + 1}, {"loss", loss_value},
                 {"avg_loss", window_loss / static_cast<double>(window_steps)}, {"lr", lr},
                 {"grad_norm", norm}, {"ms_per_step", avg_ms}, {"tokens_per_s", tok_s}});
      if (!options.quiet) {
        std::printf("step %6ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %8.1f ms/step | %9.0f tok/s\n",
                    static_cast<long>(step + 1), static_cast<long>(t.steps), loss_value, lr, norm, avg_ms, tok_s);
        std::fflush(stdout);
      }
      window_ms = window_loss = 0;
      window_steps = 0;
    }
    if (options.profile && last && step > start) {
      ops::set_profiling(false);
      std::printf("profile: op kernels over steps %ld-%ld:\n%s", static_cast<long>(start + 2),
                  static_cast<long>(step + 1), ops::profile_report(25).c_str());
    }
    if ((step + 1) % t.eval_every == 0 || last) {
      double val = evaluate(*model, corpus, t);
      summary.last_val_loss = val;
      log.write({{"type", "eval"}, {"step", step + 1}, {"val_loss", val}});
      if (!options.quiet) {
        std::printf("step %6ld/%ld | val loss %.4f\n", static_cast<long>(step + 1), static_cast<long>(t.steps), val);
        std::fflush(stdout);
      }
    }
  }
  summary.median_step_ms = median_of(step_ms);
  if (!options.checkpoint_path.empty()) save_checkpoint(options.checkpoint_path, *model, opt.get(), end);
  log.write({{"type", "done"}, {"steps", summary.steps_run}, {"first_loss", summary.first_loss},
             {"last_loss", summary.last_loss}, {"last_val_loss", summary.last_val_loss},
             {"median_ms_per_step", summary.median_step_ms}});
  return summary;
}

}  // namespace hap::app
