// The cases both flash attention tests run (tests/ops/test_flash_attention_emulated.cc on the CPU
// through the emulation, tests/gpu/test_cuda_flash_attention.cc on a GPU): a case's sizes and
// options, and its operands on the CPU (bf16 q, k, v, dO; f32 dlse; the key mask; attributes).
#pragma once
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
