// The CUDA backend's op kernels: each family fills the `cuda` slot of its ops' registry entries
// (ops/op.h). The registry calls register_all() once when the CUDA backend is built; an op whose
// slot stays empty is an error on a CUDA tensor that names the op and the device.
#pragma once
#include <cstdint>

#include "ops/op.h"

namespace hap::ops::cuda {

// How many attention calls (forward or backward) the flash kernels have run in this process
// (ops/cuda/attention.cu): tests check that bf16 attention took them.
int64_t flash_attention_calls();

void register_elementwise(OpTable& t);  // ops/cuda/elementwise.cu
void register_reduce(OpTable& t);       // ops/cuda/reduce.cu: sum, mean
void register_matmul(OpTable& t);       // ops/cuda/matmul.cu: matmul, linear (cuBLAS)
void register_softmax(OpTable& t);      // ops/cuda/softmax.cu: (log-)softmax and backward
void register_random(OpTable& t);       // ops/cuda/random.cu: dropout, mask_tokens
void register_embedding(OpTable& t);    // ops/cuda/embedding.cu: embedding and backward
void register_optim(OpTable& t);        // ops/cuda/optim.cu: sgd, adamw, sum_of_squares
void register_attention(OpTable& t);    // ops/cuda/attention.cu: attention and backward
void register_loss(OpTable& t);  // ops/cuda/loss.cu: cross-entropy, target logits, logsumexp,
                                 // max, argmax, topk, index_backward
void register_conv(OpTable& t);  // ops/cuda/conv.cu: conv2d, max/avg pool2d, their backward
void register_moe(OpTable& t);   // ops/cuda/moe.cu: moe_dispatch, moe_combine, moe_gate_grad
void register_norm(OpTable& t);  // ops/cuda/norm.cu: layer/RMS norm, gelu, and their backward

inline void register_all(OpTable& t) {
  register_elementwise(t);
  register_reduce(t);
  register_matmul(t);
  register_softmax(t);
  register_random(t);
  register_embedding(t);
  register_optim(t);
  register_attention(t);
  register_norm(t);
  register_loss(t);
  register_conv(t);
  register_moe(t);
}

}  // namespace hap::ops::cuda
