// CPU GEMM throughput per shape, every candidate side by side in one run, same threads:
//   hap          hap::matmul (dispatch, allocation, the path HAP chose: ops/cpu/blas.h)
//   openblas     cblas_sgemm with the kernels OpenBLAS picked from its table of CPU models
//   openblas_fit cblas_sgemm with OPENBLAS_CORETYPE set from the CPU's instruction set (a child
//                process: OpenBLAS reads it once, when it loads)
//   dnnl_sg      oneDNN's dnnl_sgemm, and dnnl_mm its matmul primitive (brgemm), where built
//   hap_bf16     hap::matmul on bf16 tensors (bf16 products, f32 accumulation)
// and hap's share of the best f32 candidate. Writes bench/results/gemm.json.
#include <cblas.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/cpu_features.h"
#include "core/rng.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/onednn.h"
#include "ops/functional.h"
#include "ops/threads.h"

namespace {

// (trans_a, trans_b, M, N, K): op(A) is M x K, op(B) is K x N.
using Shape3 = std::array<int64_t, 5>;

// The products of a GPT-2 124M step on 2048 tokens (the vocabulary head on 256): each linear
// layer's forward x W^T (NT), its input gradient g W (NN) and its weight gradient g^T x (TN);
// forward products on 256 and 512 rows (bench_gpt_step's batch); attention's per-head products
// (T = 256, d = 64); squares; a single row.
const std::vector<Shape3> kShapes = {
    {0, 0, 256, 256, 256},   {0, 0, 512, 512, 512},   {0, 0, 1024, 1024, 1024},
    {0, 1, 2048, 2304, 768}, {0, 0, 2048, 768, 2304}, {1, 0, 2304, 768, 2048},
    {0, 1, 2048, 768, 768},  {0, 0, 2048, 768, 768},  {1, 0, 768, 768, 2048},
    {0, 1, 2048, 3072, 768}, {0, 0, 2048, 768, 3072}, {1, 0, 3072, 768, 2048},
    {0, 1, 2048, 768, 3072}, {0, 0, 2048, 3072, 768}, {1, 0, 768, 3072, 2048},
    {0, 1, 256, 50257, 768}, {0, 0, 256, 768, 50257}, {1, 0, 50257, 768, 256},
    {0, 1, 256, 768, 3072},  {0, 1, 256, 3072, 768},  {0, 1, 512, 768, 768},
    {0, 1, 256, 256, 64},    {0, 0, 256, 64, 256},    {0, 1, 1, 768, 768}};

int iterations(double flops) { return flops > 5e10 ? 5 : flops > 5e9 ? 9 : flops > 1e8 ? 21 : 201; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of each candidate, timed in interleaved rounds (candidate 1, 2, ..., then again)
// after two untimed rounds, so that a slow spell of the machine or memory that settles (pages,
// caches) falls on every candidate alike rather than on whichever is timed first.
std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& candidates,
                                        double flops) {
  std::vector<std::vector<double>> t(candidates.size());
  int iters = iterations(flops);
  for (int round = 0; round < iters + 2; ++round)
    for (size_t c = 0; c < candidates.size(); ++c) {
      auto a = std::chrono::steady_clock::now();
      candidates[c]();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
      if (round >= 2) t[c].push_back(s);
    }
  std::vector<double> out;
  for (auto& v : t) out.push_back(median(v));
  return out;
}

// A is stored K x M when transposed, B N x K; opa and opb are op(A) and op(B) as views.
struct Buffers {
  hap::Tensor a, b, c, opa, opb;
  int64_t lda, ldb;
  explicit Buffers(const Shape3& s)
      : a(s[0] ? hap::randn({s[4], s[2]}, 1, 0) : hap::randn({s[2], s[4]}, 1, 0)),
        b(s[1] ? hap::randn({s[3], s[4]}, 1, 1) : hap::randn({s[4], s[3]}, 1, 1)),
        c(hap::Tensor::empty({s[2], s[3]})),
        opa(s[0] ? hap::transpose(a, 0, 1) : a),
        opb(s[1] ? hap::transpose(b, 0, 1) : b),
        lda(a.shape()[1]),
        ldb(b.shape()[1]) {}
};

void openblas_sgemm(const Shape3& s, Buffers& x) {
  auto [ta, tb, m, n, k] = s;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, x.a.data<float>(), x.lda, x.b.data<float>(), x.ldb, 0.0f, x.c.data<float>(),
              n);
}

