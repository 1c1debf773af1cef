// The oneDNN side of the CPU GEMM paths (ops/cpu/blas.h). Compiled against oneDNN where CMake
// finds it (HAP_HAVE_ONEDNN); otherwise built() is false and nothing else may be called.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace hap::cpu::onednn {

bool built();
// oneDNN's version ("2.6.3") and the instruction set its kernels are generated for on this CPU
// ("avx512_core_bf16", "avx2", ...).
std::string version();
std::string isa();
// Whether oneDNN runs bf16 products with bf16 instructions here (AVX512-BF16 or AMX).
bool bf16_native();

// f32: oneDNN's matmul primitive (brgemm kernels) for large x W^T products outside parallel
// regions, dnnl_sgemm for the rest (a fixed rule per shape: docs/cpu.md).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Each oneDNN f32 kernel on its own, for benchmarks that compare them.
void sgemm_only(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc);
void matmul_only(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc);
// c = bf16(alpha * op(A) op(B) + beta * f32(c)): bf16 operands, f32 accumulation, one rounding.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c,
               int64_t ldc);

}  // namespace hap::cpu::onednn
