#include "ops/cpu/blas.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/cpu/multiversion.h"
#include "ops/cpu/onednn.h"
#include "ops/threads.h"

namespace hap::cpu {

namespace {

// OpenBLAS's kernel sets by the vector width they use: 1 SSE, 2 AVX, 3 AVX2+FMA, 4 AVX-512.
// The names are its own core names (openblas_get_corename); -1 for a name not listed.
int openblas_core_level(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  for (const char* n : {"skylakex", "cooperlake", "sapphirerapids"})
    if (name == n) return 4;
  for (const char* n : {"haswell", "zen"})
    if (name == n) return 3;
  for (const char* n : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (name == n) return 2;
  for (const char* n :
       {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "opteron", "opteron_sse3",
        "barcelona", "bobcat", "katmai", "coppermine", "northwood", "banias", "athlon", "nano"})
    if (name == n) return 1;
  return -1;
}

int feature_level() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_core()) return 4;
  if (f.avx2 && f.fma) return 3;
  if (f.avx) return 2;
  return 1;
}

std::once_flag g_path_once;
std::atomic<int> g_path{-1};

void resolve_path() {
  std::call_once(g_path_once, [] {
    if (g_path.load() >= 0) return;  // set_gemm_path came first
    const char* env = std::getenv("HAP_CPU_GEMM");
    GemmPath p = env && *env ? parse_gemm_path(env) : best_gemm_path();
    int expected = -1;
    g_path.compare_exchange_strong(expected, static_cast<int>(p));
  });
}

// c = alpha * op(a) op(b) + beta * c in plain loops: per row of c, an accumulator row in T
// gathers a[i][p] * b[p][:] for p in order.
template <typename T>
void gemm_reference(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                    int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
#pragma omp parallel if (m * n * k > (int64_t{1} << 16))
  {
    std::vector<T> acc(static_cast<size_t>(n));
#pragma omp for
    for (int64_t i = 0; i < m; ++i) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t p = 0; p < k; ++p) {
        T aip = ta ? a[p * lda + i] : a[i * lda + p];
        if (tb) {
          for (int64_t j = 0; j < n; ++j) acc[j] += aip * b[j * ldb + p];
        } else {
          const T* brow = b + p * ldb;
          for (int64_t j = 0; j < n; ++j) acc[j] += aip * brow[j];
        }
      }
      T* crow = c + i * ldc;
      for (int64_t j = 0; j < n; ++j)
        crow[j] = beta == T(0) ? alpha * acc[j] : alpha * acc[j] + beta * crow[j];
    }
  }
}

// The epilogue of every bf16 path: c = bf16(alpha * acc + beta * f32(c)), one rounding.
void finish_bf16(int64_t m, int64_t n, float alpha, const float* acc, float beta, bf16* c,
                 int64_t ldc) {
#pragma omp parallel for if (m * n > (int64_t{1} << 15))
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float v = alpha * acc[i * n + j];
      if (beta != 0.0f) v += beta * static_cast<float>(c[i * ldc + j]);
      c[i * ldc + j] = bf16(v);
    }
}

// op(x) widened into out, a contiguous f32 [rows, cols] matrix.
void widen(bool trans, int64_t rows, int64_t cols, const bf16* x, int64_t ld, float* out) {
#pragma omp parallel for if (rows * cols > (int64_t{1} << 15))
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = static_cast<float>(trans ? x[j * ld + i] : x[i * ld + j]);
}

// The BLAS meaning of an empty product: c = beta * c (beta = 0 overwrites, even NaN). True when
// there is nothing left to multiply.
template <typename T>
bool empty_product(int64_t m, int64_t n, int64_t k, T beta, T* c, int64_t ldc) {
  if (m > 0 && n > 0 && k > 0) return false;
  for (int64_t i = 0; i < m && k == 0; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  return true;
}

}  // namespace

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Reference:
      return "reference";
    case GemmPath::OpenBLAS:
      return "openblas";
    case GemmPath::OneDNN:
      return "onednn";
  }
  return "?";
}

bool gemm_path_available(GemmPath path, std::string* why) {
  if (path != GemmPath::OneDNN) return true;
  if (!onednn::built()) {
    if (why) *why = "this build has no oneDNN (install libdnnl-dev and rebuild)";
    return false;
  }
  if (!cpu_features().avx2) {
    // Below AVX2 oneDNN's GEMM is not faster than OpenBLAS's SSE kernels: not offered.
    if (why) *why = "oneDNN's GEMM kernels here need AVX2";
    return false;
  }
  return true;
}

std::vector<GemmPath> available_gemm_paths() {
  std::vector<GemmPath> out;
  for (GemmPath p : {GemmPath::OneDNN, GemmPath::OpenBLAS, GemmPath::Reference})
    if (gemm_path_available(p)) out.push_back(p);
  return out;
}

