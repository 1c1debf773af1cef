// Reverse-mode differentiation over the recorded graph.
#pragma once
#include <vector>

#include "autograd/node.h"
#include "core/tensor.h"

namespace hap::autograd {

// Accumulates d(roots . grad_outputs)/d(leaf) into every leaf that requires grad. An undefined
// grad_output means ones (the root must then be a scalar).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_outputs);

// Watches the backward() calls of one thread (ObserveBackward): told when a leaf's gradient is
// complete, that is when every accumulation into it of this backward has run (a leaf used by
// several ops gets one accumulation per use; leaf_done comes after the last, and also when none
// carried a gradient), and after every node. The SPMD executor starts a bucket's gradient
// all-reduce as soon as its gradients are complete and advances the ones in flight from here, so
// communication overlaps the rest of the backward pass. autograd::grad() is not observed.
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void leaf_done(const Tensor& leaf) = 0;
  virtual void node_done() {}
};

// Observes the backward() calls made on this thread during its scope (nested scopes: the
// innermost observer).
class ObserveBackward {
 public:
  explicit ObserveBackward(BackwardObserver* observer);
  ~ObserveBackward();
  ObserveBackward(const ObserveBackward&) = delete;
  ObserveBackward& operator=(const ObserveBackward&) = delete;

 private:
  BackwardObserver* prev_;
};

// Gradients of `output` with respect to `inputs`, returned instead of accumulated.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& inputs,
                         const Tensor& grad_output = Tensor());

// Gradients of several outputs (each with its grad_output; undefined means ones for a scalar)
// with respect to `inputs`, returned instead of accumulated. strict: a gradient reaching a leaf
// that requires grad but is not among `inputs` is an error (naming the leaf's shape), instead
// of being dropped.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool strict);

// Records a differentiable function computed outside the op registry (a collective, say):
// when grad mode is on and an input requires grad, `outputs` get a node whose backward is
// `backward`. Returns the outputs (with history attached).
std::vector<Tensor> record_custom(const char* name, const std::vector<Tensor>& inputs,
                                  std::vector<Tensor> outputs, CustomBackward backward);

// Marks `t` (an op output or a leaf that requires grad) so that the ops recording it as a saved
// input do not keep it: each keeps `remake` instead and calls it right before its backward
// runs, dropping the result after. `t`'s memory is then free once the forward pass stops
// reading it (ZeRO-3: a parameter all-gathered from its shards is gathered again in backward).
// remake must return the same values, shape and dtype; it is called once per saving node whose
// backward runs, on the backward pass's thread, in the deterministic order of that pass (every
// SPMD rank calls it at the same point, so it may run a collective). Views of `t`, and copies
// made by detach(), are not marked. Returns `t`.
Tensor rematerializable(const Tensor& t, std::function<Tensor()> remake);

// Sufficient factor broadcasting: `output` (an output of a registry op that saves only its
// inputs, a product say, recorded with history) gets the gradients of the inputs marked in
// `whole` (one flag per op input; each such input must need a gradient) from whole factors.
// When its node's backward runs, the local backward computes the gradients of the other inputs
// only; then `gather` is called once with the factors, every defined saved input not marked
// ({false, i, x}) and every defined output gradient ({true, o, g}), and returns each whole (x
// itself where it already is), in that order; the op's backward on those gives the marked
// inputs' gradients, whole on every rank (no all-reduce of them is needed: an SPMD
// data-parallel weight gradient computed from the all-gathered input and output gradient). The
// call comes in the backward pass's deterministic order (it may run collectives), only where a
// gradient reached the node. Returns `output`.
Tensor gather_factors(const Tensor& output, std::vector<bool> whole, Node::GatherFn gather);

}  // namespace hap::autograd
