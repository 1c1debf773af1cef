// A node of the backward graph: one recorded op call, or the accumulation into a leaf's grad.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/op.h"

namespace hap::autograd {

struct Node;

// Where the gradient of one op input goes: input `input_nr` of `node`'s op... seen from the
// producer: gradient for output `output_nr` of `node`.
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t output_nr = 0;
};

// Backward of a function recorded outside the op registry: grad_outputs -> one grad per input.
using CustomBackward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

struct Node {
  bool is_accumulate = false;  // a leaf's AccumulateGrad
  CustomBackward custom;       // set for custom functions (e.g. collectives)
  const char* custom_name = nullptr;
  std::weak_ptr<TensorImpl> leaf;  // for AccumulateGrad
  ops::OpKind kind{};
  ops::Attrs attrs;
  std::vector<Tensor> saved_inputs;   // detached; undefined where not saved
  std::vector<Tensor> saved_outputs;  // detached; undefined where not saved
  // Per input (empty: none): how to make a saved input again that was not kept (the input was
  // rematerializable): the backward pass fills saved_inputs from it and drops it after.
  struct Remake {
    std::shared_ptr<const std::function<Tensor()>> make;
    Shape shape;  // what it must return
    DType dtype{};
  };
  std::vector<Remake> remake_inputs;
  // Sufficient factor broadcasting (autograd::gather_factors): the gradients of the inputs marked
  // in `whole` are computed from whole factors, the saved inputs not marked and the output
  // gradients made whole by `gather` (one call for all of them); the other inputs' gradients
  // come from the local ones, as without it.
  struct Factor {
    bool grad = false;  // output `index`'s gradient; false: saved input `index`
    size_t index = 0;
    Tensor local;
  };
  using GatherFn = std::function<std::vector<Tensor>(const std::vector<Factor>& factors)>;
  struct GatherFactors {
    std::vector<bool> whole;
    GatherFn gather;
  };
  std::shared_ptr<const GatherFactors> factors;
  // An op that computed in f32 between casts (ops::recording_routed_call): saved_inputs are its
  // bf16 inputs, saved_outputs its f32 outputs before rounding; the backward widens the saved
  // inputs and the gradients to f32, runs the op's backward in f32 and rounds each input's
  // gradient to the input's dtype (input_dtypes), as the casts' backward would.
  bool widen = false;
  std::vector<DType> input_dtypes;
  std::vector<Edge> next;  // one per op input; node null when no grad flows there
  std::vector<bool> needs_input_grad;
  std::vector<ops::TensorMeta> output_meta;
  uint64_t sequence = 0;  // creation order; later nodes run first in backward
};

}  // namespace hap::autograd
