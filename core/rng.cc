#include "core/rng.h"

#include <cmath>

#include "core/philox.h"
#include "core/strided_copy.h"

namespace hap {

double philox_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  auto w = philox_words(seed, stream, index);
  // u1 in (0, 1] so that log(u1) is finite.
  double u1 = (static_cast<double>(w[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = static_cast<double>(w[1]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

namespace {

// Calls f(local_flat, logical_index) for every element of `out` (contiguous) under `slice`.
template <typename F>
void for_each_logical(const Tensor& out, const LogicalSlice& slice, F&& f) {
  const Shape& shape = out.shape();
  int64_t n = out.numel();
  if (slice.logical_shape.empty() && slice.offset.empty()) {
#pragma omp parallel for if (n > (1 << 14))
    for (int64_t i = 0; i < n; ++i) f(i, static_cast<uint64_t>(i));
    return;
  }
  HAP_CHECK(slice.logical_shape.size() == shape.size() && slice.offset.size() == shape.size(),
            "random fill: slice of rank ", slice.logical_shape.size(), " for a tensor of rank ",
            shape.size());
  for (size_t d = 0; d < shape.size(); ++d)
    HAP_CHECK(slice.offset[d] >= 0 && slice.offset[d] + shape[d] <= slice.logical_shape[d],
              "random fill: local shape ", shape_str(shape), " at offset ", slice.offset[d],
              " in dim ", d, " does not fit the logical shape ", shape_str(slice.logical_shape));
  Strides lst = contiguous_strides(slice.logical_shape);
  int64_t nd = static_cast<int64_t>(shape.size());
#pragma omp parallel for if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, logical = 0;
    for (int64_t d = nd - 1; d >= 0; --d) {
      int64_t c = rem % shape[d];
      rem /= shape[d];
      logical += (c + slice.offset[d]) * lst[d];
    }
    f(i, static_cast<uint64_t>(logical));
  }
}

}  // namespace

void for_each_logical_index(const Shape& shape, const LogicalSlice& slice,
                            const std::function<void(int64_t, uint64_t)>& f) {
  Tensor probe = Tensor::meta(shape, DType::U8);
  for_each_logical(probe, slice, f);
}

namespace {

template <typename G>
void fill_with(const Tensor& out, const LogicalSlice& slice, const char* what, G&& gen) {
  if (!out.has_storage()) return;  // shape-only (MetaGuard)
  HAP_CHECK(out.is_contiguous(), what, ": output must be contiguous, got ", out.str());
  dispatch_all_types(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();
    for_each_logical(out, slice,
                     [&](int64_t i, uint64_t logical) { p[i] = convert<T>(gen(logical)); });
  });
}

}  // namespace

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t stream, double lo, double hi,
                  const LogicalSlice& slice) {
  fill_with(out, slice, "fill_uniform", [&](uint64_t i) {
    return lo + (hi - lo) * static_cast<double>(philox_uniform(seed, stream, i));
  });
}

void fill_normal(const Tensor& out, uint64_t seed, uint64_t stream, double mean, double std,
                 const LogicalSlice& slice) {
  fill_with(out, slice, "fill_normal",
            [&](uint64_t i) { return mean + std * philox_normal(seed, stream, i); });
}

void fill_bernoulli(const Tensor& out, uint64_t seed, uint64_t stream, double keep_prob,
                    const LogicalSlice& slice) {
  fill_with(out, slice, "fill_bernoulli", [&](uint64_t i) {
    return static_cast<double>(philox_uniform(seed, stream, i)) < keep_prob ? 1.0 : 0.0;
  });
}

Tensor randn(const Shape& shape, uint64_t seed, uint64_t stream, TensorOptions opt) {
  bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = Tensor::empty(shape, opt);
  fill_normal(t, seed, stream, 0.0, 1.0);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor rand(const Shape& shape, uint64_t seed, uint64_t stream, TensorOptions opt) {
  bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = Tensor::empty(shape, opt);
  fill_uniform(t, seed, stream, 0.0, 1.0);
  if (rg) t.set_requires_grad(true);
  return t;
}

}  // namespace hap
