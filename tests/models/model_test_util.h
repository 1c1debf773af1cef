// Helpers shared by the models/ tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace hap::testing {

// The message of the hap::Error that f() throws (a test failure if it throws nothing or another
// exception type).
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

#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)

struct Stats {
  double mean = 0, std = 0, min = 0, max = 0;
};

inline Stats stats_of(const Tensor& t) {
  std::vector<double> v = t.to_vector();
  Stats s;
  s.min = s.max = v.empty() ? 0 : v[0];
  for (double x : v) {
    s.mean += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

inline bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

}  // namespace hap::testing
