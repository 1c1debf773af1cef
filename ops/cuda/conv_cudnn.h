// conv2d and its backward through cuDNN (ops/cuda/conv_cudnn.cc), tried first by ops/cuda/conv.cu;
// each returns false, having written nothing, where cuDNN is off or unavailable
// (core/cuda/cudnn.h), or refuses the geometry, or offers no algorithm HAP accepts (below), and
// the caller then runs its own im2col kernels.
//
// Accepted algorithms: deterministic (the same bits every run, as HAP's own kernels), without TF32
// in f32 (CUDNN_FMA_MATH; with it inside an op given bf16 inputs, ops::in_bf16_route), and summing
// in the convolution's own order (implicit GEMM, precomputed implicit GEMM, GEMM, direct; the FFT
// and Winograd algorithms transform the sum and round differently from the CPU by more than a
// product's order of additions), whose workspace is at most 256 MiB. f32 and f64, all tensors
// dense.
#pragma once
#include "core/tensor.h"
#include "ops/attrs.h"

namespace hap::ops::cuda {

// y = conv2d(x, w) (+ b per output channel where b is defined).
bool cudnn_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                  const Conv2dAttrs& a);
// dx and dw of y = conv2d(x, w) from gy (the bias gradient is the caller's).
bool cudnn_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& dx,
                           const Tensor& dw, const Conv2dAttrs& a);

}  // namespace hap::ops::cuda
