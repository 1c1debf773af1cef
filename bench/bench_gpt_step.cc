// One GPT training step (forward, backward, AdamW) timed for HAP and for PyTorch's CPU step on
// the identical model, batch and thread count, in one run. Writes bench/results/gpt_step.json.
//   bench_gpt_step [--sizes gpt-mini,gpt2-124m] [--iters N] [--warmup N] [--threads N]
//                  [--out FILE] [--profile]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/gpt.h"
#include "models/optim.h"
#include "ops/dispatch.h"
#include "ops/threads.h"

namespace {

struct Size {
  std::string name;
  int64_t n_layer, n_embd, n_head, seq, batch, vocab;
};

const std::vector<Size> kSizes = {{"gpt-mini", 4, 256, 4, 128, 16, 256},
                                  {"gpt2-124m", 12, 768, 12, 64, 4, 50257}};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

nlohmann::json time_hap(const Size& s, int warmup, int iters, bool profile) {
  hap::nn::GPTConfig c;
  c.vocab_size = s.vocab;
  c.block_size = s.seq;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_embd = s.n_embd;
  c.seed = 1234;
  hap::nn::GPT model(c);
  hap::optim::AdamW opt(hap::optim::weight_decay_groups(model.named_parameters(), 0.1),
                        {3e-4, {0.9, 0.95}, 1e-8, 0.1});
  std::vector<double> ms;
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
    hap::Tensor x = hap::Tensor::from_vector(idx, {s.batch, s.seq});
    hap::Tensor y = hap::Tensor::from_vector(tgt, {s.batch, s.seq});
    auto t0 = std::chrono::steady_clock::now();
    hap::Tensor loss = model.loss(x, y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    double t =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) ms.push_back(t);
  }
  if (profile) {
    hap::ops::set_profiling(false);
    std::printf("%s: kernel time by op over %d steps\n%s", s.name.c_str(), iters,
                hap::ops::profile_report(25).c_str());
  }
  double med = median(ms);
  return {{"framework", "hap"},
          {"step_ms", ms},
          {"median_ms", med},
          {"tokens_per_s", static_cast<double>(s.batch * s.seq) / (med / 1000.0)},
          {"n_params", model.num_parameters()}};
}

nlohmann::json time_torch(const Size& s, int warmup, int iters, int threads,
                          const std::string& tmp) {
  std::ostringstream cmd;
  cmd << "/usr/bin/python3 " << HAP_SOURCE_DIR << "/bench/torch_gpt_step.py --n-layer " << s.n_layer
      << " --n-head " << s.n_head << " --n-embd " << s.n_embd << " --vocab " << s.vocab
      << " --block-size " << s.seq << " --batch " << s.batch << " --seq " << s.seq << " --threads "
      << threads << " --warmup " << warmup << " --iters " << iters << " --json " << tmp;
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

int main(int argc, char** argv) {
  CLI::App cli{"Time a GPT training step in HAP and in PyTorch"};
  std::string sizes_arg = "gpt-mini,gpt2-124m",
              out = std::string(HAP_SOURCE_DIR) + "/bench/results/gpt_step.json";
  int iters = 10, warmup = 3, threads = 0;
  bool profile = false;
  cli.add_option("--sizes", sizes_arg, "comma-separated: gpt-mini, gpt2-124m");
  cli.add_option("--iters", iters, "timed steps per framework")->check(CLI::PositiveNumber);
  cli.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  cli.add_option("--threads", threads, "threads for both frameworks (0 = all cores)");
  cli.add_option("--out", out, "results JSON");
  cli.add_flag("--profile", profile, "print HAP's kernel time per op");
  CLI11_PARSE(cli, argc, argv);

  hap::set_num_threads(threads);
  threads = hap::num_threads();
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
    nlohmann::json hap_r = time_hap(*it, warmup, iters, profile);
    nlohmann::json torch_r = time_torch(*it, warmup, iters, threads, out + ".torch.tmp");
    std::remove((out + ".torch.tmp").c_str());
    nlohmann::json row = {{"size", it->name},     {"n_layer", it->n_layer}, {"n_embd", it->n_embd},
                          {"n_head", it->n_head}, {"seq", it->seq},         {"batch", it->batch},
                          {"vocab", it->vocab},   {"hap", hap_r},           {"pytorch", torch_r}};
    if (torch_r.contains("median_ms")) {
      double ratio = hap_r["median_ms"].get<double>() / torch_r["median_ms"].get<double>();
      row["ratio_hap_over_pytorch"] = ratio;
      std::printf(
          "   hap %.1f ms/step, pytorch %.1f ms/step, ratio %.3f (<= 1.0 means HAP is as fast or "
          "faster)\n",
          hap_r["median_ms"].get<double>(), torch_r["median_ms"].get<double>(), ratio);
    }
    std::fflush(stdout);
    results.push_back(row);
  }
  nlohmann::json doc = {{"benchmark", "gpt_step"}, {"threads", threads}, {"results", results}};
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
