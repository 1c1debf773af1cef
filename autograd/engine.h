// Reverse-mode differentiation over the recorded graph.
#pragma once
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"

namespace hap::autograd {

// Accumulates d(roots . grad_outputs)/d(leaf) into every leaf that requires grad. An undefined
// grad_output means ones (the root must then be a scalar).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs);

// Gradients of `output` with respect to `inputs`, returned instead of accumulated.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = Tensor());

// Records a differentiable function computed outside the op registry (a collective, say):
// when grad mode is on and an input requires grad, `outputs` get a node whose backward is
// `backward`. Returns the outputs (with history attached).
std::vector<Tensor> record_custom(const char* name, const std::vector<Tensor>& inputs,
                                  std::vector<Tensor> outputs, CustomBackward backward);

}  // namespace hap::autograd
