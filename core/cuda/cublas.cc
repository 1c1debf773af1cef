#include "core/cuda/cublas.h"

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"

namespace hap::cuda {

namespace {

constexpr const char* kLibrary = "libcublas.so.13";

template <typename F>
void resolve(void* lib, const char* name, F* fn) {
  void* sym = dlsym(lib, name);
  HAP_CHECK(sym != nullptr, "cuBLAS: ", kLibrary, " has no function ", name,
            " (a cuBLAS older than CUDA 13's?)");
  *fn = reinterpret_cast<F>(sym);
}

}  // namespace

const Cublas& cublas() {
  static const Cublas c = [] {
    // The library path and folders first, then the toolkit's folder this build was made with.
    void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    std::string why = lib ? "" : dlerror();
#ifdef HAP_CUDA_LIBRARY_DIR
    if (lib == nullptr)
      lib = dlopen(HAP_CUDA_LIBRARY_DIR "/libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
#endif
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
