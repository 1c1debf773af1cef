// Activation recomputation (checkpointing): a function run without keeping what its backward
// needs, and run again when the backward pass reaches it.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace hap::autograd {

using Function = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn(inputs) without recording history, so that nothing fn computes stays alive but its
// outputs. When the backward pass reaches the outputs, fn runs again on the same inputs, with
// history and under the autocast (mixed precision) the first run had, and the gradients of that
// run flow to the inputs. Memory: what fn's backward would have kept is held only while its
// backward runs; time: one more forward of fn.
//
// fn must compute the same values again: a pure function of its inputs, random ops included
// (the counter-based streams draw the same numbers for the same stream). Every tensor fn reads
// that needs a gradient, a parameter included, must be among `inputs`: the recomputation
// throws hap::Error naming one it reached that is not. Without grad mode, or when no input
// requires grad, this is fn(inputs).
std::vector<Tensor> checkpoint(const Function& fn, const std::vector<Tensor>& inputs);

}  // namespace hap::autograd
