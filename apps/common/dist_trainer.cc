#include "apps/common/dist_trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "apps/common/data.h"
#include "apps/common/jsonl_log.h"
#include "apps/common/model_graph.h"
#include "apps/common/plan_report.h"
#include "autograd/grad_mode.h"
#include "models/init.h"
#include "models/lr_schedule.h"
#include "models/module.h"
#include "models/optim.h"
#include "models/serialize.h"
#include "ops/functional.h"
#include "ops/dispatch.h"
#include "ops/threads.h"
#include "parallel/collectives.h"
#include "parallel/executor.h"
#include "parallel/shard.h"

namespace hap::app {

namespace {

using Clock = std::chrono::steady_clock;

// Rows [offset[0], offset[0] + local[0]) of the global batch (and columns, for a plan that splits
// the sequence), read from the corpus: a rank never reads the rows of another.
parallel::TensorSource batch_source(const TextCorpus& corpus, Split split, const TrainConfig& t,
                                    uint64_t step) {
  return [&corpus, split, &t, step](const std::string& name, const Shape& local, const LogicalSlice& s) {
    int64_t row0 = s.offset.empty() ? 0 : s.offset[0];
    Batch b = corpus.batch(split, t.seq_len, t.seed, step, row0, row0 + local[0]);
    Tensor full = name == "idx" ? b.idx : b.targets;
    if ((!s.offset.empty() && s.offset[1] != 0) || local[1] != t.seq_len)
      full = narrow(full, 1, s.offset.empty() ? 0 : s.offset[1], local[1]).contiguous();
    return full;
  };
}

// A fingerprint of a program, to check that every rank runs the same one.
double plan_digest(const synth::DistributedProgram& p) {
  double h = 0;
  for (size_t i = 0; i < p.instructions.size(); ++i) {
    const synth::Instruction& in = p.instructions[i];
    h += (i + 1) * (static_cast<double>(in.kind) * 7 + in.node * 3 + in.signature + in.tensor * 5 +
                    static_cast<double>(in.method) * 11 + in.from.dim * 13 + in.to.dim * 17);
  }
  for (const auto& r : p.ratios)
    for (double x : r) h += x * 1e3;
  return h;
}

// Checkpoints hold logical (unsharded) tensors under the names save_checkpoint uses, so a run on
// any plan, cluster, or one process can resume them.
void save_distributed(const std::string& path, const parallel::Executor& ex, const optim::Optimizer& opt,
                      int64_t step, uint64_t seed) {
  NamedTensors out;
  auto i64 = [](int64_t v) { return Tensor::from_vector(std::vector<int64_t>{v}, {}); };
  for (const auto& [name, p] : ex.parameters()) out.emplace_back("model." + name, ex.gathered_value(name));
  for (const auto& [name, p] : ex.parameters()) {
    const optim::Optimizer::ParamState* st = opt.state(p);
    for (size_t s = 0; s < st->slots.size(); ++s)
      out.emplace_back("optim." + opt.state_slots()[s] + "." + name, ex.gathered_like(name, st->slots[s]));
    out.emplace_back("optim.step." + name, i64(st->step));
  }
  out.emplace_back("meta.step", i64(step));
  out.emplace_back("meta.random_seed", i64(static_cast<int64_t>(seed)));
  out.emplace_back("meta.random_step", i64(step));
  if (ex.comm().rank() == 0) save_tensors(path, out);
  ex.comm().barrier();
}

// `by_name`: the checkpoint at `path`, loaded.
int64_t resume_distributed(const std::string& path, const std::map<std::string, Tensor>& by_name,
                           const parallel::Executor& ex, optim::Optimizer& opt) {
  auto take = [&](const std::string& n) {
    auto it = by_name.find(n);
    HAP_CHECK(it != by_name.end(), path, ": the checkpoint has no tensor '", n, "'");
    return it->second;
  };
  NoGradGuard no_grad;
  auto place = [&](const Tensor& local, const Tensor& full, const std::string& name) {
    HAP_CHECK(full.dim() == local.dim(), path, ": '", name, "' has shape ", shape_str(full.shape()));
    Tensor part = parallel::box_of(full, local.shape(), ex.slice_of(name));
    HAP_CHECK(part.shape() == local.shape(), path, ": '", name, "' has shape ", shape_str(full.shape()));
    local.copy_from(part);
  };
  for (const auto& [name, p] : ex.parameters()) {
    place(p, take("model." + name), name);
    optim::Optimizer::ParamState* st = opt.state(p);
    for (size_t s = 0; s < st->slots.size(); ++s) place(st->slots[s], take("optim." + opt.state_slots()[s] + "." + name), name);
    st->step = static_cast<int64_t>(take("optim.step." + name).item());
  }
  return static_cast<int64_t>(take("meta.step").item());
}

// Rank 0 prints, per rank, the milliseconds per step spent in op kernels and in each collective.
void print_profile(const parallel::Communicator& comm, double profiled_s, int64_t steps) {
  ops::set_profiling(false);
  if (steps == 0) return;
  double kernels = 0;
  for (double s : ops::dispatch_stats().kernel_s) kernels += s;
  const parallel::CollectiveStats& cs = parallel::collective_stats();
  std::vector<std::vector<double>> cols = {comm.allgather(kernels / steps)};
  std::vector<std::vector<double>> calls;
  for (int k = 0; k < parallel::kNumCollectiveStats; ++k) {
    cols.push_back(comm.allgather(cs.seconds[k] / steps));
    calls.push_back(comm.allgather(static_cast<double>(cs.calls[k]) / steps));
  }
  if (comm.rank() != 0) return;
  std::printf("profile: ms per training step over %ld steps (slowest rank's step: %.1f ms); calls per step\n",
              static_cast<long>(steps), profiled_s / steps * 1e3);
  std::printf("  rank   kernels");
  for (int k = 0; k < parallel::kNumCollectiveStats; ++k)
    std::printf(" %22s", parallel::collective_stat_name(static_cast<parallel::CollectiveStat>(k)));
  std::printf("      rest\n");
  for (int r = 0; r < comm.size(); ++r) {
    double rest = profiled_s / steps;
    std::printf("  %4d %9.1f", r, cols[0][r] * 1e3);
    rest -= cols[0][r];
    for (int k = 0; k < parallel::kNumCollectiveStats; ++k) {
      std::printf(" %12.1f (%6.1f x)", cols[k + 1][r] * 1e3, calls[k][r]);
      rest -= cols[k + 1][r];
    }
    std::printf(" %9.1f\n", rest * 1e3);
  }
  std::fflush(stdout);
}

}  // namespace

synth::SynthesisOptions synthesis_options(const ParallelConfig& p) {
  synth::SynthesisOptions o;
  switch (p.strategy) {
    case Strategy::kHap: o.strategy = synth::Strategy::Hap; break;
    case Strategy::kDpEv: o.strategy = synth::Strategy::DpEv; break;
    case Strategy::kDpCp: o.strategy = synth::Strategy::DpCp; break;
    case Strategy::kTp: o.strategy = synth::Strategy::Tp; break;
  }
  o.segments = p.segments == Segments::kSingle ? synth::SegmentMode::Single : synth::SegmentMode::PerBlock;
  o.max_states = p.search_budget;
  return o;
}

std::string synthesis_error_message(const std::string& what, const ParallelConfig& p) {
  // The search (synth/search.cc) knows no config keys; its budget error asks to "raise the
  // search budget".
  if (what.find("search budget") == std::string::npos) return what;
  return what + "; the budget is parallel.search_budget = " + std::to_string(p.search_budget) +
         " states (--set parallel.search_budget=N, or hap-plan --search-budget N)";
}

TrainSummary train_distributed(const TrainRunConfig& config, const synth::Cluster& cluster,
                               const DistTrainOptions& options, const parallel::Communicator& comm) {
  const TrainConfig& t = config.train;
  const bool lead = comm.rank() == 0 && !options.quiet;
  if (comm.size() != cluster.size())
    throw ConfigError("the cluster '" + cluster.name + "' has " + std::to_string(cluster.size()) +
                      " devices but " + std::to_string(comm.size()) +
                      " ranks were launched (run mpirun -np " + std::to_string(cluster.size()) + ")");
  if (config.model.vocab_size < 256)
    throw ConfigError(config.source_file + ": model.vocab_size: expected an integer >= 256 (the corpus is "
                      "read as byte tokens), got " + std::to_string(config.model.vocab_size));
  // Ranks usually share a machine's cores: by default each computes on one thread.
  set_num_threads(t.threads > 0 ? t.threads : 1);

  // A resumed run draws dropout from the checkpoint's seed, as the single-process trainer does.
  std::map<std::string, Tensor> checkpoint;
  std::optional<uint64_t> dropout_seed;
  if (!options.resume_path.empty()) {
    for (auto& [name, value] : load_tensors(options.resume_path)) checkpoint[name] = value;
    auto seed = checkpoint.find("meta.random_seed");
    HAP_CHECK(seed != checkpoint.end(), options.resume_path, ": the checkpoint has no tensor 'meta.random_seed'");
    dropout_seed = static_cast<uint64_t>(seed->second.item());
  }
  TracedModel tm = trace_model(config, dropout_seed);
  synth::CostModel cm(tm.graph, cluster);
  synth::DistributedProgram plan = options.plan_file.empty() ? synth::synthesize(tm.graph, cluster, options.synthesis)
                                                             : load_plan(options.plan_file, cm);
  double digest = plan_digest(plan);
  HAP_CHECK(comm.allreduce(digest, parallel::ReduceOp::Max) == comm.allreduce(digest, parallel::ReduceOp::Min),
            "the ranks synthesized different programs (non-deterministic planning?)");
  if (lead) {
    std::printf("%s\n", plan_report(cm, plan, {}).c_str());
    std::fflush(stdout);
  }
  if (comm.rank() == 0 && !options.plan_json.empty()) {
    std::ofstream f(options.plan_json);
    f << plan_to_json(cm, plan).dump(2) << "\n";
    f.close();
    HAP_CHECK(f.good(), "--plan-json ", options.plan_json, ": cannot write: ", std::strerror(errno));
  }

  TextCorpus corpus = TextCorpus::load(config.data.path, config.data.val_fraction, t.seq_len);
  parallel::Executor ex(tm.graph, plan, comm);
  ex.materialize_parameters([&](const std::string& name, const Shape& local, const LogicalSlice& slice) {
    Tensor p = Tensor::empty(local);
    nn::init_parameter(p, tm.model->init_rule_of(name), t.seed, name, slice);
    return p;
  });
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(t, ex.parameters());
  optim::WarmupCosineSchedule schedule{t.lr, t.min_lr, t.warmup_steps, t.steps};
  JsonlLog log(comm.rank() == 0 ? t.log_file : "");
  log.write({{"type", "config"}, {"config", to_json(config)}, {"ranks", comm.size()},
             {"cluster", cluster.name}, {"plan", plan_to_json(cm, plan)}});

  int64_t start = options.resume_path.empty() ? 0 : resume_distributed(options.resume_path, checkpoint, ex, *opt);
  TrainSummary summary;
  std::vector<double> step_ms;
  double window_ms = 0, window_loss = 0;  // since the last progress line
  int64_t window_steps = 0;
  const double tokens_per_step = static_cast<double>(t.batch_size * t.seq_len);
  const int64_t end = options.stop_after >= 0 ? std::min(t.steps, options.stop_after) : t.steps;
  double profiled_s = 0;  // training steps' wall time while profiling (the first is warm-up)
  int64_t profiled_steps = 0;
  for (int64_t step = start; step < end; ++step) {
    if (options.profile && step == start + 1) {
      ops::reset_dispatch_stats();
      ops::set_profiling(true);
      parallel::reset_collective_stats();
    }
    auto t0 = Clock::now();
    double lr = schedule.at(step);
    opt->set_lr(lr);
    Tensor local = ex.forward(batch_source(corpus, Split::kTrain, t, static_cast<uint64_t>(step)),
                              static_cast<uint64_t>(step) * nn::kRandomStreamsPerStep);
    double loss = ex.global_loss(local);
    HAP_CHECK(std::isfinite(loss), "training diverged: the loss is ", loss, " at step ", step,
              " (lower train.lr, or enable train.grad_clip)");
    opt->zero_grad();
    ex.backward(local);
    double norm = ex.global_grad_norm();
    HAP_CHECK(std::isfinite(norm), "training diverged: the gradient norm is ", norm, " at step ", step);
    if (t.grad_clip > 0 && norm > t.grad_clip) ex.scale_grads(t.grad_clip / (norm + 1e-6));
    opt->step();
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    // The slowest rank sets the pace: report its time.
    ms = comm.allreduce(ms, parallel::ReduceOp::Max);
    step_ms.push_back(ms);
    if (options.profile && step > start) {
      profiled_s += ms / 1e3;
      ++profiled_steps;
    }
    if (summary.steps_run == 0) summary.first_loss = loss;
    summary.last_loss = loss;
    ++summary.steps_run;
    window_ms += ms;
    window_loss += loss;
    ++window_steps;
    bool last = step + 1 == end;
    if ((step + 1) % t.log_every == 0 || last) {
      // As on one process: time and loss averaged over the steps since the last line.
      const double avg_ms = window_ms / static_cast<double>(window_steps);
      const double tok_s = tokens_per_step / (avg_ms / 1000.0);
      log.write({{"type", "train"}, {"step", step + 1}, {"loss", loss},
                 {"avg_loss", window_loss / static_cast<double>(window_steps)}, {"lr", lr},
                 {"grad_norm", norm}, {"ms_per_step", avg_ms}, {"tokens_per_s", tok_s}});
      if (lead) {
        std::printf("step %6ld/%ld | loss %.4f | lr %.3e | grad norm %.3f | %8.1f ms/step | %9.0f tok/s\n",
                    static_cast<long>(step + 1), static_cast<long>(t.steps), loss, lr, norm, avg_ms, tok_s);
        std::fflush(stdout);
      }
      window_ms = window_loss = 0;
      window_steps = 0;
    }
    if ((step + 1) % t.eval_every == 0 || last) {
      if (options.profile && last) print_profile(comm, profiled_s, profiled_steps);
      NoGradGuard no_grad;
      double sum = 0;
      for (int64_t b = 0; b < t.eval_batches; ++b)
        sum += ex.global_loss(ex.forward(batch_source(corpus, Split::kVal, t, static_cast<uint64_t>(b)), 0, false));
      summary.last_val_loss = sum / static_cast<double>(t.eval_batches);
      log.write({{"type", "eval"}, {"step", step + 1}, {"val_loss", summary.last_val_loss}});
      if (lead) {
        std::printf("step %6ld/%ld | val loss %.4f\n", static_cast<long>(step + 1), static_cast<long>(t.steps),
                    summary.last_val_loss);
        std::fflush(stdout);
      }
    }
  }
  summary.median_step_ms = median_of(step_ms);
  if (!options.checkpoint_path.empty()) save_distributed(options.checkpoint_path, ex, *opt, end, dropout_seed.value_or(t.seed));
  log.write({{"type", "done"}, {"steps", summary.steps_run}, {"first_loss", summary.first_loss},
             {"last_loss", summary.last_loss}, {"last_val_loss", summary.last_val_loss},
             {"median_ms_per_step", summary.median_step_ms}});
  return summary;
}

}  // namespace hap::app
