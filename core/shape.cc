#include "core/shape.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace hap {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  HAP_CHECK(dim >= lo && dim <= hi, what, " ", dim, " is out of range for a tensor with ", ndim,
            " dims (expected a value in [", lo, ", ", hi, "])");
  return dim < 0 ? dim + ndim : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    HAP_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
              " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace hap
