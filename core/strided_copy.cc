#include "core/strided_copy.h"

#include <cstring>

namespace hap {

namespace {
// Offsets of the first element of each row (all dims but the last) of a strided view.
void row_offsets(const Shape& shape, const Strides& strides, std::vector<int64_t>& out) {
  int64_t nd = static_cast<int64_t>(shape.size());
  Shape outer(shape.begin(), shape.end() - 1);
  Strides outer_st(strides.begin(), strides.end() - 1);
  out.clear();
  out.reserve(shape_numel(outer));
  if (nd == 1) {
    out.push_back(0);
    return;
  }
  for_each_offset(outer, outer_st, [&](int64_t off) { out.push_back(off); });
}
}  // namespace

void strided_copy(const Tensor& dst, const Tensor& src) {
  HAP_ASSERT(dst.shape() == src.shape());
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  dispatch_all_types(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all_types(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(dst.raw_data());
      const S* s = static_cast<const S*>(src.raw_data());
      if (dst.dim() == 0) {
        d[0] = convert<D>(s[0]);
        return;
      }
      if (dst.is_contiguous() && src.is_contiguous()) {
        int64_t n = dst.numel();
#pragma omp parallel for if (n > (1 << 16))
        for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i]);
        return;
      }
      std::vector<int64_t> drow, srow;
      row_offsets(dst.shape(), dst.strides(), drow);
      row_offsets(src.shape(), src.strides(), srow);
      int64_t inner = dst.shape().back();
      int64_t ds = dst.strides().back(), ss = src.strides().back();
      int64_t rows = static_cast<int64_t>(drow.size());
#pragma omp parallel for if (rows * inner > (1 << 15))
      for (int64_t r = 0; r < rows; ++r) {
        D* dp = d + drow[r];
        const S* sp = s + srow[r];
        for (int64_t j = 0; j < inner; ++j) dp[j * ds] = convert<D>(sp[j * ss]);
      }
    });
  });
}

}  // namespace hap
