// GEMM throughput: hap::matmul (dispatch, allocation, OpenBLAS) against OpenBLAS's cblas_sgemm
// called directly on the same sizes and threads. Writes bench/results/gemm.json.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "ops/threads.h"

namespace {

template <typename F>
double median_s(F f, int iters) {
  f();  // warm up (allocations, OpenBLAS buffers)
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: bench_gemm [OUT.json [THREADS]]  (default bench/results/gemm.json, all cores)\n";
  if (argc > 3 || (argc > 1 && argv[1][0] == '-')) {
    std::fputs(usage, argc > 1 && std::string(argv[1]) == "--help" ? stdout : stderr);
    return argc > 1 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::string out = argc > 1 ? argv[1] : "bench/results/gemm.json";
  int threads = 0;
  if (argc > 2) {
    const std::string t = argv[2];
    if (t.empty() || t.size() > 4 || t.find_first_not_of("0123456789") != std::string::npos) {
      std::fprintf(stderr, "bench_gemm: THREADS must be a count of threads, got '%s'\n%s", argv[2],
                   usage);
      return 2;
    }
    threads = std::stoi(t);
  }
  hap::set_num_threads(threads);
  hap::NoGradGuard no_grad;
  // Shapes of a GPT step: (M, N, K) of the QKV, MLP and vocabulary-head products, and squares.
  std::vector<std::array<int64_t, 3>> sizes = {
      {256, 256, 256},   {512, 512, 512},   {1024, 1024, 1024}, {2048, 768, 768},
      {2048, 3072, 768}, {2048, 768, 3072}, {256, 50257, 768}};
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-22s %12s %12s %8s\n", "M x N x K", "hap GF/s", "openblas GF/s", "ratio");
  for (auto [m, n, k] : sizes) {
    hap::Tensor a = hap::randn({m, k}, 1, 0), b = hap::randn({k, n}, 1, 1);
    hap::Tensor c = hap::Tensor::empty({m, n});
    double flops = 2.0 * m * n * k;
    int iters = flops > 5e10 ? 3 : flops > 5e9 ? 7 : 21;
    double t_hap = median_s([&] { hap::matmul(a, b); }, iters);
    double t_blas = median_s(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data<float>(), k,
                      b.data<float>(), n, 0.0f, c.data<float>(), n);
        },
        iters);
    double g_hap = flops / t_hap / 1e9, g_blas = flops / t_blas / 1e9;
    std::printf("%6ld x %6ld x %6ld %12.1f %12.1f %8.3f\n", (long)m, (long)n, (long)k, g_hap,
                g_blas, g_hap / g_blas);
    results.push_back({{"m", m},
                       {"n", n},
                       {"k", k},
                       {"hap_gflops", g_hap},
                       {"openblas_gflops", g_blas},
                       {"ratio", g_hap / g_blas},
                       {"hap_median_s", t_hap},
                       {"openblas_median_s", t_blas}});
  }
  nlohmann::json doc = {
      {"benchmark", "gemm"}, {"threads", hap::num_threads()}, {"results", results}};
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
