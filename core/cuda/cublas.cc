#include "core/cuda/cublas.h"

#include <map>
#include <mutex>
#include <string>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"
#include "core/cuda/library.h"

namespace hap::cuda {

namespace {

constexpr const char* kLibrary = "libcublas.so.13";

template <typename F>
void resolve(void* lib, const char* name, F* fn) {
  std::string why;
  HAP_CHECK(resolve_function(lib, kLibrary, name, fn, &why, "a cuBLAS older than CUDA 13's?"),
            "cuBLAS: ", why);
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = [] {
    // The library path and folders first, then the toolkit's folder this build was made with.
    std::string why;
    void* lib = open_library(library_candidates(nullptr, kLibrary), &why);
    HAP_CHECK(lib != nullptr, "cuBLAS: cannot open ", kLibrary, " (", why,
              "): install the CUDA toolkit's cuBLAS or put its folder on LD_LIBRARY_PATH");
    Cublas r{};
    resolve(lib, "cublasCreate_v2", &r.create);
    resolve(lib, "cublasGetStatusString", &r.status_string);
    resolve(lib, "cublasGemmStridedBatchedEx_64", &r.gemm_strided_batched);
    return r;
  }();
  return c;
}

cublasHandle_t cublas_handle(int index) {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  check_device(index);
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(index);
  if (it != handles.end()) return it->second;
  ::hap::cuda::set_device(index);
  cublasHandle_t h = nullptr;
  HAP_CUBLAS_CHECK(cublas().create(&h));
  handles.emplace(index, h);
  return h;
}

}  // namespace hap::cuda
