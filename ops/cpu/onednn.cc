#include "ops/cpu/onednn.h"

#include "core/cpu_features.h"
#include "core/error.h"

#ifdef HAP_HAVE_ONEDNN
#include <omp.h>

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#endif

namespace hap::cpu::onednn {

#ifdef HAP_HAVE_ONEDNN

namespace {

#define HAP_DNNL_CHECK(call)                                                                \
  do {                                                                                      \
    dnnl_status_t status_ = (call);                                                         \
    HAP_CHECK(status_ == dnnl_success, "oneDNN: ", #call, " failed with status ", status_); \
  } while (0)

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "any";
  }
}

// One matmul primitive per element type, operand layout and scaling, reused: building one costs
// far more than a small product.
using Key = std::tuple<dnnl::memory::data_type, bool, bool, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, float, float>;

dnnl::memory::desc matrix(int64_t rows, int64_t cols, dnnl::memory::data_type type, bool trans,
                          int64_t ld) {
  return dnnl::memory::desc({rows, cols}, type,
                            trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

struct Matmuls {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, dnnl::matmul> cache;

  dnnl::matmul get(const Key& key) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    auto [type, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta] = key;
    dnnl::primitive_attr attr;
    // alpha scales the f32 accumulator; beta adds beta * c before the one rounding to the
    // destination type.
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(matrix(m, k, type, ta, lda), matrix(k, n, type, tb, ldb),
                           matrix(m, n, type, false, ldc)),
        attr, engine);
    if (cache.size() >= 512) cache.clear();
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }
};

Matmuls& matmuls() {
  static Matmuls m;
  return m;
}

// c = alpha * op(a) op(b) + beta * c through a matmul primitive (brgemm kernels), a, b, c of
// `type`.
void run_matmul(dnnl::memory::data_type type, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                float alpha, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                void* c, int64_t ldc) {
  Matmuls& mm = matmuls();
  try {
    dnnl::matmul prim = mm.get(Key{type, ta, tb, m, n, k, lda, ldb, ldc, alpha, beta});
    thread_local dnnl::stream stream(mm.engine);
    // The memories only describe the caller's buffers (no copies); oneDNN takes void*.
    dnnl::memory am(matrix(m, k, type, ta, lda), mm.engine, const_cast<void*>(a));
    dnnl::memory bm(matrix(k, n, type, tb, ldb), mm.engine, const_cast<void*>(b));
    dnnl::memory cm(matrix(m, n, type, false, ldc), mm.engine, c);
    prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  } catch (const dnnl::error& e) {
    HAP_CHECK(false, "oneDNN: matmul [", m, ", ", k, "] x [", k, ", ", n, "] failed: ", e.what(),
              " (status ", e.status, ")");
  }
}

// Which f32 products take the matmul primitive rather than dnnl_sgemm: x W^T (a transposed B, the
// forward of every linear layer) on a few hundred rows, outside parallel regions and large enough
// to repay the primitive's lookup. Measured on GPT's shapes with 2 threads (docs/cpu.md): brgemm
// 1.1-1.6x faster on 256 rows, dnnl_sgemm as fast or faster on 2048 rows and on the other
// layouts. A fixed rule per shape, so the same product always takes the same kernel
// (bitwise-repeatable runs).
bool f32_takes_matmul(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  return tb && !ta && m <= 512 && !omp_in_parallel() &&
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >= (1 << 22);
}

}  // namespace

bool built() { return true; }

std::string version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

std::string isa() { return isa_name(dnnl_get_effective_cpu_isa()); }

bool bf16_native() {
  const CpuFeatures& f = cpu_features();
  dnnl_cpu_isa_t effective = dnnl_get_effective_cpu_isa();
  bool isa_has_bf16 =
      effective == dnnl_cpu_isa_avx512_core_bf16 || effective == dnnl_cpu_isa_avx512_core_amx;
  return isa_has_bf16 && (f.avx512_bf16 || f.amx_bf16);
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (f32_takes_matmul(ta, tb, m, n, k)) {
    run_matmul(dnnl::memory::data_type::f32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  HAP_DNNL_CHECK(
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

void sgemm_only(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  HAP_DNNL_CHECK(
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

void matmul_only(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  run_matmul(dnnl::memory::data_type::f32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const bf16* a,
               int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c, int64_t ldc) {
  run_matmul(dnnl::memory::data_type::bf16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

#else  // built without oneDNN

bool built() { return false; }
std::string version() { return ""; }
std::string isa() { return ""; }
bool bf16_native() { return false; }
void sgemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
           int64_t, float, float*, int64_t) {
  HAP_ASSERT(false, "oneDNN GEMM called in a build without oneDNN");
}
void sgemm_only(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                int64_t, float, float*, int64_t) {
  HAP_ASSERT(false, "oneDNN GEMM called in a build without oneDNN");
}
void matmul_only(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                 int64_t, float, float*, int64_t) {
  HAP_ASSERT(false, "oneDNN GEMM called in a build without oneDNN");
}
void gemm_bf16(bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t, const bf16*,
               int64_t, float, bf16*, int64_t) {
  HAP_ASSERT(false, "oneDNN GEMM called in a build without oneDNN");
}

#endif

}  // namespace hap::cpu::onednn
