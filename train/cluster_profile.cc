#include "train/cluster_profile.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/rng.h"
#include "core/sm_partition.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/green_context.h"
#endif
#include "models/clip.h"
#include "models/zoo.h"
#include "ops/cpu/blas.h"
#include "ops/dispatch.h"
#include "ops/threads.h"
#include "parallel/hierarchical.h"
#include "parallel/profile.h"
#include "synth/cost_model.h"
#include "train/cluster_config.h"
#include "train/core_rate.h"
#include "train/engine.h"
#include "train/from_config.h"
#include "train/trace.h"
#include "train/trainer.h"

namespace hap::train {

namespace {

using hap::parallel::CollectiveMethod;
using hap::parallel::CollectiveSample;
using hap::parallel::Communicator;
using hap::synth::InstrKind;
using Clock = std::chrono::steady_clock;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// Every rank's string, in rank order.
std::vector<std::string> allgather_strings(const Communicator& comm, const std::string& mine) {
  std::vector<std::string> out(comm.size());
  for (int r = 0; r < comm.size(); ++r) out[r] = comm.broadcast_string(mine, r);
  return out;
}

struct ComputeResult {
  std::vector<hap::parallel::GemmRate> gemm;
  double step_flops = 0, step_s = 0, flops_per_s = 0, update_s_per_param = 0;
  double memory_bandwidth_bytes_per_s = 0;
  int64_t batch_rows = 0;
  // What the rates are derived from (set_rates): the graph's part of the step (forward +
  // backward), the products' share of its kernel time (-1: not measured), the work of the
  // products and of the other ops, and the graph's kernel calls (CostModel::step_kernel_calls).
  double graph_step_s = 0, product_share = -1;
  double product_flops = 0, product_bytes = 0, other_flops = 0, other_bytes = 0;
  int kernel_calls = 0;
  // From a second measurement (profile_cluster): seconds per kernel call that do not shrink with
  // the rows, and that measurement's rows and step (0: none).
  double kernel_overhead_s = 0;
  int64_t other_rows = 0;
  double other_step_s = 0;
};

// The rates of r's step once `fixed_s` of its graph time is set apart as kernel overheads: the
// rest, split between products and other ops in their measured shares, gives flops_per_s (the
// products' FLOPs) and memory_bandwidth_bytes_per_s (the other ops' bytes); where that split is
// not available, flops_per_s alone over the whole step.
void set_rates(ComputeResult& r, double fixed_s) {
  const double variable_s = r.graph_step_s - fixed_s;
  r.flops_per_s = r.memory_bandwidth_bytes_per_s = 0;
  if (r.product_share > 0 && r.product_share < 1 && r.other_bytes > 0) {
    const double product_step_s = variable_s * r.product_share;
    const double other_step_s = variable_s - product_step_s;
    // Products' bytes and the others' FLOPs are small: charge them at the other's rate.
    r.flops_per_s = r.product_flops / product_step_s;
    const double bytes_s = other_step_s - r.other_flops / r.flops_per_s;
    r.memory_bandwidth_bytes_per_s = bytes_s > 0 ? (r.other_bytes + r.product_bytes) / bytes_s : 0;
  }
  if (r.memory_bandwidth_bytes_per_s <= 0) {
    r.flops_per_s = r.step_flops / variable_s;
    r.memory_bandwidth_bytes_per_s = 0;
  }
}

// `total` rows split in proportion to `rates` in whole rows (largest remainders), each at least
// one where there are enough: the split proportional data parallelism gives each device.
std::vector<int64_t> proportional_rows(int64_t total, const std::vector<double>& rates) {
  const size_t P = rates.size();
  double sum = 0;
  for (double r : rates) sum += r;
  std::vector<int64_t> rows(P, 0);
  if (P == 0 || !(sum > 0)) return rows;
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t d = 0; d < P; ++d) {
    const double exact = static_cast<double>(total) * rates[d] / sum;
    rows[d] = static_cast<int64_t>(std::floor(exact));
    given += rows[d];
    remainders.push_back({exact - static_cast<double>(rows[d]), d});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total; ++i, ++given) ++rows[remainders[i % P].second];
  if (total >= static_cast<int64_t>(P))
    for (size_t d = 0; d < P; ++d)
      while (rows[d] == 0) {
        ++rows[d];
        --*std::max_element(rows.begin(), rows.end());
      }
  return rows;
}

}  // namespace

double fit_fixed_step_s(const std::vector<std::pair<int64_t, double>>& points) {
  double n = 0, sx = 0, sy = 0, smallest = std::numeric_limits<double>::infinity();
  for (const auto& [rows, s] : points) {
    if (rows <= 0 || !(s > 0) || !std::isfinite(s)) return 0.0;
    n += 1;
    sx += static_cast<double>(rows);
    sy += s;
    smallest = std::min(smallest, s);
  }
  if (n < 2) return 0.0;
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (const auto& [rows, s] : points) {
    const double dx = static_cast<double>(rows) - mx;
    sxx += dx * dx;
    sxy += dx * (s - my);
  }
  if (!(sxx > 0)) return 0.0;  // one row count
  const double per_row = sxy / sxx;
  if (!(per_row > 0)) return 0.0;  // > 0: then the fixed part is below the mean time
  return std::clamp(my - per_row * mx, 0.0, smallest);
}

std::vector<int> pooled_kinds(const std::vector<std::string>& keys,
                              const std::vector<double>& even_step_s, double tolerance) {
  HAP_CHECK(keys.size() == even_step_s.size(), "pooled_kinds: ", keys.size(), " keys but ",
            even_step_s.size(), " steps");
  const size_t P = keys.size();
  std::vector<int> group(P, -1);
  int groups = 0;
  for (size_t r = 0; r < P; ++r) {
    if (group[r] >= 0) continue;
    std::vector<size_t> same;  // r's kind
    std::vector<double> steps;
    for (size_t q = r; q < P; ++q)
      if (keys[q] == keys[r]) {
        same.push_back(q);
        if (std::isfinite(even_step_s[q])) steps.push_back(even_step_s[q]);
      }
    const double median = steps.empty() ? std::nan("") : hap::parallel::median(steps);
    const auto alike = [&](size_t q) {
      const double t = even_step_s[q];
      return std::isfinite(t) && t > 0 && median > 0 &&
             std::max(t / median, median / t) <= 1 + tolerance;
    };
    int pool = -1;  // the kind's group, numbered at its first alike rank
    for (size_t q : same) {
      if (group[q] >= 0) continue;
      if (alike(q)) {
        if (pool < 0) pool = groups++;
        group[q] = pool;
      } else {
        group[q] = groups++;
      }
    }
  }
  // Numbered in order of their first rank.
  std::vector<int> number(static_cast<size_t>(groups), -1);
  int next = 0;
  for (int& g : group) {
    if (number[static_cast<size_t>(g)] < 0) number[static_cast<size_t>(g)] = next++;
    g = number[static_cast<size_t>(g)];
  }
  return group;
}

