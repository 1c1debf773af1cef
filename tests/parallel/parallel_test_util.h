// Helpers shared by the MPI tests: the world communicator, ratio cases for any number of ranks,
// logical tensors every rank can rebuild, and a single-process rank-order sum as the reference.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/strided_copy.h"
#include "core/tensor.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "parallel/shard.h"
#include "parallel/staging.h"
#include "tests/test_util.h"

namespace hap::parallel::testing {

inline const Communicator& world() {
  static const Communicator w = Communicator::world();
  return w;
}

// Where the exactness tests run the distributed program: HAP_TEST_DEVICE (cpu, cuda, cuda:N; the
// CPU when unset). On a GPU, ranks sharing it communicate through the host (parallel/staging.h).
inline Device test_device() {
  static const Device d = [] {
    const char* env = std::getenv("HAP_TEST_DEVICE");
    if (env == nullptr || *env == '\0') return Device::cpu();
    const std::optional<Device> parsed = parse_device(env);
    HAP_CHECK(parsed.has_value(), "HAP_TEST_DEVICE: expected cpu, cuda or cuda:N, got '", env, "'");
    return *parsed;
  }();
  return d;
}

// The world over which the exactness tests' programs run: world() for CPU tensors, staged
// through the host for a device's.
inline const Communicator& device_world() {
  static const Communicator w =
      test_device().is_cpu()
          ? world()
          : Communicator(std::make_shared<StagingBackend>(world().backend_ptr()));
  return w;
}

// Ways of splitting a dim over n ranks; every case is meaningful for any n >= 1.
enum class Split { Uneven, ZeroShard, AllOnLast };

inline const char* split_name(Split s) {
  switch (s) {
    case Split::Uneven:
      return "uneven";
    case Split::ZeroShard:
      return "zero-shard";
    case Split::AllOnLast:
      return "all-on-last";
  }
  return "?";
}

inline std::vector<Split> all_splits() {
  return {Split::Uneven, Split::ZeroShard, Split::AllOnLast};
}

inline std::vector<double> ratios_for(int n, Split s) {
  if (n == 1) return {1.0};
  switch (s) {
    case Split::Uneven:
      if (n == 2) return {0.7, 0.3};
      if (n == 3) return {0.5, 0.3, 0.2};
      if (n == 4) return {0.4, 0.3, 0.2, 0.1};
      break;
    case Split::ZeroShard: {  // rank 1 holds nothing
      std::vector<double> r(static_cast<size_t>(n), 1.0 / (n - 1));
      r[1] = 0.0;
      return r;
    }
    case Split::AllOnLast: {
      std::vector<double> r(static_cast<size_t>(n), 0.0);
      r.back() = 1.0;
      return r;
    }
  }
  return even_ratios(n);
}

inline std::vector<CollectiveMethod> both_methods() {
  return {CollectiveMethod::Padded, CollectiveMethod::Grouped};
}

inline std::string lengths_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// {3, 4, 5} with `dim` set to `size`: a small 3-D logical shape.
inline Shape shape_with(int64_t dim, int64_t size) {
  Shape s = {3, 4, 5};
  s[static_cast<size_t>(dim)] = size;
  return s;
}

// The same normal numbers on every rank for the same (shape, seed, stream), in any dtype.
inline Tensor logical_tensor(const Shape& shape, DType dtype, uint64_t seed, uint64_t stream = 0) {
  Tensor t = randn(shape, seed, stream, TensorOptions{}.with_dtype(DType::F64));
  return dtype == DType::F64 ? t : t.to(dtype);
}

// A contiguous copy of rank's slice of `logical` under `lengths` along `dim`.
inline Tensor shard_of(const Tensor& logical, int64_t dim, const std::vector<int64_t>& lengths,
                       int rank) {
  return ShardSpec(dim, lengths).slice_of(logical, rank).clone();
}

// ((a_0 + a_1) + a_2) + ... elementwise, accumulating bf16 in f32: what the collectives promise.
inline Tensor rank_order_sum(const std::vector<Tensor>& addends) {
  Tensor out = Tensor::empty(addends[0].shape(), TensorOptions{}.with_dtype(addends[0].dtype()));
  const int64_t n = out.numel();
  std::vector<Tensor> cs;
  for (const Tensor& a : addends) cs.push_back(a.contiguous());
  dispatch_all_types(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
    for (int64_t i = 0; i < n; ++i) {
      Acc acc = convert<Acc>(cs[0].data<T>()[i]);
      for (size_t r = 1; r < cs.size(); ++r) acc = acc + convert<Acc>(cs[r].data<T>()[i]);
      out.data<T>()[i] = convert<T>(acc);
    }
  });
  return out;
}

// Bitwise equality of values (through double, exact for every dtype used here).
inline ::testing::AssertionResult same_values(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape() || actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "got " << actual.str() << ", expected " << expected.str();
  std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == e[i]) && !(a[i] != a[i] && e[i] != e[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << a[i] << ", expected " << e[i];
  return ::testing::AssertionSuccess();
}

// Max |a - e| / max(1, |e|) elementwise within tol.
inline ::testing::AssertionResult close_values(const Tensor& actual, const Tensor& expected,
                                               double tol) {
  if (!actual.defined()) return ::testing::AssertionFailure() << "gradient is undefined";
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure()
           << "got " << actual.str() << ", expected " << expected.str();
  std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == e[i]) continue;  // equal, infinities included
    double err = std::abs(a[i] - e[i]) / std::max(1.0, std::abs(e[i]));
    if (!(err <= tol))
      return ::testing::AssertionFailure() << "element " << i << ": got " << a[i] << ", expected "
                                           << e[i] << " (relative error " << err << ")";
  }
  return ::testing::AssertionSuccess();
}

using ::hap::test_util::error_of;  // and EXPECT_HAS, from tests/test_util.h

}  // namespace hap::parallel::testing
