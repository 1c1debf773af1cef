// Helpers shared by the unit tests: the message of an expected hap::Error, random tensors.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/rng.h"
#include "core/tensor.h"

namespace hap::test_util {

// The message of the hap::Error that f throws; a test failure if it throws nothing or another type.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected hap::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected hap::Error, nothing was thrown";
  return "";
}

inline TensorOptions opts(DType dt, bool rg = false) {
  return TensorOptions{}.with_dtype(dt).with_requires_grad(rg);
}

// Uniform in [-1, 1) from the counter-based RNG.
inline Tensor uni(const Shape& s, uint64_t seed, DType dt = DType::F64, bool rg = false) {
  Tensor t = Tensor::empty(s, opts(dt));
  fill_uniform(t, seed, 0, -1.0, 1.0);
  if (rg) t.set_requires_grad(true);
  return t;
}

}  // namespace hap::test_util

// Expects `part` to occur in the message `msg`.
#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)