int64_t second_profile_rows(int64_t rows, int64_t operating, int64_t batch) {
  if (operating > 0 && operating != rows) return operating;
  if (2 * rows <= batch) return 2 * rows;
  if (rows / 2 >= 1) return rows / 2;
  return 0;
}

namespace {

class Progress {
 public:
  Progress(bool lead, int total) : lead_(lead), total_(total) {}
  void step(const std::string& what) {
    ++done_;
    if (!lead_) return;
    std::fprintf(stderr, "hap-profile: [%3d/%d] %s\n", done_, total_, what.c_str());
    std::fflush(stderr);
  }

 private:
  bool lead_;
  int total_, done_ = 0;
};

std::string format_bytes(double b) {
  char buf[32];
  if (b >= 1048576)
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / 1048576);
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

// The GEMMs timed for comparison with the model's rate: on the CPU in f32; on a GPU (larger, its
// rates reached only there) in f32 and in bf16.
struct GemmSpec {
  int64_t n;
  DType dtype;
};
std::vector<GemmSpec> gemm_plan(bool quick, Device device) {
  std::vector<GemmSpec> plan;
  if (device.is_cpu()) {
    for (int64_t n :
         quick ? std::vector<int64_t>{128, 256} : std::vector<int64_t>{128, 256, 512, 1024})
      plan.push_back({n, DType::F32});
    return plan;
  }
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t n :
         quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 2048, 4096})
      plan.push_back({n, dtype});
  return plan;
}

