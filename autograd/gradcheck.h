// Finite-difference check of an op's backward rule, in f64.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hap::autograd {

struct GradcheckOptions {
  double eps = 1e-6;  // central-difference step
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 7;  // for the random output cotangent
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_error = 0;
  std::string message;  // first mismatch: input, element, analytic vs numeric
};

// Compares the analytic gradient of L = sum(f(inputs) * r) (r a fixed random cotangent) with
// central differences, for every element of every input that requires grad. Inputs must be f64.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, GradcheckOptions opt = {});

}  // namespace hap::autograd
