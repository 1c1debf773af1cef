#include "core/cuda/library.h"

namespace hap::cuda {

std::vector<std::string> library_candidates(const char* env, const char* soname) {
  std::vector<std::string> tries;
  if (const char* v = env ? std::getenv(env) : nullptr; v && *v) tries.push_back(v);
  tries.push_back(soname);
#ifdef HAP_CUDA_LIBRARY_DIR
  tries.push_back(std::string(HAP_CUDA_LIBRARY_DIR) + "/" + soname);
  tries.push_back(std::string(HAP_CUDA_LIBRARY_DIR) + "/../lib/" + soname);
#endif
  return tries;
}

void* open_library(const std::vector<std::string>& candidates, std::string* why) {
  why->clear();
  for (const std::string& t : candidates) {
    if (void* lib = dlopen(t.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      why->clear();
      return lib;
    }
    const char* e = dlerror();
    *why += (why->empty() ? "" : "; ") + std::string(e ? e : t + ": cannot be opened");
  }
  return nullptr;
}

}  // namespace hap::cuda
