// The cases both flash attention tests run (tests/ops/test_flash_attention_emulated.cc on the CPU
// through the emulation, tests/gpu/test_cuda_flash_attention.cc on a GPU): a case's sizes and
// options, and its operands on the CPU (bf16 q, k, v, dO; f32 dlse; the key mask; attributes).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/attrs.h"

namespace hap::flash_test {

struct Case {
  std::string name;
  int64_t b, h, t;
  int d, dv;
  bool causal = true;
  bool key_mask = false;
  double dropout = 0;
  bool misaligned = false;  // q read from a copy one element into a larger buffer (emulated)
  bool nans = false;        // NaN in a query row and in a key row; the forward only
};

struct Operands {
  Tensor q, k, v, go, glse, keys;
  ops::AttentionAttrs attrs;
};

// The largest |x| of a tensor (as f64).
inline double largest(const Tensor& x) {
  double m = 0;
  for (double v : x.to(Device::cpu()).to(DType::F64).to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// |got - want| <= rel |want| + abs_frac max|want| elementwise; returns the largest error as a
// fraction of max|want|. Both tensors may be on any device.
inline double expect_close(const Tensor& got, const Tensor& want, double rel, double abs_frac,
                           const std::string& what) {
  const std::vector<double> g = got.to(Device::cpu()).to(DType::F64).to_vector(),
                            w = want.to(Device::cpu()).to(DType::F64).to_vector();
  EXPECT_EQ(g.size(), w.size()) << what;
  const double scale = std::max(largest(want), 1e-30);
  double worst = 0;
  int reported = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) {
    if (std::isinf(w[i]) || std::isnan(w[i])) {
      if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) && reported++ < 5)
        ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " against " << w[i];
      continue;
    }
    const double err = std::abs(g[i] - w[i]);
    worst = std::max(worst, err / scale);
    if (!(err <= rel * std::abs(w[i]) + abs_frac * scale) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << g[i] << " against " << w[i] << " (error " << err
                    << ", max |want| " << scale << ")";
  }
  return worst;
}

// Tolerances of the outputs and gradients. The kernels' products of bf16 operands are exact in f32
// and summed in f32 (in another order than the CPU's: f32 rounding, ~1e-6 relative); what differs
// from the CPU's f32 route is that P and dS are rounded to bf16 (2^-9 relative each) before their
// products, and the outputs are rounded to bf16 (2^-9 relative). An output o = sum_j p_j v_j thus
// moves by at most 2^-9 |o| + 2^-9 sum_j p_j |v_j| <= 2^-9 (|o| + max |v|); the gradients likewise
// by 2^-9 of their value plus 2^-9 of sums of magnitudes that cancel in the result, bounded here by
// a fraction of the tensor's largest element: 2^-7 (four bf16 roundings' worth).
constexpr double kRel = 1.0 / 256, kAbs = 1.0 / 128;

inline Operands operands(const Case& c) {
  Operands o;
  const Shape qs = {c.b, c.h, c.t, c.d}, vs = {c.b, c.h, c.t, c.dv};
  o.q = randn(qs, 1).to(DType::BF16);
  o.k = randn(qs, 2).to(DType::BF16);
  o.v = randn(vs, 3).to(DType::BF16);
  o.go = randn(vs, 4).to(DType::BF16);
  o.glse = randn({c.b, c.h, c.t}, 5);
  if (c.nans) {  // query row 3 of pair 0 (a row of NaN scores), key 5 of pair 1 (a NaN column)
    auto* qd = static_cast<uint16_t*>(o.q.raw_data());
    auto* kd = static_cast<uint16_t*>(o.k.raw_data());
    for (int64_t e = 0; e < c.d; ++e) {
      qd[3 * c.d + e] = 0x7fc0;
      kd[(c.t + 5) * c.d + e] = 0x7fc0;
    }
  }
  if (c.key_mask) {
    std::vector<int64_t> keep(static_cast<size_t>(c.b * c.t));
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t j = 0; j < c.t; ++j)  // batch 0: every third key padding; batch 1: the first 5
        keep[static_cast<size_t>(b * c.t + j)] = b % 2 == 0 ? (j % 3 != 1) : (j >= 5);
    o.keys = Tensor::from_vector(keep, {c.b, c.t}).to(DType::U8);
  }
  o.attrs.causal = c.causal;
  if (c.dropout > 0) {
    o.attrs.dropout.p = c.dropout;
    o.attrs.dropout.seed = 77;
    o.attrs.dropout.stream = 3;
    // This call's probabilities as a slice of a larger logical tensor (a shard's), so the
    // kernels' indices into the Philox stream are checked with offsets.
    o.attrs.dropout.slice.logical_shape = {c.b + 1, c.h + 2, c.t, c.t};
    o.attrs.dropout.slice.offset = {1, 2, 0, 0};
  }
  return o;
}

}  // namespace hap::flash_test
