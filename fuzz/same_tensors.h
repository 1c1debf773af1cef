// Exact equality of named tensors read from files, for the round-trip checks of the checkpoint
// targets: the same names in the same order, dtypes, shapes and bytes (NaN payloads included,
// which a value comparison would call different).
#pragma once
#include <cstring>

#include "models/safetensors.h"

namespace hap::fuzz {

inline bool same_tensors(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const Tensor& x = a[i].second;
    const Tensor& y = b[i].second;
    if (a[i].first != b[i].first || x.dtype() != y.dtype() || x.shape() != y.shape()) return false;
    const Tensor cx = x.contiguous(), cy = y.contiguous();
    if (cx.nbytes() > 0 && std::memcmp(cx.raw_data(), cy.raw_data(), cx.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace hap::fuzz
