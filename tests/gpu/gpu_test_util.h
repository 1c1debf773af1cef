// What the gpu tests share: skipping without a GPU, device copies of CPU views, and comparisons
// of a GPU result with the CPU's.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/cuda/backend.h"
#include "core/tensor.h"

namespace hap::gpu_test {

#define HAP_REQUIRE_GPU()                                              \
  do {                                                                 \
    if (::hap::cuda::device_count() == 0)                              \
      GTEST_SKIP() << "no GPU: " << ::hap::cuda::unavailable_reason(); \
  } while (0)

inline const Device kGpu = Device::cuda(0);

// The source tree (configs/): HAP_SOURCE_DIR from the environment where set (scripts/gpu-check
// runs the binaries on another machine than the one that built them), else the build's.
inline std::string source_dir() {
  const char* env = std::getenv("HAP_SOURCE_DIR");
  return env && *env ? env : HAP_SOURCE_DIR;
}

inline TensorOptions f64() { return TensorOptions{}.with_dtype(DType::F64); }

// max |a - b| / (atol + rtol |b|) <= 1, element by element, both brought to the host; equal
// infinities and NaN against NaN agree.
inline void expect_close(const Tensor& gpu, const Tensor& cpu, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> a = gpu.to(Device::cpu()).to_vector(), b = cpu.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) continue;  // infinities, NaNs
    ASSERT_LE(std::abs(a[i] - b[i]), atol + rtol * std::abs(b[i]))
        << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

// A device copy of `x` with the same view: the storage block under it copied, the same sizes,
// strides and offset over the copy (strides >= 0, broadcast dims included).
inline Tensor same_view_on_gpu(const Tensor& x) {
  if (x.is_contiguous() && x.offset() == 0) return x.to(kGpu);
  int64_t extent = x.offset() + 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    EXPECT_GE(x.strides()[static_cast<size_t>(d)], 0);
    if (x.size(d) == 0)
      return Tensor::empty(x.shape(), TensorOptions{}.with_dtype(x.dtype()).with_device(kGpu));
    extent += (x.size(d) - 1) * x.strides()[static_cast<size_t>(d)];
  }
  const Tensor block = x.as_strided({extent}, {1}, 0).contiguous().to(kGpu);
  return block.as_strided(x.shape(), x.strides(), x.offset());
}

// Exactly equal values, dtypes and shapes, on the GPU and the CPU.
inline void expect_equal(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  EXPECT_EQ(gpu.to(Device::cpu()).to_vector(), cpu.to_vector()) << what;
}

}  // namespace hap::gpu_test
