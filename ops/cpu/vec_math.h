// Math functions written so that the compiler vectorises them inside `#pragma omp simd` loops
// (glibc's expf and tanhf are scalar calls). f64 keeps the exact library functions: it is the
// gradcheck type.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace hap::cpu {

// exp(x) in f32 to about 2 ulp (Cephes expf): x = n ln2 + r with |r| <= ln2/2, e^r by a
// degree-6 polynomial, 2^n assembled in the exponent bits. Results that would be f32 denormals
// (x < -87) are 0, x > 88 gives +inf, NaN stays NaN.
inline float exp_fast(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float xc = std::min(std::max(x, -87.0f), 88.0f);
  float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  float y = p * scale;
  y = x < -87.0f ? 0.0f : y;
  y = x > 88.0f ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}
inline double exp_fast(double x) { return std::exp(x); }

// tanh(x) in f32 (Cephes tanhf): an odd polynomial for |x| < 0.625, 1 - 2 / (e^{2|x|} + 1)
// beyond, both computed and selected so that the loop stays branch-free.
inline float tanh_fast(float x) {
  float ax = std::abs(x);
  float s = x * x;
  float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                  1.33314422036e-1f) *
                     s -
                 3.33332819422e-1f) *
                    s * x +
                x;
  float big = 1.0f - 2.0f / (exp_fast(2.0f * ax) + 1.0f);
  big = x < 0 ? -big : big;
  return ax < 0.625f ? small : big;
}
inline double tanh_fast(double x) { return std::tanh(x); }

// The largest of x[0 .. n), NaN skipped, -inf for none (a running std::max(m, x[j]) from -inf):
// 16 running maxima, which the compiler keeps in vector registers, then combined. One running
// maximum is a chain of dependent comparisons, about 4 cycles an element, which GCC does not
// vectorise even under `omp simd reduction(max)`. Which of +0 and -0 is returned where both
// occur and are the largest may differ from the running maximum's; as a softmax's shift either
// gives the same values.
template <typename T>
[[gnu::always_inline]] inline T max_skipping_nan(const T* x, int64_t n) {
  constexpr int kLanes = 16;
  T m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) m[l] = m[l] < x[j + l] ? x[j + l] : m[l];
  T mx = -std::numeric_limits<T>::infinity();
  for (int l = 0; l < kLanes; ++l) mx = mx < m[l] ? m[l] : mx;
  for (; j < n; ++j) mx = mx < x[j] ? x[j] : mx;
  return mx;
}

}  // namespace hap::cpu
