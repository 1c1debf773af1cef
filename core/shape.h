// Shapes and strides: small vectors of int64 with the helpers every layer uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hap {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string shape_str(const Shape& s);
// Wraps a possibly negative dim into [0, ndim); the error names `what` and the valid range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what = "dim");
// NumPy broadcasting of two shapes; throws naming `op` and both shapes when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace hap
