// cuDNN, opened on first use (dlopen of libcudnn.so.9, the shim that loads cuDNN's sub-libraries):
// a process that never convolves on a GPU does not load it, and a machine without it trains with
// HAP's own kernels instead (ops/cuda/conv.cu), saying why in cudnn_unavailable_reason(). The
// library is looked for in HAP_CUDNN_LIBRARY (a file), then on the library path, then in the CUDA
// toolkit folder this build was made with. One handle per device, on the default stream.
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <string>

#include "core/error.h"

namespace hap::cuda {

// The functions HAP calls: descriptors and the convolution API (cudnn_cnn.h; deprecated in
// cuDNN 9 in favour of the graph API but shipped and supported).
struct Cudnn {
  size_t version = 0;
  cudnnStatus_t (*create)(cudnnHandle_t*);
  const char* (*error_string)(cudnnStatus_t);
  cudnnStatus_t (*create_tensor)(cudnnTensorDescriptor_t*);
  cudnnStatus_t (*set_tensor)(cudnnTensorDescriptor_t, cudnnDataType_t, int, const int[],
                              const int[]);
  cudnnStatus_t (*destroy_tensor)(cudnnTensorDescriptor_t);
  cudnnStatus_t (*create_filter)(cudnnFilterDescriptor_t*);
  cudnnStatus_t (*set_filter)(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int,
                              const int[]);
  cudnnStatus_t (*destroy_filter)(cudnnFilterDescriptor_t);
  cudnnStatus_t (*create_conv)(cudnnConvolutionDescriptor_t*);
  cudnnStatus_t (*set_conv)(cudnnConvolutionDescriptor_t, int, const int[], const int[],
                            const int[], cudnnConvolutionMode_t, cudnnDataType_t);
  cudnnStatus_t (*set_conv_groups)(cudnnConvolutionDescriptor_t, int);
  cudnnStatus_t (*set_conv_math)(cudnnConvolutionDescriptor_t, cudnnMathType_t);
  cudnnStatus_t (*destroy_conv)(cudnnConvolutionDescriptor_t);
  cudnnStatus_t (*forward_algorithms)(cudnnHandle_t, cudnnTensorDescriptor_t,
                                      cudnnFilterDescriptor_t, cudnnConvolutionDescriptor_t,
                                      cudnnTensorDescriptor_t, int, int*,
                                      cudnnConvolutionFwdAlgoPerf_t*);
  cudnnStatus_t (*forward)(cudnnHandle_t, const void*, cudnnTensorDescriptor_t, const void*,
                           cudnnFilterDescriptor_t, const void*, cudnnConvolutionDescriptor_t,
                           cudnnConvolutionFwdAlgo_t, void*, size_t, const void*,
                           cudnnTensorDescriptor_t, void*);
  cudnnStatus_t (*backward_data_algorithms)(cudnnHandle_t, cudnnFilterDescriptor_t,
                                            cudnnTensorDescriptor_t, cudnnConvolutionDescriptor_t,
                                            cudnnTensorDescriptor_t, int, int*,
                                            cudnnConvolutionBwdDataAlgoPerf_t*);
  cudnnStatus_t (*backward_data)(cudnnHandle_t, const void*, cudnnFilterDescriptor_t, const void*,
                                 cudnnTensorDescriptor_t, const void*, cudnnConvolutionDescriptor_t,
                                 cudnnConvolutionBwdDataAlgo_t, void*, size_t, const void*,
                                 cudnnTensorDescriptor_t, void*);
  cudnnStatus_t (*backward_filter_algorithms)(cudnnHandle_t, cudnnTensorDescriptor_t,
                                              cudnnTensorDescriptor_t, cudnnConvolutionDescriptor_t,
                                              cudnnFilterDescriptor_t, int, int*,
                                              cudnnConvolutionBwdFilterAlgoPerf_t*);
  cudnnStatus_t (*backward_filter)(cudnnHandle_t, const void*, cudnnTensorDescriptor_t, const void*,
                                   cudnnTensorDescriptor_t, const void*,
                                   cudnnConvolutionDescriptor_t, cudnnConvolutionBwdFilterAlgo_t,
                                   void*, size_t, const void*, cudnnFilterDescriptor_t, void*);
  cudnnStatus_t (*add_tensor)(cudnnHandle_t, const void*, cudnnTensorDescriptor_t, const void*,
                              const void*, cudnnTensorDescriptor_t, void*);
};

// The loaded library, or null where it cannot be opened or lacks a function (never throws).
const Cudnn* cudnn();
// Why cudnn() is null ("" when it is not): the files tried and the loader's words.
std::string cudnn_unavailable_reason();
// The handle for device `index` (created on first use, in the device's current context).
cudnnHandle_t cudnn_handle(int index);

// Whether convolutions go through cuDNN: where it loads, unless HAP_CUDNN=0 in the environment or
// set_cudnn_enabled(false) (tests run both paths).
bool cudnn_enabled();
void set_cudnn_enabled(bool on);

// cuDNN convolution calls (forward, backward data, backward filter) made by this process.
int64_t cudnn_convolutions();
void count_cudnn_convolution();

}  // namespace hap::cuda

// A cuDNN call that fails becomes a hap::Error naming the call and cuDNN's error string.
#define HAP_CUDNN_CHECK(call)                                                                   \
  do {                                                                                          \
    const cudnnStatus_t hap_cudnn_st_ = (call);                                                 \
    if (hap_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                  \
      throw ::hap::Error(                                                                       \
          ::hap::detail::concat("cuDNN: ", #call, " failed at ", __FILE__, ":", __LINE__, ": ", \
                                ::hap::cuda::cudnn()->error_string(hap_cudnn_st_)));            \
  } while (0)
