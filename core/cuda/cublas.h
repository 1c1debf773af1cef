// cuBLAS, opened on first use (dlopen of libcublas.so.13): a process that never multiplies on a
// GPU does not load it, and a machine without it gets a clear error at the first GPU product.
// One handle per device, on the default stream.
#pragma once
#include <cublas_api.h>

#include <cstdint>

#include "core/error.h"

namespace hap::cuda {

struct Cublas {
  cublasStatus_t (*create)(cublasHandle_t*);
  const char* (*status_string)(cublasStatus_t);
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                         int64_t, int64_t, int64_t, const void*, const void*,
                                         cudaDataType, int64_t, long long, const void*,
                                         cudaDataType, int64_t, long long, const void*, void*,
                                         cudaDataType, int64_t, long long, int64_t,
                                         cublasComputeType_t, cublasGemmAlgo_t);
};

// The loaded library's functions; throws a hap::Error naming the library file when it cannot
// be opened or lacks a function.
const Cublas& cublas();
// The handle for device `index` (created on first use).
cublasHandle_t cublas_handle(int index);

}  // namespace hap::cuda

// A cuBLAS call that fails becomes a hap::Error naming the call and cuBLAS's status.
#define HAP_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                           \
    const cublasStatus_t hap_cublas_st_ = (call);                                                \
    if (hap_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      throw ::hap::Error(                                                                        \
          ::hap::detail::concat("cuBLAS: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                ::hap::cuda::cublas().status_string(hap_cublas_st_)));           \
  } while (0)
