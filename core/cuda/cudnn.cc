#include "core/cuda/cudnn.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/library.h"

namespace hap::cuda {

namespace {

struct Loaded {
  Cudnn fns{};
  std::string error;  // why it cannot be used ("" when it can)
};

template <typename F>
bool resolve(void* lib, const char* name, F* fn, std::string* error) {
  return resolve_function(lib, "libcudnn.so.9", name, fn, error, "a cuDNN older than 9?");
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    std::string why;
    void* lib = open_library(library_candidates("HAP_CUDNN_LIBRARY", "libcudnn.so.9"), &why);
    if (lib == nullptr) {
      r.error = "cannot open libcudnn.so.9 (" + why +
                "): install cuDNN 9, put its folder on LD_LIBRARY_PATH or name the file in "
                "HAP_CUDNN_LIBRARY";
      return r;
    }
    Cudnn& c = r.fns;
    size_t (*get_version)() = nullptr;
    const bool ok =
        resolve(lib, "cudnnGetVersion", &get_version, &r.error) &&
        resolve(lib, "cudnnCreate", &c.create, &r.error) &&
        resolve(lib, "cudnnGetErrorString", &c.error_string, &r.error) &&
        resolve(lib, "cudnnCreateTensorDescriptor", &c.create_tensor, &r.error) &&
        resolve(lib, "cudnnSetTensorNdDescriptor", &c.set_tensor, &r.error) &&
        resolve(lib, "cudnnDestroyTensorDescriptor", &c.destroy_tensor, &r.error) &&
        resolve(lib, "cudnnCreateFilterDescriptor", &c.create_filter, &r.error) &&
        resolve(lib, "cudnnSetFilterNdDescriptor", &c.set_filter, &r.error) &&
        resolve(lib, "cudnnDestroyFilterDescriptor", &c.destroy_filter, &r.error) &&
        resolve(lib, "cudnnCreateConvolutionDescriptor", &c.create_conv, &r.error) &&
        resolve(lib, "cudnnSetConvolutionNdDescriptor", &c.set_conv, &r.error) &&
        resolve(lib, "cudnnSetConvolutionGroupCount", &c.set_conv_groups, &r.error) &&
        resolve(lib, "cudnnSetConvolutionMathType", &c.set_conv_math, &r.error) &&
        resolve(lib, "cudnnDestroyConvolutionDescriptor", &c.destroy_conv, &r.error) &&
        resolve(lib, "cudnnGetConvolutionForwardAlgorithm_v7", &c.forward_algorithms, &r.error) &&
        resolve(lib, "cudnnConvolutionForward", &c.forward, &r.error) &&
        resolve(lib, "cudnnGetConvolutionBackwardDataAlgorithm_v7", &c.backward_data_algorithms,
                &r.error) &&
        resolve(lib, "cudnnConvolutionBackwardData", &c.backward_data, &r.error) &&
        resolve(lib, "cudnnGetConvolutionBackwardFilterAlgorithm_v7", &c.backward_filter_algorithms,
                &r.error) &&
        resolve(lib, "cudnnConvolutionBackwardFilter", &c.backward_filter, &r.error) &&
        resolve(lib, "cudnnAddTensor", &c.add_tensor, &r.error);
    if (!ok) {
      r.fns = Cudnn{};
      return r;
    }
    c.version = get_version();
    if (c.version < 90000) {
      r.error = "libcudnn.so.9 reports version " + std::to_string(c.version) + ", below 9.0";
      r.fns = Cudnn{};
    }
    return r;
  }();
  return l;
}

std::atomic<int> g_enabled{-1};  // -1: from the environment
std::atomic<int64_t> g_convolutions{0};

}  // namespace

const Cudnn* cudnn() {
  const Loaded& l = loaded();
  return l.error.empty() ? &l.fns : nullptr;
}

std::string cudnn_unavailable_reason() { return loaded().error; }

cudnnHandle_t cudnn_handle(int index) {
  const Cudnn* c = cudnn();
  HAP_CHECK(c != nullptr, "cuDNN: ", cudnn_unavailable_reason());
  static std::mutex mu;
  static std::map<int, cudnnHandle_t> handles;
  check_device(index);
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(index);
  if (it != handles.end()) return it->second;
  set_device(index);
  cudnnHandle_t h = nullptr;
  HAP_CUDNN_CHECK(c->create(&h));
  handles.emplace(index, h);
  return h;
}

bool cudnn_enabled() {
  int on = g_enabled.load();
  if (on < 0) {
    const char* env = std::getenv("HAP_CUDNN");
    on = env == nullptr || std::strcmp(env, "0") != 0;
    g_enabled.store(on);
  }
  return on && cudnn() != nullptr;
}

void set_cudnn_enabled(bool on) { g_enabled.store(on ? 1 : 0); }

int64_t cudnn_convolutions() { return g_convolutions.load(); }
void count_cudnn_convolution() { ++g_convolutions; }

}  // namespace hap::cuda
