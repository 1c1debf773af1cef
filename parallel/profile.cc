#include "parallel/profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#include "core/rng.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif
#include "ops/functional.h"
#include "parallel/shard.h"
#include "synth/cost_model.h"

namespace hap::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The cost model prices an all-reduce without a method (it moves even blocks).
CollectiveMethod priced_method(synth::InstrKind kind, CollectiveMethod m) {
  return kind == synth::InstrKind::AllReduce ? CollectiveMethod::None : m;
}

constexpr int64_t kRowFloats = 256;

}  // namespace

double median(std::vector<double> v) {
  HAP_ASSERT(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

GemmRate profile_gemm(int64_t n, int reps, Device device, DType dtype) {
  HAP_CHECK(n >= 1 && reps >= 1, "profile_gemm: expected n >= 1 and reps >= 1, got n=", n,
            " reps=", reps);
  HAP_CHECK(dtype == DType::F32 || dtype == DType::BF16, "profile_gemm: f32 or bf16, not ",
            dtype_name(dtype));
  Tensor a = randn({n, n}, 1, 0).to(dtype).to(device);
  Tensor b = randn({n, n}, 1, 1).to(dtype).to(device);
  hap::matmul(a, b);  // warm-up: allocator, thread pool, pages, library handles
  hap::synchronize(device);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    Tensor c = hap::matmul(a, b);
    hap::synchronize(device);
    times.push_back(seconds_since(t0));
  }
  GemmRate g;
  g.n = n;
  g.dtype = dtype;
  g.median_s = median(times);
  g.flops_per_s =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / g.median_s;
  return g;
}

namespace {

// One collective to time: its sample's description, and one call of it on fresh tensors.
class TimedCollective {
 public:
  TimedCollective(const Communicator& comm, const CollectiveSpec& spec, Device device)
      : comm_(comm), kind_(spec.kind), method_(spec.method), device_(device) {
    const int P = comm.size();
    HAP_CHECK(static_cast<int>(spec.ratios.size()) == P, "time_collective: ", spec.ratios.size(),
              " ratios for a group of ", P, " ranks");
    rows_ =
        std::max<int64_t>(P, static_cast<int64_t>(std::llround(spec.bytes / (4.0 * kRowFloats))));
    lengths_ = shard_lengths(rows_, spec.ratios);
    col_lengths_ = shard_lengths(kRowFloats, spec.ratios);
    const int64_t max_len = *std::max_element(lengths_.begin(), lengths_.end());
    sample_.kind = spec.kind;
    sample_.method = spec.method;
    sample_.group_size = P;
    sample_.bytes = 4.0 * static_cast<double>(rows_ * kRowFloats);
    sample_.max_share = static_cast<double>(max_len) / static_cast<double>(rows_);
    sample_.uneven = std::adjacent_find(lengths_.begin(), lengths_.end(), std::not_equal_to<>()) !=
                     lengths_.end();
  }

  // The rank's input, made before the call is timed: x: [rows or its shard, 256] (all_to_all:
  // its rows, all columns).
  void prepare() {
    const TensorOptions on = TensorOptions{}.with_device(device_);
    if (kind_ == synth::InstrKind::AllReduce || kind_ == synth::InstrKind::ReduceScatter)
      input_ = Tensor::full({rows_, kRowFloats}, 1.0, on);
    else
      input_ = Tensor::full({lengths_[comm_.rank()], kRowFloats}, 1.0, on);
    hap::synchronize(device_);
  }

  void run() {
    switch (kind_) {
      case synth::InstrKind::AllReduce:
        all_reduce(comm_, input_, method_);
        break;
      case synth::InstrKind::AllGather:
        all_gather(comm_, input_, 0, lengths_, method_);
        break;
      case synth::InstrKind::ReduceScatter:
        reduce_scatter(comm_, input_, 0, lengths_, method_);
        break;
      case synth::InstrKind::AllToAll:
        // Sharded(rows) -> Sharded(columns).
        all_to_all(comm_, input_, 1, 0, col_lengths_, lengths_, method_);
        break;
      default:
        HAP_CHECK(false, "time_collective: not a collective: ", synth::instr_name(kind_));
    }
    hap::synchronize(device_);  // (a GPU backend may return before the collective is done)
  }

  void release() { input_ = Tensor(); }
  CollectiveSample& sample() { return sample_; }

 private:
  const Communicator& comm_;
  synth::InstrKind kind_;
  CollectiveMethod method_;
  Device device_;
  int64_t rows_ = 0;
  std::vector<int64_t> lengths_, col_lengths_;
  CollectiveSample sample_;
  Tensor input_;
};

}  // namespace

std::vector<CollectiveSample> time_collectives(const Communicator& comm,
                                               const std::vector<CollectiveSpec>& specs, int reps,
                                               double busy_s, Device device,
                                               const std::function<void(int)>& after_round) {
  HAP_CHECK(reps >= 1, "time_collective: expected reps >= 1, got ", reps);
  std::vector<TimedCollective> timed;
  timed.reserve(specs.size());
  for (const CollectiveSpec& spec : specs) timed.emplace_back(comm, spec, device);
  for (TimedCollective& t : timed) {  // warm-up: connections, buffers
    t.prepare();
    t.run();
    t.release();
  }
  // The compute before each call, on the rank's device. A rank that computed arrives at the call
  // with its CPU quota partly spent, or its GPU's caches and clocks as training leaves them, as
  // in training; the time counts from the last rank's arrival, though: how late a slower or
  // throttled rank arrives is its compute, which the cost model prices per device (a wall-clock
  // busy loop under a CPU quota ends anywhere in the quota's period, and counting from each rank's
  // own arrival added up to a period of waiting to every call, many times a small collective).
  const TensorOptions on = TensorOptions{}.with_device(device);
  Tensor a = Tensor::full({64, 64}, 0.5, on), b = Tensor::full({64, 64}, 0.25, on);
  std::vector<std::vector<double>> slowest(timed.size());
  // Round by round, every collective once per round: a slow spell of a shared machine moves one
  // repetition of many samples, not every repetition of one (which, at one size, tilted the
  // latency and bandwidth fitted to them).
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < timed.size(); ++i) {
      timed[i].prepare();
      comm.barrier();
      const auto start = Clock::now();
      if (busy_s > 0) {
        const auto until = start + std::chrono::duration<double>(busy_s);
        while (Clock::now() < until) hap::matmul(a, b);
        hap::synchronize(device);  // (a GPU's queued kernels done: the rank arrives)
      }
      const double arrived = seconds_since(start);
      timed[i].run();
      const double done = seconds_since(start);
      timed[i].release();
      // Each rank's times count from its own exit from the barrier (no common clock is needed;
      // the exits lie within a message latency of each other).
      const double last_arrival = comm.allreduce(arrived, ReduceOp::Max);
      const double last_done = comm.allreduce(done, ReduceOp::Max);
      slowest[i].push_back(std::max(last_done - last_arrival, 1e-9));
    }
    if (after_round) after_round(r);
  }
  std::vector<CollectiveSample> out;
  for (size_t i = 0; i < timed.size(); ++i) {
    timed[i].sample().seconds = median(slowest[i]);
    out.push_back(timed[i].sample());
  }
  return out;
}

