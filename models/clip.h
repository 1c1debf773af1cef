// Gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_.
#pragma once
#include <vector>

#include "core/tensor.h"

namespace hap::nn {

// The L2 norm of all gradients of `params` taken together (computed in double; parameters
// without a gradient contribute nothing; a tensor listed twice counts once). If
// max_norm / (norm + 1e-6) < 1, every gradient is multiplied by that factor. Returns the norm
// before clipping. Gradients are replaced by scaled copies, so gradients that share storage are
// each scaled exactly once.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// The same global norm without clipping.
double grad_norm(const std::vector<Tensor>& params);

}  // namespace hap::nn
