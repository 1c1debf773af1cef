// Reverse-mode differentiation over the recorded graph.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace hap::autograd {

// Accumulates d(roots . grad_outputs)/d(leaf) into every leaf that requires grad. An undefined
// grad_output means ones (the root must then be a scalar).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs);

// Gradients of `output` with respect to `inputs`, returned instead of accumulated.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = Tensor());

}  // namespace hap::autograd
