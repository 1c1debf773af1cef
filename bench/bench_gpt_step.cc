// One GPT training step (forward, backward, AdamW) timed for HAP and for PyTorch's step on the
// identical model, batch and thread count, in one run, on the CPU or on a GPU (--device cuda: f32,
// TF32 off on both sides; the GPU's f32 GEMM rate is measured in the same run for the MFU). Writes
// bench/results/gpt_step.json (or --out). --bf16 also times HAP's step with bf16 mixed precision
// (train.precision: bf16, ops::AutocastGuard) right after its f32 step. Each HAP row also gives
// step_peak_bytes: the most the device's allocator held during a step beyond what it held at the
// step's start (activations, gradients, temporaries), and forward_saved_bytes: what the forward
// left allocated for backward (the activations autograd keeps), over the steps after the first.
//   bench_gpt_step [--sizes gpt-mini,gpt2-124m,gpt2-124m-t1024] [--iters N] [--warmup N]
//                  [--threads N] [--device cpu|cuda] [--python PATH] [--out FILE] [--profile]
//                  [--bf16]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "models/gpt.h"
#include "models/optim.h"
#include "ops/cpu/blas.h"
#include "ops/dispatch.h"
#include "ops/threads.h"

namespace {

struct Size {
  std::string name;
  int64_t n_layer, n_embd, n_head, seq, batch, vocab;
};

const std::vector<Size> kSizes = {{"gpt-mini", 4, 256, 4, 128, 16, 256},
                                  {"gpt2-124m", 12, 768, 12, 64, 4, 50257},
                                  {"gpt2-124m-t1024", 12, 768, 12, 1024, 8, 50257}};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Model FLOPs of a training step: 6 per parameter and token plus attention's 12 L T C per token
// (the PaLM appendix's count).
double step_flops(const Size& s, int64_t n_params) {
  const double tokens = static_cast<double>(s.batch * s.seq);
  return 6.0 * static_cast<double>(n_params) * tokens +
         12.0 * static_cast<double>(s.n_layer * s.seq * s.n_embd) * tokens;
}

// The device's f32 GEMM rate (FLOP/s): the median of `iters` 4096^3 products (8192^3 on a GPU).
double gemm_peak(hap::Device device, int iters, hap::DType dtype = hap::DType::F32) {
  const int64_t n = device.is_cuda() ? 8192 : 2048;
  hap::Tensor a = hap::randn({n, n}, 1).to(dtype).to(device),
              b = hap::randn({n, n}, 2).to(dtype).to(device);
  std::vector<double> s;
  for (int i = 0; i < iters + 2; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    hap::Tensor c = hap::ops::call1(hap::ops::OpKind::MatMul, {a, b});
    hap::synchronize(device);
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) s.push_back(t);
  }
  return 2.0 * static_cast<double>(n * n * n) / median(s);
}

nlohmann::json time_hap(const Size& s, int warmup, int iters, bool profile, hap::Device device,
                        hap::DType precision = hap::DType::F32) {
  hap::nn::GPTConfig c;
  c.vocab_size = s.vocab;
  c.block_size = s.seq;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_embd = s.n_embd;
  c.seed = 1234;
  hap::nn::GPT model(c);
  model.to(device);  // before the optimizer: its state is made on the parameters' device
  hap::optim::AdamW opt(hap::optim::weight_decay_groups(model.named_parameters(), 0.1),
                        {3e-4, {0.9, 0.95}, 1e-8, 0.1});
  std::vector<double> ms;
  hap::Allocator& memory = hap::allocator_for(device.kind);
  size_t peak_bytes = 0;   // the most allocated during a step (after the first), over its start
  size_t saved_bytes = 0;  // what the forward left allocated for backward (loss included)
  for (int i = 0; i < warmup + iters; ++i) {
    if (profile && i == warmup) {
      hap::ops::reset_dispatch_stats();
      hap::ops::set_profiling(true);
    }
    hap::Tensor u = hap::rand({2, s.batch, s.seq}, 99, static_cast<uint64_t>(i));
    std::vector<int64_t> idx, tgt;
    std::vector<double> r = u.to_vector();
    for (int64_t j = 0; j < s.batch * s.seq; ++j) {
      idx.push_back(static_cast<int64_t>(r[j] * s.vocab) % s.vocab);
      tgt.push_back(static_cast<int64_t>(r[s.batch * s.seq + j] * s.vocab) % s.vocab);
    }
    hap::Tensor x = hap::Tensor::from_vector(idx, {s.batch, s.seq}).to(device);
    hap::Tensor y = hap::Tensor::from_vector(tgt, {s.batch, s.seq}).to(device);
    hap::synchronize(device);
    const size_t at_start = memory.stats(device.index).allocated_bytes;
    memory.reset_peak(device.index);
    auto t0 = std::chrono::steady_clock::now();
    hap::Tensor loss;
    {
      hap::ops::AutocastGuard mixed(precision);
      loss = model.loss(x, y);
    }
    const size_t after_forward = memory.stats(device.index).allocated_bytes - at_start;
    loss.backward();
    opt.step();
    opt.zero_grad();
    hap::synchronize(device);
    double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) ms.push_back(t);
    if (i > 0) {
      peak_bytes = std::max(peak_bytes, memory.stats(device.index).peak_allocated_bytes - at_start);
      saved_bytes = std::max(saved_bytes, after_forward);
    }
  }
  if (profile) {
    hap::ops::set_profiling(false);
    std::printf("%s: kernel time by op over %d steps\n%s", s.name.c_str(), iters,
                hap::ops::profile_report(25).c_str());
  }
  double med = median(ms);
  return {{"framework", "hap"},
          {"precision", precision == hap::DType::BF16 ? "bf16" : "f32"},
          {"step_ms", ms},
          {"median_ms", med},
          {"tokens_per_s", static_cast<double>(s.batch * s.seq) / (med / 1000.0)},
          {"step_peak_bytes", peak_bytes},
          {"forward_saved_bytes", saved_bytes},
          {"n_params", model.num_parameters()}};
}

