// The CUDA backend's op kernels: each family fills the `cuda` slot of its ops' registry entries
// (ops/op.h). The registry calls register_all() once when the CUDA backend is built; an op whose
// slot stays empty is an error on a CUDA tensor that names the op and the device.
#pragma once
#include "ops/op.h"

namespace hap::ops::cuda {

void register_elementwise(OpTable& t);  // ops/cuda/elementwise.cu
void register_reduce(OpTable& t);       // ops/cuda/reduce.cu: sum, mean
void register_matmul(OpTable& t);       // ops/cuda/matmul.cu: matmul, linear (cuBLAS)
void register_softmax(OpTable& t);      // ops/cuda/softmax.cu: (log-)softmax and backward

inline void register_all(OpTable& t) {
  register_elementwise(t);
  register_reduce(t);
  register_matmul(t);
  register_softmax(t);
}

}  // namespace hap::ops::cuda
