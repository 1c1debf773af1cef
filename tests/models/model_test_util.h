// Helpers shared by the models/ tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "tests/test_util.h"

namespace hap::testing {

using ::hap::test_util::error_of;  // and EXPECT_HAS, from tests/test_util.h

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