GemmPath best_gemm_path() {
  // oneDNN generates its kernels for the instruction set it finds; measured ahead of OpenBLAS
  // (even with OpenBLAS on its right kernel set) on every GPT shape with 2 threads (docs/cpu.md).
  if (gemm_path_available(GemmPath::OneDNN)) return GemmPath::OneDNN;
  return GemmPath::OpenBLAS;
}

GemmPath parse_gemm_path(const std::string& name, const std::string& source) {
  if (name == "auto") return best_gemm_path();
  GemmPath p;
  if (name == "onednn") {
    p = GemmPath::OneDNN;
  } else if (name == "openblas") {
    p = GemmPath::OpenBLAS;
  } else if (name == "reference") {
    p = GemmPath::Reference;
  } else {
    HAP_CHECK(false, source, "='", name,
              "' is not a CPU GEMM path: expected auto, onednn, openblas or reference");
  }
  std::string why;
  HAP_CHECK(gemm_path_available(p, &why), source, "='", name, "' cannot run here: ", why,
            "; this CPU (", cpu_features().brand.empty() ? "unknown model" : cpu_features().brand,
            ") has ", cpu_features().list());
  return p;
}

GemmPath gemm_path() {
  resolve_path();
  return static_cast<GemmPath>(g_path.load(std::memory_order_relaxed));
}

void set_gemm_path(GemmPath path) {
  std::string why;
  HAP_CHECK(gemm_path_available(path, &why), "CPU GEMM path ", gemm_path_name(path),
            " cannot run here: ", why);
  g_path.store(static_cast<int>(path));
}

std::string openblas_core() { return openblas_get_corename(); }

std::string openblas_core_for_features() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_core()) return f.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (f.avx2 && f.fma) return "Haswell";
  if (f.avx) return "Sandybridge";
  if (f.sse42) return "Nehalem";
  return "Prescott";
}

bool openblas_core_is_generic() {
  int level = openblas_core_level(openblas_core());
  return level >= 0 && level < feature_level();
}

const char* vector_kernels() {
#if defined(HAP_NATIVE_BUILD)
  return "native (-march=native build)";
#elif defined(HAP_MULTIVERSION_ON)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 clones";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 clones";
  return "baseline clones";
#else
  return "baseline x86-64";
#endif
}

std::string gemm_bf16_description() {
  GemmPath p = gemm_path();
  if (p == GemmPath::OneDNN && onednn::bf16_native()) return "onednn (" + onednn::isa() + ")";
  return std::string("widened to f32, ") + gemm_path_name(p);
}

std::string gemm_description() {
  const CpuFeatures& f = cpu_features();
  std::string s = "cpu: " + f.summary();
  if (!f.brand.empty()) s += " (" + f.brand + ")";
  GemmPath p = gemm_path();
  s += ", gemm: ";
  s += gemm_path_name(p);
  if (p == GemmPath::OneDNN) s += " " + onednn::version() + " (" + onednn::isa() + ")";
  if (p == GemmPath::OpenBLAS) s += " (core " + openblas_core() + ")";
  s += ", bf16 gemm: " + gemm_bf16_description();
  s += ", vector kernels: ";
  s += vector_kernels();
  s += ", openblas core " + openblas_core();
  if (openblas_core_is_generic())
    s += " (generic: below this CPU's " + f.summary() +
         "; OPENBLAS_CORETYPE=" + openblas_core_for_features() + " would match it)";
  return s;
}

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (empty_product(m, n, k, beta, c, ldc)) return;
  switch (gemm_path()) {
    case GemmPath::OneDNN:
      onednn::sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case GemmPath::Reference:
      gemm_reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case GemmPath::OpenBLAS:
      break;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (empty_product(m, n, k, beta, c, ldc)) return;
  if (gemm_path() == GemmPath::Reference) {
    gemm_reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k > 0 && gemm_path() == GemmPath::OneDNN && onednn::bf16_native()) {
    onednn::gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Widened to f32 (work tensors from the caching allocator): one f32 product, one rounding.
  Tensor acc = Tensor::empty({m, n});
  float* pacc = acc.data<float>();
  if (k > 0) {
    Tensor a32 = Tensor::empty({m, k}), b32 = Tensor::empty({k, n});
    widen(ta, m, k, a, lda, a32.data<float>());
    widen(tb, k, n, b, ldb, b32.data<float>());
    gemm<float>(false, false, m, n, k, 1.0f, a32.data<float>(), k, b32.data<float>(), n, 0.0f, pacc,
                n);
  } else {
    std::fill(pacc, pacc + m * n, 0.0f);
  }
  finish_bf16(m, n, alpha, pacc, beta, c, ldc);
}

template <>
void gemm<bf16>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, bf16 alpha, const bf16* a,
                int64_t lda, const bf16* b, int64_t ldb, bf16 beta, bf16* c, int64_t ldc) {
  gemm_bf16(ta, tb, m, n, k, static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c,
            ldc);
}

}  // namespace hap::cpu

namespace hap {

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace hap
