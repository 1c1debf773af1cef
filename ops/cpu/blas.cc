#include "ops/cpu/blas.h"

#include <cblas.h>
#include <omp.h>

#include "ops/threads.h"

namespace hap::cpu {

template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
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
