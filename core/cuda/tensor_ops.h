// The CUDA backend's elementwise tensor operations (core/tensor.h, DeviceTensorOps): fill of any
// view and elementwise copy between views of one device, converting dtypes as the host does.
// Registered with the allocator when the library loads (core/cuda/backend.cc).
#pragma once
#include "core/tensor.h"

namespace hap::cuda {

void fill_elements(const Tensor& t, double value);
void copy_elements(const Tensor& dst, const Tensor& src);

}  // namespace hap::cuda