// OpenBLAS on the core type matching the instruction set, measured by this program run again
// with OPENBLAS_CORETYPE set; empty if that run failed.
std::map<Shape3, double> openblas_fit(const char* self, const std::string& core, int threads) {
  std::map<Shape3, double> out;
  std::string cmd =
      "OPENBLAS_CORETYPE=" + core + " '" + self + "' --openblas-only " + std::to_string(threads);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  long ta, tb, m, n, k;
  double g;
  while (std::fscanf(p, "%ld %ld %ld %ld %ld %lf", &ta, &tb, &m, &n, &k, &g) == 6)
    out[{ta, tb, m, n, k}] = g;
  if (pclose(p) != 0) out.clear();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: bench_gemm [OUT.json [THREADS]]  (default bench/results/gemm.json, all cores)\n";
  bool openblas_only = argc > 1 && std::string(argv[1]) == "--openblas-only";
  if (!openblas_only && (argc > 3 || (argc > 1 && argv[1][0] == '-'))) {
    std::fputs(usage, argc > 1 && std::string(argv[1]) == "--help" ? stdout : stderr);
    return argc > 1 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
  std::string out = argc > 1 && !openblas_only ? argv[1] : "bench/results/gemm.json";
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
  if (openblas_only) {
    for (const Shape3& s : kShapes) {
      Buffers x(s);
      double flops = 2.0 * s[2] * s[3] * s[4];
      double t = interleaved_medians({[&] { openblas_sgemm(s, x); }}, flops)[0];
      std::printf("%ld %ld %ld %ld %ld %.3f\n", (long)s[0], (long)s[1], (long)s[2], (long)s[3],
                  (long)s[4], flops / t / 1e9);
    }
    return 0;
  }

  const std::string core = hap::cpu::openblas_core(),
                    fit_core = hap::cpu::openblas_core_for_features();
  bool have_onednn = hap::cpu::gemm_path_available(hap::cpu::GemmPath::OneDNN);
  std::printf("%s\nthreads %d; openblas as detected: core %s; openblas_fit: OPENBLAS_CORETYPE=%s\n",
              hap::cpu::gemm_description().c_str(), hap::num_threads(), core.c_str(),
              fit_core.c_str());
  std::map<Shape3, double> fit = openblas_fit(argv[0], fit_core, hap::num_threads());
  if (fit.empty()) std::fprintf(stderr, "bench_gemm: the OPENBLAS_CORETYPE run failed\n");

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-25s %8s %8s %8s %8s %8s %8s %8s\n", "op M x N x K", "hap", "openblas", "ob_fit",
              "dnnl_sg", "dnnl_mm", "hap_bf16", "hap/best");
  std::vector<double> shares;
  for (const Shape3& s : kShapes) {
    auto [ta, tb, m, n, k] = s;
    Buffers x(s);
    double flops = 2.0 * m * n * k;
    hap::Tensor a16 = x.a.to(hap::DType::BF16), b16 = x.b.to(hap::DType::BF16);
    if (ta) a16 = hap::transpose(a16, 0, 1);
    if (tb) b16 = hap::transpose(b16, 0, 1);
    std::vector<std::function<void()>> candidates = {[&] { hap::matmul(x.opa, x.opb); },
                                                     [&] { openblas_sgemm(s, x); },
                                                     [&] { hap::matmul(a16, b16); }};
    if (have_onednn)
      candidates.push_back([&] {
        hap::cpu::onednn::sgemm_only(ta, tb, m, n, k, 1.0f, x.a.data<float>(), x.lda,
                                     x.b.data<float>(), x.ldb, 0.0f, x.c.data<float>(), n);
      });
    if (have_onednn)
      candidates.push_back([&] {
        hap::cpu::onednn::matmul_only(ta, tb, m, n, k, 1.0f, x.a.data<float>(), x.lda,
                                      x.b.data<float>(), x.ldb, 0.0f, x.c.data<float>(), n);
      });
    std::vector<double> t = interleaved_medians(candidates, flops);
    double g_hap = flops / t[0] / 1e9, g_blas = flops / t[1] / 1e9, g_bf16 = flops / t[2] / 1e9;
    double g_dnnl = have_onednn ? flops / t[3] / 1e9 : 0.0;
    double g_dnnl_mm = have_onednn ? flops / t[4] / 1e9 : 0.0;
    double g_fit = fit.count(s) ? fit[s] : 0.0;
    double best = std::max({g_blas, g_fit, g_dnnl, g_dnnl_mm});
    shares.push_back(g_hap / best);
    std::printf("%s%s %6ld x %6ld x %6ld %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.3f\n",
                ta ? "T" : "N", tb ? "T" : "N", (long)m, (long)n, (long)k, g_hap, g_blas, g_fit,
                g_dnnl, g_dnnl_mm, g_bf16, g_hap / best);
    results.push_back({{"op", std::string(ta ? "T" : "N") + (tb ? "T" : "N")},
                       {"m", m},
                       {"n", n},
                       {"k", k},
                       {"hap_gflops", g_hap},
                       {"openblas_gflops", g_blas},
                       {"openblas_fit_gflops", g_fit},
                       {"onednn_sgemm_gflops", g_dnnl},
                       {"onednn_matmul_gflops", g_dnnl_mm},
                       {"hap_bf16_gflops", g_bf16},
                       {"hap_share_of_best", g_hap / best}});
  }
  double worst = *std::min_element(shares.begin(), shares.end());
  std::printf("hap's lowest share of the best candidate: %.3f\n", worst);
  const hap::CpuFeatures& f = hap::cpu_features();
  nlohmann::json doc = {{"benchmark", "gemm"},
                        {"threads", hap::num_threads()},
                        {"cpu", f.brand},
                        {"cpu_features", f.list()},
                        {"description", hap::cpu::gemm_description()},
                        {"gemm_path", hap::cpu::gemm_path_name(hap::cpu::gemm_path())},
                        {"openblas_core", core},
                        {"openblas_fit_core", fit_core},
                        {"hap_lowest_share_of_best", worst},
                        {"results", results}};
  std::ofstream(out) << doc.dump(2) << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
