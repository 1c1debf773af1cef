// The kernel lab's harness (bench/kernels/kernel_*.cc, one program per kernel family): each case
// builds its inputs at GPT-2 124M's sizes (rows = batch 8 x 1024 tokens, width 768, vocabulary
// 50257, 12 heads of 64, 124M parameters) scaled by --scale, runs its forward and backward through
// the registry on --device, checks the results against the same case in f64 on the CPU (at a size
// small enough for the CPU: --check-scale), then times each op of interest: the op's first call
// in the case's step, recorded and replayed --iters times back to back (as training launches
// kernels: the launches overlap the kernels before them), waited for once. It prints, per op, the
// time per call and the achieved GB/s (the bytes an op must read and write at least, over its time)
// against the device's copy bandwidth measured in the same run, or the TFLOP/s against the measured
// GEMM rate. --json writes the same as one JSON document. Exit status 1 when a check fails.
//
//   kernel_norms [--device cpu|cuda[:N]] [--dtype f32|bf16] [--scale S] [--iters N] [--json F]
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/threads.h"
#include "parallel/profile.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif

namespace hap::lab {

// GPT-2 124M's sizes times `scale` (rows, batch and parameters scale; widths stay).
struct Sizes {
  int64_t rows = 8192, width = 768, vocab = 50257;
  int64_t batch = 8, heads = 12, seq = 1024, head_dim = 64;
  int64_t params = 124000000;
};

inline Sizes sizes_at(double scale) {
  Sizes s;
  s.rows = std::max<int64_t>(16, static_cast<int64_t>(std::llround(8192 * scale)));
  s.batch = std::max<int64_t>(1, static_cast<int64_t>(std::llround(8 * scale)));
  s.params = std::max<int64_t>(4096, static_cast<int64_t>(std::llround(124e6 * scale)));
  return s;
}

// What an op of a case must move and compute at least, per call.
struct Traffic {
  ops::OpKind kind;
  double bytes = 0;
  double flops = 0;
};

// A case: `make` builds the inputs (on `device`, of `dtype`) and returns the step to time, which
// runs the kernels and returns the tensors to check (outputs and gradients); `traffic` says what
// each of its ops moves and computes at those sizes and that dtype.
struct Case {
  std::string name;
  std::function<std::function<std::vector<Tensor>()>(const Sizes&, Device, DType)> make;
  std::function<std::vector<Traffic>(const Sizes&, DType)> traffic;
};

// Normal values drawn in f64 (the same for every device and dtype), then cast and moved.
inline Tensor input(const Shape& s, uint64_t seed, Device device, DType dtype) {
  return randn(s, seed, 0, TensorOptions{}.with_dtype(DType::F64)).to(dtype).to(device);
}
// A fresh leaf over x's storage that records its gradient (each timed step starts from none).
inline Tensor leaf(const Tensor& x) {
  Tensor l = x.detach();
  l.set_requires_grad(true);
  return l;
}
inline double bytes_of(DType d) { return static_cast<double>(dtype_size(d)); }

// max |a - b| / max |b| over the elements (0 where both are 0).
inline double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to(Device::cpu()).to(DType::F64).to_vector(),
                            b = want.to(DType::F64).to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  if (a.size() != b.size()) return INFINITY;
  return scale > 0 ? diff / scale : diff;
}

// The device's copy bandwidth: bytes read and written per second by a device-to-device copy of
// 256 MiB (64 MiB on the CPU), the best of 5.
inline double copy_bandwidth(Device device) {
  const int64_t n = (device.is_cpu() ? 64 : 256) << 20;
  const Tensor a = Tensor::zeros({n}, TensorOptions{}.with_dtype(DType::U8).with_device(device));
  const Tensor b = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::U8).with_device(device));
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    copy_bytes(b.raw_data(), device, a.raw_data(), device, static_cast<size_t>(n));
    synchronize(device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && s > 0) best = std::max(best, 2.0 * static_cast<double>(n) / s);
  }
  return best;
}

