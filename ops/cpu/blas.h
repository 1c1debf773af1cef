// GEMM on the CPU through OpenBLAS (row-major). C = alpha * op(A) op(B) + beta * C.
#pragma once
#include <cstdint>

namespace hap::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

}  // namespace hap::cpu
