// The caching host allocator: statistics follow allocations and frees, large freed blocks are
// reused for the same size, and releasing the cache returns them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/allocator.h"
#include "core/tensor.h"

namespace hap {
namespace {

constexpr size_t kLarge = size_t(1) << 20;  // well above the caching threshold

TEST(Allocator, AllocatedBytesGoUpAndDownWithTensors) {
  cpu_allocator_release_cache();
  AllocatorStats before = cpu_allocator_stats();
  {
    Tensor t = Tensor::empty({static_cast<int64_t>(kLarge / 4)});  // 1 MiB of f32
    AllocatorStats during = cpu_allocator_stats();
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + kLarge);
    Tensor small = Tensor::empty({3});  // 12 bytes, rounded to the 64-byte alignment
    EXPECT_EQ(cpu_allocator_stats().allocated_bytes, before.allocated_bytes + kLarge + 64);
    Tensor view = t.as_strided({10}, {1}, 5);  // a view allocates nothing
    EXPECT_EQ(cpu_allocator_stats().allocated_bytes, before.allocated_bytes + kLarge + 64);
  }
  AllocatorStats after = cpu_allocator_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes + kLarge);  // the large block is kept
}

TEST(Allocator, StorageLivesAsLongAsAnyViewOfIt) {
  cpu_allocator_release_cache();
  size_t base = cpu_allocator_stats().allocated_bytes;
  Tensor view;
  {
    Tensor t = Tensor::ones({static_cast<int64_t>(kLarge / 4)});
    view = t.as_strided({4}, {1}, 100);
  }
  EXPECT_EQ(cpu_allocator_stats().allocated_bytes, base + kLarge);
  EXPECT_EQ(view.to_vector(), (std::vector<double>{1, 1, 1, 1}));
  view = Tensor();
  EXPECT_EQ(cpu_allocator_stats().allocated_bytes, base);
}

TEST(Allocator, FreedLargeBlocksAreReusedForTheSameSize) {
  cpu_allocator_release_cache();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({static_cast<int64_t>(kLarge / 4)});
    first = t.raw_data();
  }
  AllocatorStats cached = cpu_allocator_stats();
  EXPECT_GE(cached.cached_bytes, kLarge);
  Tensor again =
      Tensor::empty({static_cast<int64_t>(kLarge / 8)}, TensorOptions{}.with_dtype(DType::F64));
  EXPECT_EQ(again.raw_data(), first);
  AllocatorStats reused = cpu_allocator_stats();
  EXPECT_EQ(reused.cached_bytes, cached.cached_bytes - kLarge);
  EXPECT_EQ(reused.allocated_bytes, cached.allocated_bytes + kLarge);
}

TEST(Allocator, NearbySizesShareARoundedBlock) {
  cpu_allocator_release_cache();
  void* first = nullptr;
  size_t allocated_with = 0;
  {
    // 1 MiB + 1000 bytes rounds up to 1.25 MiB (steps of 1/8 of the next power of two, 2 MiB).
    Tensor t =
        Tensor::empty({static_cast<int64_t>(kLarge + 1000)}, TensorOptions{}.with_dtype(DType::U8));
    first = t.raw_data();
    allocated_with = cpu_allocator_stats().allocated_bytes;
  }
  Tensor u =
      Tensor::empty({static_cast<int64_t>(kLarge + 5000)}, TensorOptions{}.with_dtype(DType::U8));
  EXPECT_EQ(u.raw_data(), first);
  EXPECT_EQ(cpu_allocator_stats().allocated_bytes, allocated_with);
}

TEST(Allocator, ReleaseCacheEmptiesIt) {
  { Tensor t = Tensor::empty({static_cast<int64_t>(kLarge)}); }
  EXPECT_GT(cpu_allocator_stats().cached_bytes, 0u);
  cpu_allocator_release_cache();
  EXPECT_EQ(cpu_allocator_stats().cached_bytes, 0u);
}

TEST(Allocator, PeakTracksTheHighWaterMarkAndResets) {
  cpu_allocator_release_cache();
  cpu_allocator_reset_peak();
  size_t base = cpu_allocator_stats().allocated_bytes;
  EXPECT_EQ(cpu_allocator_stats().peak_allocated_bytes, base);
  {
    Tensor a = Tensor::empty({static_cast<int64_t>(kLarge / 4)});
    Tensor b = Tensor::empty({static_cast<int64_t>(kLarge / 4)});
  }
  AllocatorStats s = cpu_allocator_stats();
  EXPECT_EQ(s.allocated_bytes, base);
  EXPECT_EQ(s.peak_allocated_bytes, base + 2 * kLarge);
  cpu_allocator_reset_peak();
  EXPECT_EQ(cpu_allocator_stats().peak_allocated_bytes, base);
}

TEST(Allocator, BlocksAre64ByteAligned) {
  for (int64_t n : {1, 3, 17, 1000, 100000}) {
    Tensor t = Tensor::empty({n}, TensorOptions{}.with_dtype(DType::U8));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u) << n;
  }
  Tensor z = Tensor::empty({0});
  EXPECT_NE(z.raw_data(), nullptr);
}

// Under HAP_POISON_ALLOC=1 (the poisoned_* tests run whole suites so) every block, fresh or taken
// from the cache, starts as 0xFF bytes: NaN as a float, so unwritten outputs cannot pass.
TEST(Allocator, PoisonedBlocksStartAsNaN) {
  const char* v = std::getenv("HAP_POISON_ALLOC");
  if (v == nullptr || std::string(v) == "0" || *v == '\0')
    GTEST_SKIP() << "runs under HAP_POISON_ALLOC=1 (ctest poisoned_core)";
  for (int round = 0; round < 2; ++round) {  // the second round reuses the cached block
    Tensor t = Tensor::empty({1 << 16});
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); i += 997) EXPECT_TRUE(std::isnan(p[i])) << i;
    t.fill_(1.0f);
  }
}

}  // namespace
}  // namespace hap