// The op calls of one step (the dispatcher's record hook, chained to autograd's).
struct Recorded {
  ops::OpKind kind;
  std::vector<Tensor> inputs;
  ops::Attrs attrs;
};
inline std::vector<Recorded> g_recorded;
inline ops::RecordHook g_chained = nullptr;
inline void record_call(ops::OpKind kind, const std::vector<Tensor>& inputs,
                        std::vector<Tensor>& outputs, const ops::Attrs& attrs) {
  // Kernel calls only: an op computing in f32 between casts is also seen once as itself.
  if (!ops::recording_routed_call()) g_recorded.push_back({kind, inputs, attrs});
  if (g_chained) g_chained(kind, inputs, outputs, attrs);
}

// Seconds per call of `r` run `iters` times back to back (after one untimed call), waited for
// once at the end.
inline double replay(const Recorded& r, int iters, Device device) {
  NoGradGuard no_grad;
  ops::call(r.kind, r.inputs, r.attrs);
  synchronize(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) ops::call(r.kind, r.inputs, r.attrs);
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

inline int run_lab_or_throw(int argc, char** argv, const std::string& family,
                            const std::vector<Case>& cases);

// The program's main: run_lab_or_throw, with an error (no GPU, say) printed as one line and exit
// status 1.
inline int run_lab(int argc, char** argv, const std::string& family,
                   const std::vector<Case>& cases) {
  try {
    return run_lab_or_throw(argc, argv, family, cases);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernel_%s: error: %s\n", family.c_str(), e.what());
    return 1;
  }
}

inline int run_lab_or_throw(int argc, char** argv, const std::string& family,
                            const std::vector<Case>& cases) {
  CLI::App cli{"kernel lab: " + family + " kernels, checked against the CPU and timed"};
  std::string device_arg = "cpu", dtype_arg = "f32", json_path, only;
  double scale = 0, check_scale = 1.0 / 16;
  int iters = 10, warmup = 2, threads = 0;
  cli.add_option("--device", device_arg, "cpu, cuda or cuda:N");
  cli.add_option("--dtype", dtype_arg, "f32 or bf16 (parameters and optimizer state stay f32)");
  cli.add_option("--scale", scale,
                 "sizes as a share of GPT-2 124M's (default 1 on a GPU, 1/16 on the CPU)")
      ->check(CLI::PositiveNumber);
  cli.add_option("--check-scale", check_scale, "the sizes of the check against the CPU in f64")
      ->check(CLI::PositiveNumber);
  cli.add_option("--iters", iters, "timed runs per case")->check(CLI::PositiveNumber);
  cli.add_option("--warmup", warmup, "untimed runs first")->check(CLI::NonNegativeNumber);
  cli.add_option("--threads", threads, "CPU threads (0: all cores)");
  cli.add_option("--only", only, "run the case of this name only");
  cli.add_option("--json", json_path, "write the results as JSON");
  CLI11_PARSE(cli, argc, argv);
  const std::optional<Device> parsed = parse_device(device_arg);
  if (!parsed) {
    std::fprintf(stderr, "kernel_%s: --device: expected cpu, cuda or cuda:N, got '%s'\n",
                 family.c_str(), device_arg.c_str());
    return 2;
  }
  if (dtype_arg != "f32" && dtype_arg != "bf16") {
    std::fprintf(stderr, "kernel_%s: --dtype: expected f32 or bf16, got '%s'\n", family.c_str(),
                 dtype_arg.c_str());
    return 2;
  }
  const Device device = *parsed;
  const DType dtype = dtype_arg == "bf16" ? DType::BF16 : DType::F32;
  if (scale == 0) scale = device.is_cpu() ? 1.0 / 16 : 1.0;
  set_num_threads(threads);
  std::string where = device.str();
#ifdef HAP_HAVE_CUDA
  if (device.is_cuda()) where += " (" + cuda::device_description(device.index) + ")";
#endif
  const double bandwidth = copy_bandwidth(device);
  const double gemm = parallel::profile_gemm(device.is_cpu() ? 1024 : 8192, 5, device,
                                             dtype == DType::BF16 ? DType::BF16 : DType::F32)
                          .flops_per_s;
  std::printf("kernel lab, %s kernels on %s, %s, sizes x%g of GPT-2 124M's\n", family.c_str(),
              where.c_str(), dtype_name(dtype), scale);
  std::printf("ceilings: copy %.1f GB/s (read + write), %s GEMM %.2f TFLOP/s\n", bandwidth / 1e9,
              dtype_name(dtype), gemm / 1e12);
  nlohmann::json out = {{"family", family},
                        {"device", where},
                        {"dtype", dtype_name(dtype)},
                        {"scale", scale},
                        {"iters", iters},
                        {"copy_bytes_per_s", bandwidth},
                        {"gemm_flops_per_s", gemm},
                        {"cases", nlohmann::json::array()}};
  bool all_ok = true;
  const double tolerance = dtype == DType::BF16 ? 3e-2 : 1e-4;
  for (const Case& c : cases) {
    if (!only.empty() && c.name != only) continue;
    // The check: the case at check size on the device, against f64 on the CPU.
    const Sizes small = sizes_at(check_scale);
    const std::vector<Tensor> want = c.make(small, Device::cpu(), DType::F64)();
    const std::vector<Tensor> got = c.make(small, device, dtype)();
    double error = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i)
      error = std::max(error, relative_error(got[i], want[i]));
    if (got.size() != want.size()) error = INFINITY;
    const bool ok = error <= tolerance;
    all_ok = all_ok && ok;
    // The timing, at full size: the step once with its op calls recorded, then the first call of
    // each op of interest replayed `iters` times back to back (as training launches kernels) and
    // waited for once.
    const Sizes sizes = sizes_at(scale);
    std::function<std::vector<Tensor>()> step = c.make(sizes, device, dtype);
    for (int i = 0; i < warmup; ++i) step();
    g_recorded.clear();
    g_chained = ops::record_hook();
    ops::set_record_hook(&record_call);
    step();
    ops::set_record_hook(g_chained);
    const std::vector<Recorded> calls = std::move(g_recorded);
    g_recorded.clear();
    nlohmann::json row = {{"case", c.name},
                          {"check_relative_error", error},
                          {"check_tolerance", tolerance},
                          {"check_ok", ok},
                          {"ops", nlohmann::json::array()}};
    std::printf("%-22s check %s (max error %.2e of the largest value, tolerance %.0e)\n",
                c.name.c_str(), ok ? "ok" : "FAILED", error, tolerance);
    for (const Traffic& t : c.traffic(sizes, dtype)) {
      auto it = std::find_if(calls.begin(), calls.end(),
                             [&](const Recorded& r) { return r.kind == t.kind; });
      const int64_t per_step = std::count_if(calls.begin(), calls.end(),
                                             [&](const Recorded& r) { return r.kind == t.kind; });
      double s = 0;
      if (it != calls.end()) s = replay(*it, iters, device);
      nlohmann::json op = {
          {"op", ops::op_name(t.kind)}, {"calls_per_step", per_step}, {"seconds_per_call", s}};
      char buf[160];
      std::snprintf(buf, sizeof(buf), "  %-24s %9.1f us", ops::op_name(t.kind), s * 1e6);
      std::string line = buf;
      // The op's amount per call (bytes or FLOPs) against its ceiling: JSON keys and a column.
      auto rate = [&](double amount, const std::string& what, double ceiling, const char* share_key,
                      double unit, const char* unit_name, const char* ceiling_name) {
        if (s <= 0 || amount <= 0) return;
        op[what + "_per_call"] = amount;
        op[what + "_per_s"] = amount / s;
        op[share_key] = amount / s / ceiling;
        std::snprintf(buf, sizeof(buf), "  %8.2f %s (%3.0f%% of %s)", amount / s / unit, unit_name,
                      100 * amount / s / ceiling, ceiling_name);
        line += buf;
      };
      rate(t.bytes, "bytes", bandwidth, "share_of_copy_bandwidth", 1e9, "GB/s", "copy");
      rate(t.flops, "flops", gemm, "share_of_gemm_rate", 1e12, "TFLOP/s", "GEMM");
      if (it == calls.end()) line += "  (not called)";
      std::printf("%s\n", line.c_str());
      row["ops"].push_back(op);
    }
    std::fflush(stdout);
    out["cases"].push_back(row);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "kernel_%s: cannot write %s\n", family.c_str(), json_path.c_str());
      return 1;
    }
  }
  return all_ok ? 0 : 1;
}

}  // namespace hap::lab