CollectiveSample time_collective(const Communicator& comm, synth::InstrKind kind,
                                 CollectiveMethod method, double bytes,
                                 const std::vector<double>& ratios, int reps, double busy_s,
                                 Device device) {
  return time_collectives(comm, {{kind, method, bytes, ratios}}, reps, busy_s, device).at(0);
}

OverlapSample time_overlap(const Communicator& comm, double bytes, int reps, Device device) {
  HAP_CHECK(reps >= 1, "time_overlap: expected reps >= 1, got ", reps);
  HAP_CHECK(bytes >= 4, "time_overlap: expected bytes >= 4, got ", bytes);
  OverlapSample s;
  const TensorOptions on = TensorOptions{}.with_device(device);
  const int64_t n = std::max<int64_t>(1, std::llround(bytes / 4.0));
  s.bytes = 4.0 * static_cast<double>(n);
  const Tensor in = Tensor::full({n}, 1.0, on);
  const Tensor out = Tensor::empty({n}, on);
  const Tensor a = Tensor::full({128, 128}, 0.5, on), b = Tensor::full({128, 128}, 0.25, on);
  // This rank's time of `body` from a common barrier, and the slowest rank's.
  auto own_time = [&](auto&& body) {
    comm.barrier();
    const auto t0 = Clock::now();
    body();
    hap::synchronize(device);
    return std::max(seconds_since(t0), 1e-7);
  };
  auto timed = [&](auto&& body) { return comm.allreduce(own_time(body), ReduceOp::Max); };
  auto collective = [&] { comm.backend().start_all_reduce(in, out)->wait(); };
  int products = 16;
  // `products` small products, after each `between()`.
  auto compute = [&](auto&& between) {
    for (int i = 0; i < products; ++i) {
      hap::matmul(a, b);
      between();
    }
  };
  auto nothing = [] {};
  collective();  // warm-up: connections, buffers
  // Products enough to take about as long as the collective on this rank (at its own sustained
  // speed: a short probe under a CPU quota runs at full speed, so the count is refined on runs
  // about as long as the collective).
  const double c0 = median({timed(collective), timed(collective), timed(collective)});
  for (int round = 0; round < 3; ++round)
    products = static_cast<int>(
        std::clamp(std::round(products * c0 / own_time([&] { compute(nothing); })), 1.0, 1e6));
  std::vector<double> c, w, t;
  for (int r = 0; r < reps; ++r) {
    c.push_back(timed(collective));
    w.push_back(timed([&] { compute(nothing); }));
    t.push_back(timed([&] {
      std::unique_ptr<PendingCollective> pending = comm.backend().start_all_reduce(in, out);
      bool done = false;
      compute([&] { done = done || pending->test(); });
      pending->wait();
    }));
  }
  s.collective_s = median(c);
  s.compute_s = median(w);
  s.together_s = median(t);
  // The collective moves at `overlap` of its pace while the products run (the cost model's
  // step_time): together = compute + collective - overlap * compute, until it hides entirely.
  const double share = (s.collective_s + s.compute_s - s.together_s) / s.compute_s;
  s.overlap = std::isfinite(share) ? std::clamp(share, 0.0, 1.0) : 1.0;  // (no time measured)
  return s;
}