nlohmann::json time_torch(const Size& s, int warmup, int iters, int threads, const std::string& tmp,
                          const std::string& python, hap::Device device) {
  std::ostringstream cmd;
  const char* src = std::getenv("HAP_SOURCE_DIR");  // another machine than the build's
  cmd << python << " " << (src && *src ? src : HAP_SOURCE_DIR)
      << "/bench/torch_gpt_step.py --device " << (device.is_cuda() ? "cuda" : "cpu")
      << " --n-layer " << s.n_layer << " --n-head " << s.n_head << " --n-embd " << s.n_embd
      << " --vocab " << s.vocab << " --block-size " << s.seq << " --batch " << s.batch << " --seq "
      << s.seq << " --threads " << threads << " --warmup " << warmup << " --iters " << iters
      << " --json " << tmp;
  int rc = std::system(cmd.str().c_str());
  if (rc != 0) {
    std::fprintf(stderr, "bench_gpt_step: the PyTorch step failed (exit %d): %s\n", rc,
                 cmd.str().c_str());
    return {{"framework", "pytorch"}, {"error", "exit code " + std::to_string(rc)}};
  }
  std::ifstream in(tmp);
  return nlohmann::json::parse(in);
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App cli{"Time a GPT training step in HAP and in PyTorch"};
  std::string sizes_arg = "gpt-mini,gpt2-124m",
              out = std::string(HAP_SOURCE_DIR) + "/bench/results/gpt_step.json";
  int iters = 10, warmup = 3, threads = 0;
  bool profile = false, bf16 = false;
  std::string device_arg = "cpu", python = "/usr/bin/python3";
  cli.add_option("--sizes", sizes_arg, "comma-separated: gpt-mini, gpt2-124m, gpt2-124m-t1024");
  cli.add_option("--device", device_arg, "cpu, cuda or cuda:N (both frameworks)");
  cli.add_option("--python", python, "the Python with PyTorch for the peer");
  cli.add_option("--iters", iters, "timed steps per framework")->check(CLI::PositiveNumber);
  cli.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  cli.add_option("--threads", threads, "threads for both frameworks (0 = all cores)");
  cli.add_option("--out", out, "results JSON");
  cli.add_flag("--profile", profile, "print HAP's kernel time per op");
  cli.add_flag("--bf16", bf16, "also time HAP's step with bf16 mixed precision");
  CLI11_PARSE(cli, argc, argv);

  const std::optional<hap::Device> device = hap::parse_device(device_arg);
  if (!device) {
    std::fprintf(stderr, "bench_gpt_step: --device: expected cpu, cuda or cuda:N, got '%s'\n",
                 device_arg.c_str());
    return 2;
  }
  hap::set_num_threads(threads);
  threads = hap::num_threads();
  const double peak = gemm_peak(*device, 5);
  std::printf("%s f32 GEMM rate: %.2f TFLOP/s (the MFU's peak)\n", device->str().c_str(),
              peak / 1e12);
  if (device->is_cpu()) std::printf("%s\n", hap::cpu::gemm_description().c_str());
  // The bf16 step's MFU is over the bf16 GEMM rate (bf16 operands, f32 accumulation).
  const double peak_bf16 = bf16 ? gemm_peak(*device, 5, hap::DType::BF16) : 0.0;
  if (bf16)
    std::printf("%s bf16 GEMM rate: %.2f TFLOP/s (the bf16 step's MFU peak)\n",
                device->str().c_str(), peak_bf16 / 1e12);
  nlohmann::json results = nlohmann::json::array();
  std::stringstream ss(sizes_arg);
  std::string name;
  while (std::getline(ss, name, ',')) {
    auto it =
        std::find_if(kSizes.begin(), kSizes.end(), [&](const Size& s) { return s.name == name; });
    if (it == kSizes.end()) {
      std::fprintf(stderr, "bench_gpt_step: unknown size '%s' (expected gpt-mini or gpt2-124m)\n",
                   name.c_str());
      return 2;
    }
    std::printf("== %s: %ld layers, d=%ld, %ld heads, T=%ld, B=%ld, vocab %ld, %d threads\n",
                it->name.c_str(), (long)it->n_layer, (long)it->n_embd, (long)it->n_head,
                (long)it->seq, (long)it->batch, (long)it->vocab, threads);
    std::fflush(stdout);
    nlohmann::json hap_r = time_hap(*it, warmup, iters, profile, *device);
    nlohmann::json bf16_r;
    if (bf16) bf16_r = time_hap(*it, warmup, iters, profile, *device, hap::DType::BF16);
    nlohmann::json torch_r =
        time_torch(*it, warmup, iters, threads, out + ".torch.tmp", python, *device);
    const double flops = step_flops(*it, hap_r["n_params"].get<int64_t>());
    for (nlohmann::json* r : {&hap_r, &bf16_r, &torch_r})
      if (r->contains("median_ms")) {
        (*r)["achieved_flops_per_s"] = flops / ((*r)["median_ms"].get<double>() / 1e3);
        (*r)["mfu"] =
            flops / ((*r)["median_ms"].get<double>() / 1e3) / (r == &bf16_r ? peak_bf16 : peak);
      }
    std::remove((out + ".torch.tmp").c_str());
    nlohmann::json row = {{"size", it->name},     {"n_layer", it->n_layer}, {"n_embd", it->n_embd},
                          {"n_head", it->n_head}, {"seq", it->seq},         {"batch", it->batch},
                          {"vocab", it->vocab},   {"hap", hap_r},           {"pytorch", torch_r}};
    if (bf16) {
      row["hap_bf16"] = bf16_r;
      row["bf16_speedup_over_f32"] =
          hap_r["median_ms"].get<double>() / bf16_r["median_ms"].get<double>();
      std::printf(
          "   hap bf16 mixed precision %.1f ms/step: %.2fx HAP's f32 step; kept for backward "
          "%.1f MiB (f32 %.1f MiB), a step's peak %.1f MiB (f32 %.1f MiB)\n",
          bf16_r["median_ms"].get<double>(), row["bf16_speedup_over_f32"].get<double>(),
          bf16_r["forward_saved_bytes"].get<double>() / (1 << 20),
          hap_r["forward_saved_bytes"].get<double>() / (1 << 20),
          bf16_r["step_peak_bytes"].get<double>() / (1 << 20),
          hap_r["step_peak_bytes"].get<double>() / (1 << 20));
    }
    if (torch_r.contains("median_ms")) {
      double ratio = hap_r["median_ms"].get<double>() / torch_r["median_ms"].get<double>();
      row["ratio_hap_over_pytorch"] = ratio;
      std::printf(
          "   hap %.1f ms/step (%.1f GFLOP/s, %.1f%% of the GEMM rate), pytorch %.1f ms/step "
          "(%.1f GFLOP/s, %.1f%%), ratio %.3f (<= 1.0 means HAP is as fast or faster)\n",
          hap_r["median_ms"].get<double>(), hap_r["achieved_flops_per_s"].get<double>() / 1e9,
          100 * hap_r["mfu"].get<double>(), torch_r["median_ms"].get<double>(),
          torch_r["achieved_flops_per_s"].get<double>() / 1e9, 100 * torch_r["mfu"].get<double>(),
          ratio);
    }
    std::fflush(stdout);
    results.push_back(row);
  }
  nlohmann::json doc = {{"benchmark", "gpt_step"},
                        {"device", device->str()},
                        {"threads", threads},
                        {"gemm_f32_flops_per_s", peak},
                        {"gemm_bf16_flops_per_s", peak_bf16},
                        {"cpu_gemm", hap::cpu::gemm_description()},
                        {"step_flops_formula", "6 N tokens + 12 L T C tokens"},
                        {"results", results}};
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt_step: error: %s\n", e.what());
    return 1;
  }
}
