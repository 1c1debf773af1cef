#include "core/split.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/shape.h"

namespace hap {

namespace {

constexpr double kRatioSumTolerance = 1e-6;
// Fractional parts closer than this are a tie (broken by rank): quotas such as 5 * 0.3 and
// 5 * 0.7 must tie even though their binary fractional parts differ in the last bits.
constexpr long double kFractionResolution = 1e-9L;

std::string list_str(const std::vector<double>& v) {
  std::ostringstream os;
  os.precision(10);
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace

void validate_ratios(const std::vector<double>& ratios) {
  HAP_CHECK(!ratios.empty(), "ratios: expected one ratio per device, got an empty list");
  double sum = 0.0;
  bool all_valid = true;
  for (double r : ratios) {
    all_valid = all_valid && std::isfinite(r) && r >= 0.0;
    sum += r;
  }
  if (all_valid && std::abs(sum - 1.0) <= kRatioSumTolerance)
    return;  // (called per shard: no strings)
  std::ostringstream bad;
  for (size_t i = 0; i < ratios.size(); ++i) {
    double r = ratios[i];
    if (!std::isfinite(r) || r < 0.0)
      bad << (bad.tellp() > 0 ? ", " : "") << "ratio " << i << " = " << r;
  }
  HAP_CHECK(bad.tellp() == 0, "ratios ", list_str(ratios), ": ", bad.str(),
            " (every ratio must be finite and >= 0)");
  std::ostringstream sum_str;
  sum_str.precision(12);
  sum_str << sum;
  HAP_CHECK(false, "ratios ", list_str(ratios), " sum to ", sum_str.str(), " (expected 1 within ",
            kRatioSumTolerance, ")");
}

std::vector<int64_t> shard_lengths(int64_t dim_size, const std::vector<double>& ratios) {
  HAP_CHECK(dim_size >= 0, "shard_lengths: dimension size ", dim_size, " is negative");
  validate_ratios(ratios);
  const size_t k = ratios.size();
  long double total = 0.0L;
  for (double r : ratios) total += r;

  std::vector<int64_t> lengths(k);
  std::vector<int64_t> frac_key(k);  // fractional part of the quota, quantised for tie detection
  int64_t assigned = 0;
  for (size_t i = 0; i < k; ++i) {
    long double quota = static_cast<long double>(dim_size) * ratios[i] / total;
    long double base = std::floor(quota);
    lengths[i] = std::clamp<int64_t>(static_cast<int64_t>(base), 0, dim_size);
    frac_key[i] = static_cast<int64_t>(std::llround((quota - base) / kFractionResolution));
    assigned += lengths[i];
  }

  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t{0});
  if (assigned < dim_size) {
    // Largest fractional part first; equal parts go to the lower rank.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return frac_key[a] > frac_key[b]; });
    for (size_t j = 0; assigned < dim_size; j = (j + 1) % k, ++assigned) ++lengths[order[j]];
  } else if (assigned > dim_size) {
    // Only float rounding of the quotas gets here: take back from the smallest fractional parts,
    // higher rank first, so the result stays the mirror image of the rule above.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return frac_key[a] != frac_key[b] ? frac_key[a] < frac_key[b] : a > b;
    });
    for (size_t j = 0; assigned > dim_size; j = (j + 1) % k) {
      if (lengths[order[j]] > 0) {
        --lengths[order[j]];
        --assigned;
      }
    }
  }
  HAP_ASSERT(std::accumulate(lengths.begin(), lengths.end(), int64_t{0}) == dim_size,
             "shard lengths ", shape_str(lengths), " do not sum to ", dim_size);
  return lengths;
}

std::vector<int64_t> shard_offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets(lengths.size());
  int64_t acc = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    offsets[i] = acc;
    acc += lengths[i];
  }
  return offsets;
}

std::vector<double> even_ratios(int n) {
  HAP_CHECK(n >= 1, "even_ratios: expected at least one device, got ", n);
  return std::vector<double>(static_cast<size_t>(n), 1.0 / n);
}

}  // namespace hap