LinkFit fit_link(const std::vector<CollectiveSample>& samples) {
  HAP_CHECK(samples.size() >= 2, "fit_link: expected at least 2 samples, got ", samples.size());
  // Rows of the weighted least squares: (a_i / t_i) * lat + (b_i / t_i) * inv_bw ~ 1.
  std::vector<double> a, b;
  for (const CollectiveSample& s : samples) {
    HAP_CHECK(s.seconds > 0, "fit_link: a sample took ", s.seconds, " s; expected > 0");
    const synth::CollectiveTerms t = synth::collective_terms(
        s.kind, priced_method(s.kind, s.method), s.group_size, s.bytes, s.max_share);
    a.push_back(t.latency_terms / s.seconds);
    b.push_back(t.byte_terms / s.seconds);
  }
  double saa = 0, sab = 0, sbb = 0, sa = 0, sb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    saa += a[i] * a[i];
    sab += a[i] * b[i];
    sbb += b[i] * b[i];
    sa += a[i];
    sb += b[i];
  }
  double lat = 0, inv_bw = 0;
  const double det = saa * sbb - sab * sab;
  if (det > 1e-12 * saa * sbb) {
    lat = (sa * sbb - sb * sab) / det;
    inv_bw = (saa * sb - sab * sa) / det;
  }
  if (!(lat >= 0) || !(inv_bw > 0)) {
    // The unconstrained optimum leaves the feasible set: the best fit has one term only.
    const double lat_only = saa > 0 ? sa / saa : 0;
    const double bw_only = sbb > 0 ? sb / sbb : 0;
    auto err = [&](double l, double ib) {
      double e = 0;
      for (size_t i = 0; i < a.size(); ++i) e += std::pow(a[i] * l + b[i] * ib - 1, 2);
      return e;
    };
    if (bw_only > 0 && err(0, bw_only) <= err(lat_only, 0)) {
      lat = 0;
      inv_bw = bw_only;
    } else {
      lat = lat_only;
      // No byte dependence shows in the samples: a bandwidth far above anything they could see.
      double max_b = 0;
      for (double x : b) max_b = std::max(max_b, x);
      inv_bw = max_b > 0 ? 1e-3 / max_b : 1e-12;
    }
  }
  LinkFit fit;
  fit.latency_s = lat;
  fit.bandwidth_bytes_per_s = 1.0 / inv_bw;
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += std::pow(a[i] * lat + b[i] * inv_bw - 1, 2);
  fit.rms_relative_error = std::sqrt(e / static_cast<double>(a.size()));
  return fit;
}

int64_t usable_memory_bytes(int ranks_on_node, Device device) {
  HAP_CHECK(ranks_on_node >= 1, "usable_memory_bytes: expected ranks_on_node >= 1, got ",
            ranks_on_node);
  if (!device.is_cpu()) {
#ifdef HAP_HAVE_CUDA
    const cuda::MemoryInfo m = cuda::memory_info(device.index);
    double bytes = static_cast<double>(m.free_bytes) / ranks_on_node;
    if (cuda::memory_cap() > 0) bytes = std::min(bytes, static_cast<double>(cuda::memory_cap()));
    return static_cast<int64_t>(bytes);
#else
    HAP_CHECK(false, "usable_memory_bytes: ", device.str(), " without the CUDA backend");
#endif
  }
  double available = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double value = 0;
  std::string unit;
  while (meminfo >> key >> value) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      available = value * 1024.0;  // kB
      break;
    }
  }
  HAP_CHECK(available > 0, "cannot read MemAvailable from /proc/meminfo");
  double bytes = available / ranks_on_node;
  // A memory cgroup limit (v2 memory.max, v1 memory.limit_in_bytes) of this process, if set.
  for (const char* limit_file :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(limit_file);
    double limit = 0;
    if (f >> limit && limit > 0) bytes = std::min(bytes, limit);
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace hap::parallel