// GEMM rates, and the config's model's training step on this rank's share of the batch (`rows`
// examples; 0: an even share, ceil(batch / world)) on the config's train.device: mean seconds
// per step over a time window, and its FLOPs. `window_s` > 0 replaces the default window;
// `gemms` false skips the GEMM rates.
ComputeResult profile_compute(const RunConfig& base, int world, bool quick, Progress& progress,
                              bool gemms = true, double window = 0, int64_t rows = 0) {
  ComputeResult r;
  const Device device = base.train.device;
  if (gemms)
    for (const GemmSpec& g : gemm_plan(quick, device)) {
      r.gemm.push_back(hap::parallel::profile_gemm(g.n, quick ? 2 : 3, device, g.dtype));
      progress.step("compute: GEMM " + std::to_string(g.n) + "^3" +
                    (g.dtype == DType::F32 ? "" : std::string(" ") + dtype_name(g.dtype)));
    }

  // Products (GEMMs, attention) are rated in FLOP/s, everything else (element-wise, norms,
  // copies) mostly by the bytes it moves: the kernel profiler splits the step's time between them.
  RunConfig config = base;
  r.batch_rows =
      rows > 0 ? rows : std::max<int64_t>(1, (config.train.batch_size + world - 1) / world);
  config.train.batch_size = r.batch_rows;
  {
    synth::Graph graph = trace_model(*build_model(config, /*shapes_only=*/true), r.batch_rows,
                                     config.train.precision);
    synth::Cluster one;
    one.name = "one";
    synth::Link link;
    link.bandwidth_bytes_per_s = 1e9;
    synth::Device device;
    device.name = device.type = "d";
    device.flops_per_s = 1.0;
    device.memory_bytes = 1;
    one.add_node("n", link, {device});
    synth::CostModel cm(graph, one);
    for (const synth::GraphNode& n : graph.nodes) {
      const bool product = hap::ops::op_def(n.kind).flops_bound;
      r.step_flops += cm.step_flops(n.id);
      (product ? r.product_flops : r.other_flops) += cm.step_flops(n.id);
      (product ? r.product_bytes : r.other_bytes) += cm.step_bytes(n.id);
    }
    r.kernel_calls = cm.step_kernel_calls();
  }
  std::shared_ptr<nn::Model> model = build_model(config);
  model->to(device);  // (parameters keep their identities)
  model->train();
  auto opt = make_optimizer(config.train, model->named_parameters());
  nn::Batch batch = synthetic_batch(model->inputs(r.batch_rows), config.train.seed);
  for (auto& [name, t] : batch) t = t.to(device);
  // Steps until a time window has passed rather than a fixed count: under a CPU quota a step's
  // time depends on where it falls in the quota period, and a long window averages that out.
  const double window_s = window > 0 ? window : quick ? 0.3 : 2.0;
  const int min_steps = quick ? 2 : 5;
  // The graph's forward + backward is what flops_per_s rates; the optimizer step and the
  // gradient-norm pass (outside the graph) are timed apart, per parameter element.
  std::vector<hap::Tensor> params = model->parameters();
  double num_params = 0;
  for (const hap::Tensor& p : params) num_params += static_cast<double>(p.numel());
  // On the CPU the split between the graph and the update, and between the graph's products and
  // the rest, is read in CPU time: under a CPU quota the throttled spells land on whichever part
  // runs then, and in wall time a 0.2-core rank's update measured faster per parameter than a
  // 0.8-core rank's.
  const bool cpu = device.is_cpu();
  double graph_s = 0, update_s = 0, graph_cpu_s = 0, update_cpu_s = 0;
  auto step_once = [&]() {
    const double c0 = cpu ? hap::ops::process_cpu_s() : 0;
    auto t0 = Clock::now();
    hap::Tensor loss;
    {
      hap::ops::AutocastGuard precision(config.train.precision);
      loss = model->loss(batch);
    }
    opt->zero_grad();
    loss.backward();
    hap::synchronize(device);  // (a GPU's kernels run after their launch)
    auto t1 = Clock::now();
    const double c1 = cpu ? hap::ops::process_cpu_s() : 0;
    // As the trainer: the norm, then the update with clipping's coefficient.
    const double norm = hap::nn::grad_norm(params);
    const double clip = config.train.grad_clip > 0 ? config.train.grad_clip / (norm + 1e-6) : 1.0;
    opt->step(clip < 1 ? clip : 1.0);
    hap::synchronize(device);
    auto t2 = Clock::now();
    const double c2 = cpu ? hap::ops::process_cpu_s() : 0;
    graph_s += std::chrono::duration<double>(t1 - t0).count();
    update_s += std::chrono::duration<double>(t2 - t1).count();
    graph_cpu_s += c1 - c0;
    update_cpu_s += c2 - c1;
  };
  step_once();  // warm-up
  graph_s = update_s = graph_cpu_s = update_cpu_s = 0;
  hap::ops::reset_dispatch_stats();
  // On the CPU the kernel profiler times the very steps measured; on a GPU it waits for the
  // device around every op, which a training step does not: the steps are measured without it,
  // and the products' share of kernel time taken from as many steps again with it, after.
  const bool gpu = !device.is_cpu();
  hap::ops::set_profiling(!gpu);
  int steps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (steps < min_steps || elapsed < window_s) {
    step_once();
    ++steps;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (gpu) {
    const double graph_measured_s = graph_s, update_measured_s = update_s;
    hap::ops::set_profiling(true);
    for (int i = 0; i < min_steps; ++i) step_once();
    graph_s = graph_measured_s;
    update_s = update_measured_s;
  }
  hap::ops::set_profiling(false);
  double product_s = 0, other_s = 0;
  const hap::ops::DispatchStats& stats = hap::ops::dispatch_stats();
  double product_cpu_s = 0, other_cpu_s = 0;
  for (size_t k = 0; k < hap::ops::kNumOps; ++k) {
    const bool product = hap::ops::op_def(static_cast<hap::ops::OpKind>(k)).flops_bound;
    (product ? product_s : other_s) += stats.kernel_s[k];
    (product ? product_cpu_s : other_cpu_s) += stats.kernel_cpu_s[k];
  }
  if (cpu && product_cpu_s > 0 && other_cpu_s > 0) {
    product_s = product_cpu_s;
    other_s = other_cpu_s;
  }
  if (cpu && graph_cpu_s > 0 && update_cpu_s > 0) {
    graph_s = graph_cpu_s;
    update_s = update_cpu_s;
  }
  // Spread the wall time (quota throttling and dispatch included) over the parts in their
  // measured shares: update vs graph, and within the graph products vs the rest.
  r.step_s = elapsed / steps;
  r.graph_step_s = r.step_s * graph_s / (graph_s + update_s);
  r.update_s_per_param = (r.step_s - r.graph_step_s) / num_params;
  const double kernels_s = product_s + other_s;
  if (kernels_s > 0 && product_s > 0 && other_s > 0) r.product_share = product_s / kernels_s;
  set_rates(r, 0.0);
  progress.step("compute: " + config.model.name + " training step (" +
                std::to_string(r.batch_rows) + " examples)");
  return r;
}

// Progress after each round of a group's collectives: "LABEL: round R of REPS (WHAT)".
std::function<void(int)> round_progress(Progress& progress, const std::string& label, int reps,
                                        const std::string& what) {
  return [&progress, label, reps, what](int r) {
    progress.step(label + ": round " + std::to_string(r + 1) + " of " + std::to_string(reps) +
                  " (" + what + ")");
  };
}

std::vector<CollectiveSample> profile_group(const Communicator& group,
                                            const std::vector<double>& rates,
                                            const std::vector<CollectiveMeasurement>& plan,
                                            int reps, double busy_s, const std::string& label,
                                            Progress& progress, Device device) {
  // Uneven shards follow the measured rates (what a plan would use); if the ranks are alike,
  // a fixed skew still exercises the uneven paths.
  std::vector<double> uneven = rates;
  const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
  if (*hi < 1.05 * *lo)
    for (size_t i = 0; i < uneven.size(); ++i) uneven[i] = static_cast<double>(uneven.size() - i);
  double sum = 0;
  for (double u : uneven) sum += u;
  for (double& u : uneven) u /= sum;
  const std::vector<double> even(rates.size(), 1.0 / static_cast<double>(rates.size()));

  std::vector<hap::parallel::CollectiveSpec> specs;
  for (const CollectiveMeasurement& m : plan)
    specs.push_back({m.kind, m.method, m.bytes, m.uneven ? uneven : even});
  return hap::parallel::time_collectives(
      group, specs, reps, busy_s, device,
      round_progress(progress, label, reps,
                     std::to_string(plan.size()) +
                         " collectives of 4 kinds, even and uneven, padded and grouped, " +
                         format_bytes(plan.front().bytes) + " to " +
                         format_bytes(plan.back().bytes)));
}

nlohmann::json samples_json(const std::vector<CollectiveSample>& samples) {
  nlohmann::json j = nlohmann::json::array();
  for (const CollectiveSample& s : samples)
    j.push_back({{"collective", hap::synth::instr_name(s.kind)},
                 {"method", s.kind == InstrKind::AllReduce ? "-" : hap::ops::method_name(s.method)},
                 {"ranks", s.group_size},
                 {"bytes", s.bytes},
                 {"max_share", s.max_share},
                 {"uneven", s.uneven},
                 {"seconds", s.seconds}});
  return j;
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// A link's fit over all its samples, and one per collective (all_reduce, all_gather,
// reduce_scatter, all_to_all, in synth::Collective order).
struct LinkFits {
  hap::parallel::LinkFit all;
  std::vector<hap::parallel::LinkFit> per;  // empty when not measured
  hap::parallel::OverlapSample overlap;     // not measured: overlap 1, no times

  std::vector<double> flatten() const {
    std::vector<double> v = {
        all.bandwidth_bytes_per_s, all.latency_s,     all.rms_relative_error, overlap.bytes,
        overlap.collective_s,      overlap.compute_s, overlap.together_s,     overlap.overlap};
    for (int c = 0; c < hap::synth::kNumCollectives; ++c) {
      const hap::parallel::LinkFit f =
          c < static_cast<int>(per.size()) ? per[c] : hap::parallel::LinkFit{};
      v.insert(v.end(), {f.bandwidth_bytes_per_s, f.latency_s, f.rms_relative_error});
    }
    return v;
  }
  static LinkFits unflatten(const std::vector<double>& v) {
    LinkFits f;
    f.all = {v[0], v[1], v[2]};
    f.overlap = {v[3], v[4], v[5], v[6], v[7]};
    for (int c = 0; c < hap::synth::kNumCollectives; ++c)
      f.per.push_back({v[8 + 3 * c], v[9 + 3 * c], v[10 + 3 * c]});
    return f;
  }
};

LinkFits fit_all(const std::vector<CollectiveSample>& samples,
                 const std::vector<InstrKind>& kinds) {
  LinkFits f;
  f.all = hap::parallel::fit_link(samples);
  for (InstrKind k : kinds) {
    std::vector<CollectiveSample> of_kind;
    for (const CollectiveSample& s : samples)
      if (s.kind == k) of_kind.push_back(s);
    // (bandwidth 0: too few samples, not fitted)
    f.per.push_back(of_kind.size() >= kMinSamplesPerCollective ? hap::parallel::fit_link(of_kind)
                                                               : hap::parallel::LinkFit{});
  }
  return f;
}

// A block mapping: the overall figures, then one line per collective; `fit` comments give the
// rms relative error of each fit.
std::string link_yaml(const LinkFits& f, const std::string& indent) {
  std::ostringstream y;
  y << "   # fit " << number(f.all.rms_relative_error * 100) << "% over all collectives\n";
  y << indent << "bandwidth_bytes_per_s: " << number(f.all.bandwidth_bytes_per_s) << "\n";
  y << indent << "latency_s: " << number(f.all.latency_s) << "\n";
  if (f.overlap.collective_s > 0)
    y << indent << "overlap: " << number(f.overlap.overlap) << "   # all_reduce of "
      << format_bytes(f.overlap.bytes) << " " << number(f.overlap.collective_s * 1e3)
      << " ms, products " << number(f.overlap.compute_s * 1e3) << " ms, together "
      << number(f.overlap.together_s * 1e3) << " ms\n";
  std::string fitted, unfitted;
  for (int c = 0; c < hap::synth::kNumCollectives && c < static_cast<int>(f.per.size()); ++c) {
    const hap::parallel::LinkFit& t = f.per[c];
    const std::string name = hap::synth::collective_name(static_cast<hap::synth::Collective>(c));
    if (!(t.bandwidth_bytes_per_s > 0)) {
      unfitted += (unfitted.empty() ? "" : ", ") + name;
      continue;
    }
    fitted += "\n" + indent + "  " + name +
              ": {bandwidth_bytes_per_s: " + number(t.bandwidth_bytes_per_s) +
              ", latency_s: " + number(t.latency_s) + "}   # fit " +
              number(t.rms_relative_error * 100) + "%";
  }
  if (!fitted.empty()) y << indent << "collectives:" << fitted;
  if (!unfitted.empty())
    y << (fitted.empty() ? "" : "\n") << indent << "# " << unfitted << ": fewer than "
      << kMinSamplesPerCollective
      << " samples each, priced by the figures above (fitted over all collectives)";
  return y.str();
}

// Every round of the step (`first`, then `second`) of every rank in this rank's group of `kind`,
// with what pooling reads of it: rows, step and graph times, products' share, update per
// parameter. Collective over `world`.
std::vector<ComputeResult> gather_kind_rounds(const Communicator& world,
                                              const std::vector<int>& kind,
                                              const std::vector<ComputeResult>& first,
                                              const std::vector<ComputeResult>& second) {
  std::vector<ComputeResult> mine = first;
  mine.insert(mine.end(), second.begin(), second.end());
  const std::vector<int64_t> counts = world.allgather(static_cast<int64_t>(mine.size()));
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::vector<ComputeResult> out;
  for (int64_t i = 0; i < most; ++i) {
    const ComputeResult c =
        i < static_cast<int64_t>(mine.size()) ? mine[static_cast<size_t>(i)] : ComputeResult{};
    const std::vector<int64_t> rows = world.allgather(c.batch_rows);
    const std::vector<double> graph = world.allgather(c.graph_step_s);
    const std::vector<double> step = world.allgather(c.step_s);
    const std::vector<double> share = world.allgather(c.product_share);
    const std::vector<double> update = world.allgather(c.update_s_per_param);
    for (int r = 0; r < world.size(); ++r) {
      if (kind[r] != kind[world.rank()] || i >= counts[r]) continue;
      ComputeResult p;
      p.batch_rows = rows[r];
      p.graph_step_s = graph[r];
      p.step_s = step[r];
      p.product_share = share[r];
      p.update_s_per_param = update[r];
      out.push_back(p);
    }
  }
  return out;
}

}  // namespace

double measure_core_flops_per_s(double window_s) {
  // The default GPT of configs/gpt.yaml on 4 examples (emu-mixed4's share of its batch of 16).
  RunConfig config;
  config.model.name = "gpt";
  config.model.options = nn::Options(nn::find_model("gpt").options);
  const std::vector<std::pair<const char*, std::int64_t>> sizes = {
      {"vocab_size", 256}, {"block_size", 128}, {"seq_len", 128},
      {"n_layer", 4},      {"n_head", 4},       {"n_embd", 128}};
  for (const auto& [key, value] : sizes) config.model.options.set(key, value);
  config.model.options.set("dropout", 0.0);
  config.model.options.set("bias", true);
  config.train.batch_size = 4;
  config.train.steps = 1;
  config.train.lr = 1e-3;
  config.train.min_lr = 1e-3;
  const int threads = hap::num_threads();
  hap::set_num_threads(1);
  Progress quiet(false, 0);
  double rate = 0;
  try {
    rate =
        profile_compute(config, 1, /*quick=*/false, quiet, /*gemms=*/false, window_s).flops_per_s;
  } catch (...) {
    hap::set_num_threads(threads);
    throw;
  }
  hap::set_num_threads(threads);
  return rate;
}

// What a rank's device is, for the file's comments: the CPU's GEMM path, or the GPU (and its
// green context where the cluster is emulated on one GPU).
std::string device_line(Device device) {
  if (device.is_cpu()) return hap::cpu::gemm_description();
#ifdef HAP_HAVE_CUDA
  const std::string green = hap::cuda::green_context_note();
  return device.str() + ": " + hap::cuda::device_description(device.index) +
         (green.empty() ? "" : " " + green);
#else
  return device.str();
#endif
}

// A device type for the file where none is given: "cpu", or the GPU's name ("nvidia-h200").
std::string default_type(Device device) {
  if (device.is_cpu()) return "cpu";
  std::string name = device.str();
#ifdef HAP_HAVE_CUDA
  name = hap::cuda::device_description(device.index);
  name = name.substr(0, name.find(','));
#endif
  std::string slug;
  for (char c : name)
    slug += std::isalnum(static_cast<unsigned char>(c))
                ? static_cast<char>(std::tolower(static_cast<unsigned char>(c)))
                : '-';
  return slug;
}

std::vector<CollectiveMeasurement> measurement_plan(bool quick) {
  const std::vector<double> sizes = quick ? std::vector<double>{4096, 262144}
                                          : std::vector<double>{4096, 65536, 1048576, 4194304};
  std::vector<CollectiveMeasurement> plan;
  for (double bytes : sizes)
    for (bool uneven : {false, true}) {
      plan.push_back({InstrKind::AllReduce, CollectiveMethod::Grouped, uneven, bytes});
      for (InstrKind k : {InstrKind::AllGather, InstrKind::ReduceScatter, InstrKind::AllToAll})
        for (CollectiveMethod m : {CollectiveMethod::Padded, CollectiveMethod::Grouped})
          plan.push_back({k, m, uneven, bytes});
    }
  return plan;
}

std::vector<CollectiveMeasurement> lanes_plan(bool quick) {
  const std::vector<double> sizes =
      quick ? std::vector<double>{4096, 262144}
            : std::vector<double>{4096, 16384, 65536, 262144, 1048576, 2097152, 4194304, 8388608};
  std::vector<CollectiveMeasurement> plan;
  for (double bytes : sizes) {
    plan.push_back({InstrKind::AllReduce, CollectiveMethod::Grouped, false, bytes});
    for (InstrKind k : {InstrKind::AllGather, InstrKind::ReduceScatter})
      plan.push_back({k, CollectiveMethod::Padded, false, bytes});
  }
  return plan;
}

void profile_cluster(const RunConfig& given, const ProfileOptions& opt, const Communicator& world) {
  const int P = world.size(), me = world.rank();
  const bool lead = me == 0;
  RunConfig config = given;
  hap::set_num_threads(config.train.threads > 0 ? config.train.threads : 1);
  // GPU ranks (train.device=cuda): each on the GPU a training run would give it, which must be
  // usable; their collectives through the backend a training run would use.
  Device device = config.train.device;
  if (!device.is_cpu()) {
    device = rank_device(device, world);
    check_training_device(device);
    config.train.device = device;
  }

  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::string node_name =
      !opt.node_name.empty() ? opt.node_name : env_or("HAP_NODE_NAME", host);
  const std::vector<std::string> node_of = allgather_strings(world, node_name);
  std::vector<std::string> nodes;  // in order of first rank
  std::vector<int> node_index(P);
  for (int r = 0; r < P; ++r) {
    auto it = std::find(nodes.begin(), nodes.end(), node_of[r]);
    if (it == nodes.end()) {
      nodes.push_back(node_of[r]);
      it = nodes.end() - 1;
    }
    node_index[r] = static_cast<int>(it - nodes.begin());
    if (r > 0 && node_index[r] != node_index[r - 1] &&
        node_index[r] != static_cast<int>(nodes.size()) - 1)
      throw ConfigError(
          "the ranks of node '" + node_of[r] + "' are not contiguous (rank " + std::to_string(r) +
          " comes after ranks of another node); a cluster file lists devices node by node in rank "
          "order: launch with mpirun --map-by slot (or node-contiguous ranks)");
  }
  const std::vector<CollectiveMeasurement> plan = measurement_plan(opt.quick);
  std::vector<int> group_sizes;
  for (size_t n = 0; n < nodes.size(); ++n)
    group_sizes.push_back(
        static_cast<int>(std::count(node_index.begin(), node_index.end(), static_cast<int>(n))));
  // GEMMs, then the model's step in rounds on an even share and on a second size (the
  // proportional share; a batch of one has none: a line saying so instead).
  const int step_rounds = opt.quick ? 1 : 3;
  const int sizes_compute = static_cast<int>(gemm_plan(opt.quick, device).size()) + step_rounds +
                            (config.train.batch_size > 1 ? step_rounds : 1);
  const bool lead_node_measured = group_sizes[0] >= 2;
  const bool world_measured = P >= 2 && nodes.size() > 1;
  // The lanes between nodes matter where the hierarchical forms exist: a node of several ranks.
  const bool lanes_measured =
      world_measured && *std::max_element(group_sizes.begin(), group_sizes.end()) >= 2;
  const std::vector<CollectiveMeasurement> lane_plan =
      lanes_measured ? lanes_plan(opt.quick) : std::vector<CollectiveMeasurement>{};
  // (Each group: the plan's collectives in rounds, then an all-reduce beside compute.)
  const int reps = opt.quick ? 2 : 5;
  const int per_group = reps + 1;
  Progress progress(lead, sizes_compute + (lead_node_measured ? per_group : 0) +
                              (world_measured ? per_group : 0) + (lanes_measured ? reps : 0));
  if (lead) {
    std::fprintf(stderr, "hap-profile: %d rank(s) on %zu node(s)%s\n", P, nodes.size(),
                 P == 1 ? "; one rank: profiling compute only (no links to measure)" : "");
    std::fprintf(stderr, "hap-profile: rank 0: %s\n", device_line(device).c_str());
    std::fflush(stderr);
  }

  // The model's step is measured in rounds, alternating between its two sizes (below), each
  // round over a short window, and each size's median round is kept: a slow spell of a shared
  // machine then moves one round of each size, not a whole measurement.
  const int rounds = step_rounds;
  const double window_s = opt.quick ? 0.3 : 0.7;
  std::vector<ComputeResult> first = {
      profile_compute(config, P, opt.quick, progress, /*gemms=*/true, window_s)};
  std::vector<double> rates = world.allgather(first[0].flops_per_s);
  // Ranks of one kind (type, device, quota or SMs) pool their measurements: one line through all
  // their steps, and one set of figures for all of them (pooled_kinds). Measured alone, two
  // 0.2-core twins on emu-2node were given fixed parts of 10 and 56 ms from steps 0.5% apart
  // on the same rows, since each line went through two noisy points on different rows.
  const std::string dev_type =
      !opt.type.empty() ? opt.type : env_or("HAP_DEVICE_TYPE", default_type(device));
  const std::string quota = env_or("HAP_CPU_QUOTA", "");
  // A rank of a cluster emulated on one GPU (scripts/hap-emulate) writes its SMs back, so that
  // the file can be emulated as the one it was measured on.
  const hap::SmPartitionRequest partition = hap::sm_partition_from_environment();
  const int64_t my_sms = device.is_cpu() || partition.asked.empty()
                             ? 0
                             : partition.asked[static_cast<size_t>(partition.group)];
  std::vector<int> kind =
      pooled_kinds(allgather_strings(world, dev_type + "\n" + device_line(device) + "\n" + quota +
                                                "\n" + std::to_string(my_sms)),
                   world.allgather(first[0].graph_step_s), opt.pool_tolerance);
  if (!(opt.pool_tolerance > 0)) std::iota(kind.begin(), kind.end(), 0);  // each its own
  // Each rank's step again on other rows, where that is possible: a kernel's time is not
  // proportional to its rows (fixed costs per call: dispatch, launch, what does not shrink with
  // the rows), and two sizes give a fixed part (kernel_overhead_s per call) and the rates of the
  // rest. The second is at the operating point where ranks differ: the rows a split of the
  // batch in proportion to the first rates (each kind's mean) gives each (dp-cp's split, about
  // what a plan gives it); elsewhere (alike ranks, one rank, a rank whose proportional share is
  // the even one) twice or half the rows. On emu-mixed4 under --throttle ops the 0.2-core ranks,
  // rated at 4 rows and run at 2, measured 10% slower than a rate-only model predicted and the
  // 0.8-core rank, run at 8, 11% faster.
  std::vector<int64_t> operating(static_cast<size_t>(P), 0);
  if (P > 1) {
    std::vector<double> kind_rates(rates.size());
    for (int r = 0; r < P; ++r) {
      double sum = 0, n = 0;
      for (int q = 0; q < P; ++q)
        if (kind[q] == kind[r]) sum += rates[q], n += 1;
      kind_rates[r] = sum / n;
    }
    operating = proportional_rows(config.train.batch_size, kind_rates);
    // (A batch smaller than the ranks leaves some with no row: the even share stands then.)
    if (*std::min_element(operating.begin(), operating.end()) <= 0)
      operating = world.allgather(first[0].batch_rows);
  }
  const int64_t second_rows = second_profile_rows(
      first[0].batch_rows, operating[static_cast<size_t>(me)], config.train.batch_size);
  std::vector<ComputeResult> second;
  for (int k = 0; k < rounds; ++k) {
    if (second_rows > 0)
      second.push_back(
          profile_compute(config, P, opt.quick, progress, /*gemms=*/false, window_s, second_rows));
    if (k + 1 < rounds)
      first.push_back(profile_compute(config, P, opt.quick, progress, /*gemms=*/false, window_s,
                                      first[0].batch_rows));
  }
  if (second_rows <= 0)
    progress.step("compute: no second size to measure the step at (batch too small)");
  // Every round of every rank of this one's kind, by rows: the median round of each size (the
  // upper one of an even count, a whole round so that its parts stay together).
  const std::vector<ComputeResult> kind_rounds = gather_kind_rounds(world, kind, first, second);
  std::map<int64_t, std::vector<ComputeResult>> by_rows;
  for (const ComputeResult& c : kind_rounds) by_rows[c.batch_rows].push_back(c);
  std::map<int64_t, ComputeResult> median_at;
  std::vector<std::pair<int64_t, double>> points;
  double smallest = std::numeric_limits<double>::infinity();
  for (auto& [n, v] : by_rows) {
    std::sort(v.begin(), v.end(), [](const ComputeResult& a, const ComputeResult& b) {
      return a.graph_step_s < b.graph_step_s;
    });
    median_at[n] = v[v.size() / 2];
    points.push_back({n, median_at[n].graph_step_s});
    smallest = std::min(smallest, median_at[n].graph_step_s);
  }
  // (a fixed part above 95% of the smallest step's graph time is noise, never a measurement)
  const double fixed_s = std::min(fit_fixed_step_s(points), 0.95 * smallest);
  // This rank's figures at its operating point where it measured there, else on the even share:
  // its own round's work (FLOPs, bytes, calls), the kind's median round's times and shares.
  const int64_t at_rows = second_rows > 0 && second_rows == operating[static_cast<size_t>(me)]
                              ? second_rows
                              : first[0].batch_rows;
  ComputeResult compute = at_rows == first[0].batch_rows ? first[0] : second[0];
  const ComputeResult& pooled = median_at.at(at_rows);
  compute.gemm = first[0].gemm;
  compute.step_s = pooled.step_s;
  compute.graph_step_s = pooled.graph_step_s;
  compute.product_share = pooled.product_share;
  compute.update_s_per_param = pooled.update_s_per_param;
  set_rates(compute, fixed_s);
  compute.kernel_overhead_s = compute.kernel_calls > 0 ? fixed_s / compute.kernel_calls : 0.0;
  // The other size this rank measured, for the file's comments.
  const int64_t other = at_rows == first[0].batch_rows ? second_rows : first[0].batch_rows;
  if (other > 0 && median_at.count(other)) {
    compute.other_rows = other;
    compute.other_step_s = median_at.at(other).step_s;
  }
  rates = world.allgather(compute.flops_per_s);
  const std::vector<int64_t> rows = world.allgather(compute.batch_rows);
  // Memory: the node's shared among its ranks, or a GPU's among the ranks on it.
  const std::vector<int64_t> device_of =
      world.allgather(int64_t{device.is_cpu() ? -1 : device.index});
  int sharing = 0;
  for (int r = 0; r < P; ++r)
    if (node_index[r] == node_index[me] && device_of[r] == device_of[me]) ++sharing;
  const std::vector<int64_t> memory =
      world.allgather(hap::parallel::usable_memory_bytes(sharing, device));
  const double busy_s = opt.busy_ms / 1e3;

  // Links: each node's ranks together (at the same time on every node), then all ranks; GPU
  // ranks' tensors on their GPUs, through the backend training would use.
  Communicator node_comm =
      communicator_for(device, config.parallel.backend, world.split(node_index[me], me));
  std::vector<CollectiveSample> node_samples, world_samples, lane_samples;
  // Each group's collectives, then how much of a gradient bucket's all-reduce passes while its
  // ranks compute (Link::overlap).
  const double overlap_bytes = opt.quick ? 262144.0 : 4194304.0;
  const int overlap_reps = opt.quick ? 1 : 3;
  hap::parallel::OverlapSample node_overlap, world_overlap;
  if (node_comm.size() >= 2) {
    std::vector<double> node_rates;
    for (int r = 0; r < P; ++r)
      if (node_index[r] == node_index[me]) node_rates.push_back(rates[r]);
    node_samples = profile_group(node_comm, node_rates, plan, reps, busy_s, "node " + node_name,
                                 progress, device);
    node_overlap = hap::parallel::time_overlap(node_comm, overlap_bytes, overlap_reps, device);
    progress.step("node " + node_name + ": all_reduce beside compute");
  }
  world.barrier();
  if (world_measured) {
    const Communicator all = communicator_for(device, config.parallel.backend, world);
    world_samples = profile_group(all, rates, plan, reps, busy_s, "all nodes", progress, device);
    world_overlap = hap::parallel::time_overlap(all, overlap_bytes, overlap_reps, device);
    progress.step("all nodes: all_reduce beside compute");
    // The lanes: local rank j of every node, every lane at once (as the hierarchical forms run
    // them), each moving its 1 / lanes of the tensor; priced, as the cost model prices them,
    // with terms for one device per node and the whole tensor.
    if (lanes_measured) {
      const auto groups = hap::parallel::group_by_node(all, node_index);
      const int N = static_cast<int>(nodes.size());
      world.barrier();
      if (groups->local_rank < groups->lanes) {
        std::vector<hap::parallel::CollectiveSpec> specs;
        for (const CollectiveMeasurement& m : lane_plan)
          specs.push_back({m.kind, m.method, m.bytes / groups->lanes,
                           std::vector<double>(static_cast<size_t>(N), 1.0 / N)});
        lane_samples = hap::parallel::time_collectives(
            groups->lane, specs, reps, busy_s, device,
            round_progress(progress, "lanes between nodes (" + std::to_string(groups->lanes) + ")",
                           reps,
                           std::to_string(lane_plan.size()) + " collectives, " +
                               format_bytes(lane_plan.front().bytes) + " to " +
                               format_bytes(lane_plan.back().bytes)));
        for (CollectiveSample& s : lane_samples) s.bytes *= groups->lanes;
      }
      world.barrier();
    }
  }

  // Each node's fits (overall, then per collective), collected from that node's first rank.
  const std::vector<InstrKind> kinds = {InstrKind::AllReduce, InstrKind::AllGather,
                                        InstrKind::ReduceScatter, InstrKind::AllToAll};
  std::vector<LinkFits> node_fits(nodes.size());
  LinkFits mine = node_samples.empty() ? LinkFits{} : fit_all(node_samples, kinds);
  mine.overlap = node_overlap;
  const std::vector<double> flat = mine.flatten();
  std::vector<std::vector<double>> gathered(flat.size());
  for (size_t i = 0; i < flat.size(); ++i) gathered[i] = world.allgather(flat[i]);
  for (int r = P - 1; r >= 0; --r) {
    std::vector<double> v(flat.size());
    for (size_t i = 0; i < flat.size(); ++i) v[i] = gathered[i][r];
    node_fits[node_index[r]] = LinkFits::unflatten(v);
  }
  // Every rank's node samples, for --raw only (the same flag on every rank).
  const std::vector<std::string> raw_per_rank =
      opt.raw_path.empty() ? std::vector<std::string>{}
                           : allgather_strings(world, samples_json(node_samples).dump());
  LinkFits inter{};
  if (world_measured) {
    inter = fit_all(world_samples, kinds);
    inter.overlap = world_overlap;
  }
  // (Rank 0, which writes the file, is in lane 0.)
  std::optional<LinkFits> lane_fits;
  if (!lane_samples.empty())
    lane_fits = fit_all(lane_samples,
                        {InstrKind::AllReduce, InstrKind::AllGather, InstrKind::ReduceScatter});

  const std::string dev_name = env_or("HAP_DEVICE_NAME", "");
  const std::vector<int64_t> sm_counts = world.allgather(my_sms);
  const std::vector<std::string> names = allgather_strings(world, dev_name);
  const std::vector<std::string> types = allgather_strings(world, dev_type);
  const std::vector<std::string> quotas = allgather_strings(world, quota);
  const std::vector<double> step_s = world.allgather(compute.step_s);
  const std::vector<double> step_flops = world.allgather(compute.step_flops);
  const std::vector<double> update_s = world.allgather(compute.update_s_per_param);
  const std::vector<double> mem_bw = world.allgather(compute.memory_bandwidth_bytes_per_s);
  const std::vector<double> overhead = world.allgather(compute.kernel_overhead_s);
  const std::vector<int64_t> other_rows = world.allgather(compute.other_rows);
  const std::vector<double> other_step_s = world.allgather(compute.other_step_s);
  const int kernel_calls = compute.kernel_calls;
  std::vector<std::vector<double>> gemm_rates(compute.gemm.size());
  for (size_t i = 0; i < compute.gemm.size(); ++i)
    gemm_rates[i] = world.allgather(compute.gemm[i].flops_per_s);
  const std::vector<std::string> cpu_gemm = allgather_strings(world, device_line(device));
  if (!lead) return;

  // ---- the cluster file ----
  std::ostringstream y;
  std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  y << "# Measured by hap-profile on " << when << ": " << P << " rank(s) on " << nodes.size()
    << " node(s)" << (opt.quick ? " (--quick)" : "") << ".\n";
  y << "# flops_per_s: the mean training step (the median of " << step_rounds << " round"
    << (step_rounds == 1 ? "" : "s") << " of " << (opt.quick ? "0.3" : "0.7") << " s) of the "
    << config.model.name << " model in " << config.source_file
    << " on each rank's share of the batch of " << config.train.batch_size
    << " (forward + backward), one thread per rank: where several ranks differ in speed, the\n"
       "# share a split in proportion to their rates on an even share gives them (a device's\n"
       "# rate depends on its rows);\n"
    << "# kernel_overhead_s: per kernel call (" << kernel_calls
    << " per step), the fixed part of a line through the step's graph time on\n"
       "# those rows and on a second size (where the batch allows one); flops_per_s and\n"
       "# memory_bandwidth_bytes_per_s rate the rest; ranks of one kind (type, device, quota or\n"
       "# SMs) pool their rounds: one line through all their steps (least squares over each\n"
       "# size's median), each size's median round of all of them, so alike devices get alike\n"
    << (opt.pool_tolerance > 0
            ? "# figures (a rank whose step is more than a factor " +
                  number(1 + opt.pool_tolerance) + " off its kind's median keeps its own);\n"
            : std::string("# figures (here not: --pool-tolerance 0, each rank its own);\n"))
    << "# update_s_per_param: the same step's optimizer update and gradient-norm pass per "
       "parameter;\n"
    << "# the graph's time is split by the kernel profiler: products (GEMM, attention) give\n"
    << "# flops_per_s, the other ops' bytes give memory_bandwidth_bytes_per_s.\n";
  y << "# GEMM for comparison (FLOP/s at n = ";
  for (size_t i = 0; i < compute.gemm.size(); ++i)
    y << (i ? ", " : "") << compute.gemm[i].n
      << (compute.gemm[i].dtype == DType::F32
              ? ""
              : std::string(" ") + dtype_name(compute.gemm[i].dtype));
  y << "):\n";
  for (int r = 0; r < P; ++r) {
    y << "#   rank " << r << ": step " << number(step_s[r] * 1e3) << " ms on " << rows[r]
      << " examples";
    if (other_rows[r] > 0)
      y << " (" << number(other_step_s[r] * 1e3) << " ms on " << other_rows[r] << "; fixed "
        << number(overhead[r] * kernel_calls * 1e3) << " ms)";
    std::string pool;
    for (int q = 0; q < P; ++q)
      if (q != r && kind[q] == kind[r]) pool += (pool.empty() ? "" : ", ") + std::to_string(q);
    if (!pool.empty())
      y << "; pooled with rank" << (pool.find(',') == std::string::npos ? " " : "s ") << pool;
    y << "; GEMM";
    for (size_t i = 0; i < compute.gemm.size(); ++i) y << " " << number(gemm_rates[i][r]);
    y << "\n#     " << cpu_gemm[r] << "\n";
  }
  if (P == 1) {
    y << "# Links: not measured (one rank); the node link below is a placeholder the planner "
         "never\n"
         "# uses with one device.\n";
  } else {
    y << "# Links: latency and bandwidth fitted to " << plan.size()
      << " timed collectives per group (all_reduce, all_gather, reduce_scatter, all_to_all; even\n"
         "# and uneven shards; padded and grouped), each right after "
      << opt.busy_ms
      << " ms of compute on every rank\n"
         "# (as in training; timed from the last rank's arrival), with the cost model's formulas;\n"
         "# 'fit' is the rms relative error. overlap: the share of an all-reduce that passes "
         "while\n"
         "# the ranks compute small products beside it, testing it between them as training\n"
         "# does (1: all of it, 0: none).\n";
  }
  y << "name: "
    << (opt.name.empty() ? std::filesystem::path(opt.out_path).stem().string() : opt.name) << "\n";
  if (nodes.size() > 1) y << "inter_node:" << link_yaml(inter, "  ") << "\n";
  if (nodes.size() > 1 && lane_fits)
    y << "  lanes:" << link_yaml(*lane_fits, "    ")
      << "\n  # lanes: the hierarchical collectives' middle phase, one rank per node in each "
         "lane,\n"
         "  # every lane at once, each moving its part of the tensor\n";
  y << "nodes:\n";
  for (size_t n = 0; n < nodes.size(); ++n) {
    y << "  - name: " << nodes[n] << "\n";
    if (group_sizes[n] < 2) {
      y << "    link: {bandwidth_bytes_per_s: 1e10, latency_s: 1e-5}   # not measured (one rank on "
           "this "
           "node; unused by the planner)\n";
    } else {
      y << "    link:" << link_yaml(node_fits[n], "      ") << "\n";
    }
    y << "    devices:\n";
    for (int r = 0; r < P; ++r) {
      if (node_index[r] != static_cast<int>(n)) continue;
      y << "      - {name: " << (names[r].empty() ? nodes[n] + ".r" + std::to_string(r) : names[r])
        << ", type: " << types[r] << ", flops_per_s: " << number(rates[r])
        << ", memory_bandwidth_bytes_per_s: " << number(mem_bw[r])
        << ", kernel_overhead_s: " << number(overhead[r])
        << ", update_s_per_param: " << number(update_s[r]) << ", memory_bytes: " << memory[r];
      if (!quotas[r].empty()) y << ", cpu_quota: " << quotas[r];
      if (sm_counts[r] > 0) y << ", sm_count: " << sm_counts[r];
      y << "}\n";
    }
  }
  write_file_atomically(opt.out_path, y.str());
  // The file must load as is.
  load_cluster_config(opt.out_path);
  std::fprintf(stderr, "hap-profile: wrote %s\n", opt.out_path.c_str());

  if (!opt.raw_path.empty()) {
    nlohmann::json raw;
    raw["ranks"] = nlohmann::json::array();
    for (int r = 0; r < P; ++r) {
      nlohmann::json g = nlohmann::json::array();
      for (size_t i = 0; i < compute.gemm.size(); ++i)
        g.push_back({{"n", compute.gemm[i].n},
                     {"dtype", dtype_name(compute.gemm[i].dtype)},
                     {"flops_per_s", gemm_rates[i][r]}});
      raw["ranks"].push_back({{"rank", r},
                              {"node", node_of[r]},
                              {"model_step_s", step_s[r]},
                              {"batch_rows", rows[r]},
                              {"second_step_s", other_step_s[r]},
                              {"second_batch_rows", other_rows[r]},
                              {"kernel_calls", kernel_calls},
                              {"pooled_kind", kind[r]},
                              {"kernel_overhead_s", overhead[r]},
                              {"model_step_flops", step_flops[r]},
                              {"flops_per_s", rates[r]},
                              {"update_s_per_param", update_s[r]},
                              {"memory_bandwidth_bytes_per_s", mem_bw[r]},
                              {"memory_bytes", memory[r]},
                              {"gemm", g},
                              {"cpu_gemm", cpu_gemm[r]},
                              {"cpu_quota", quotas[r]},
                              {"sm_count", sm_counts[r]}});
    }
    raw["node_samples"] = nlohmann::json::object();
    for (int r = 0; r < P; ++r)
      if (r == 0 || node_index[r] != node_index[r - 1])
        raw["node_samples"][node_of[r]] = nlohmann::json::parse(raw_per_rank[r]);
    raw["world_samples"] = samples_json(world_samples);
    raw["lane_samples"] = samples_json(lane_samples);
    write_file_atomically(opt.raw_path, raw.dump(2) + "\n");
  }
}

nn::Batch synthetic_batch(const std::vector<nn::InputSpec>& inputs, uint64_t seed) {
  nn::Batch batch;
  uint64_t stream = 0;
  for (const nn::InputSpec& in : inputs) {
    if (is_floating(in.dtype)) {
      batch[in.name] = randn(in.shape, seed, stream++, TensorOptions{}.with_dtype(in.dtype));
      continue;
    }
    // Integer inputs: class indices in [0, num_classes), or 0/1 where the model gives no count.
    const uint64_t classes = static_cast<uint64_t>(std::max<int64_t>(in.num_classes, 2));
    std::vector<int64_t> values(static_cast<size_t>(shape_numel(in.shape)));
    for (size_t i = 0; i < values.size(); ++i) {
      auto w = philox_words(seed, stream, i);
      values[i] = static_cast<int64_t>(((static_cast<uint64_t>(w[1]) << 32) | w[0]) % classes);
    }
    ++stream;
    Tensor t = Tensor::from_vector(values, in.shape);
    batch[in.name] = in.dtype == DType::I64 ? t : t.to(in.dtype);
  }
  return batch;
}

}  // namespace hap::train
