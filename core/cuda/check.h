// Checking CUDA runtime calls: every call goes through HAP_CUDA_CHECK, which turns an error into a
// hap::Error naming the library, the call, where it was made and the runtime's error name and
// text ("CUDA runtime: cudaMalloc(&p, n) failed at core/cuda/backend.cc:80:
// cudaErrorMemoryAllocation: out of memory").
#pragma once
#include <cuda_runtime_api.h>

#include "core/error.h"

#define HAP_CUDA_CHECK(call)                                                          \
  do {                                                                                \
    const cudaError_t hap_cuda_err_ = (call);                                         \
    if (hap_cuda_err_ != cudaSuccess)                                                 \
      throw ::hap::Error(::hap::detail::concat(                                       \
          "CUDA runtime: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ",      \
          cudaGetErrorName(hap_cuda_err_), ": ", cudaGetErrorString(hap_cuda_err_))); \
  } while (0)
