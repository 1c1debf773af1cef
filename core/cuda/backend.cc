#include "core/cuda/backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "core/allocator.h"
#include "core/byte_size.h"
#include "core/cuda/check.h"
#include "core/cuda/green_context.h"
#include "core/cuda/tensor_ops.h"
#include "core/sm_partition.h"

namespace hap::cuda {

namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      cudaGetLastError();  // not sticky: leave the runtime clean
    } else if (r.count == 0) {
      r.reason = "the CUDA runtime reports no device";
    }
    return r;
  }();
  return p;
}

// Sizes are rounded so that near sizes share cached blocks: to 512 bytes below 1 MiB, above it to
// 1/8 of the size's power of two.
size_t round_size(size_t n) {
  constexpr size_t kSmall = size_t{1} << 20;
  if (n < kSmall) return std::max<size_t>((n + 511) / 512 * 512, 512);
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t step = p / 8;
  return (n + step - 1) / step * step;
}

size_t cap_from_environment() {
  const char* v = std::getenv("HAP_CUDA_MEMORY_CAP");
  if (v == nullptr || *v == '\0') return 0;
  const std::optional<std::int64_t> bytes = parse_byte_size(v);
  HAP_CHECK(bytes.has_value(), "HAP_CUDA_MEMORY_CAP: expected ", kByteSizeExpectation, ", got '", v,
            "'");
  return static_cast<size_t>(*bytes);
}

class CudaAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes, int index) override {
    check_device(index);
    const size_t n = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = devices_[index];
    auto it = d.free.find(n);
    if (it != d.free.end()) {
      void* p = it->second;
      d.free.erase(it);
      d.stats.cached_bytes -= n;
      note_allocated(d, n);
      return p;
    }
    if (cap_ > 0 && d.stats.allocated_bytes + n > cap_)
      throw Error(detail::concat("cuda:", index, ": allocating ", nbytes,
                                 " bytes would exceed the ", "memory cap of ", cap_, " bytes (",
                                 d.stats.allocated_bytes,
                                 " in use; HAP_CUDA_MEMORY_CAP or cuda::set_memory_cap)"));
    if (cap_ > 0 && d.stats.allocated_bytes + d.stats.cached_bytes + n > cap_) release(index, d);
    set_device(index);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {  // return the cache to the driver and try once more
      cudaGetLastError();
      release(index, d);
      e = cudaMalloc(&p, n);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      throw Error(detail::concat("cuda:", index, ": cannot allocate ", nbytes, " bytes (",
                                 cudaGetErrorName(e), "): ", d.stats.allocated_bytes,
                                 " bytes in use by HAP, ", free_bytes, " of ", total,
                                 " bytes free on the device"));
    }
    note_allocated(d, n);
    return p;
  }

  void deallocate(void* ptr, size_t nbytes, int index) override {
    if (ptr == nullptr) return;
    const size_t n = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = devices_[index];
    d.stats.allocated_bytes -= n;
    d.free.emplace(n, ptr);
    d.stats.cached_bytes += n;
  }

  AllocatorStats stats(int index) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(index);
    return it == devices_.end() ? AllocatorStats{} : it->second.stats;
  }

  void reset_peak(int index) override {
    std::lock_guard<std::mutex> lock(mu_);
    PerDevice& d = devices_[index];
    d.stats.peak_allocated_bytes = d.stats.allocated_bytes;
  }

  void release_cache(int index) override {
    std::lock_guard<std::mutex> lock(mu_);
    release(index, devices_[index]);
  }

  void set_cap(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    cap_ = bytes;
  }
  size_t cap() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cap_;
  }

 private:
  struct PerDevice {
    std::multimap<size_t, void*> free;
    AllocatorStats stats;
  };

  static void note_allocated(PerDevice& d, size_t n) {
    d.stats.allocated_bytes += n;
    d.stats.peak_allocated_bytes = std::max(d.stats.peak_allocated_bytes, d.stats.allocated_bytes);
  }

  // With mu_ held.
  static void release(int index, PerDevice& d) {
    if (d.free.empty()) return;
    set_device(index);
    HAP_CUDA_CHECK(cudaDeviceSynchronize());  // no queued kernel may still use a block
    for (auto& [n, p] : d.free) HAP_CUDA_CHECK(cudaFree(p));
    d.free.clear();
    d.stats.cached_bytes = 0;
  }

  mutable std::mutex mu_;
  std::map<int, PerDevice> devices_;
  size_t cap_ = cap_from_environment();
};

// Pinned host memory for staging (core/allocator.h): page-locked blocks from cudaHostAlloc,
// cached by rounded size like device blocks. A process without a GPU (or where the driver refuses
// a block) gets ordinary host memory instead, so that pinned tensors work everywhere.
class PinnedHostAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes, int) override {
    const size_t n = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(n);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      stats_.cached_bytes -= n;
      note_allocated(n);
      return p;
    }
    void* p = nullptr;
    if (device_count() > 0 && cudaHostAlloc(&p, n, cudaHostAllocPortable) == cudaSuccess) {
      pinned_.insert(p);
    } else {
      cudaGetLastError();  // (not sticky: a refused block falls back to host memory)
      p = cpu_alloc(n);
    }
    note_allocated(n);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes, int) override {
    if (ptr == nullptr) return;
    const size_t n = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.allocated_bytes -= n;
    free_.emplace(n, ptr);
    stats_.cached_bytes += n;
  }
  AllocatorStats stats(int) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak(int) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }
  void release_cache(int) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [n, p] : free_) {
      if (pinned_.erase(p) > 0)
        cudaFreeHost(p);
      else
        cpu_free(p, n);
    }
    free_.clear();
    stats_.cached_bytes = 0;
  }

 private:
  void note_allocated(size_t n) {
    stats_.allocated_bytes += n;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::set<void*> pinned_;  // the blocks cudaHostAlloc gave (the others are cpu_alloc's)
  AllocatorStats stats_;
};

CudaAllocator& allocator() {
  static CudaAllocator* a = new CudaAllocator();  // leaked on purpose: outlives static tensors
  return *a;
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  check_device(gpu.index);
  set_device(gpu.index);
  // Unified addressing tells the direction; a copy to the host waits for the kernels before it.
  HAP_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

// Registered when the library loads; registering touches no GPU.
const bool g_registered = [] {
  register_allocator(DeviceKind::CUDA, &allocator());
  static PinnedHostAllocator* pinned = new PinnedHostAllocator();  // outlives static tensors
  register_pinned_host_allocator(pinned);
  register_device_copy(DeviceKind::CUDA, copy);
  register_device_synchronize(DeviceKind::CUDA, [](Device d) { synchronize(d.index); });
  register_device_tensor_ops(DeviceKind::CUDA, {fill_elements, copy_elements});
  return true;
}();

}  // namespace

int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().reason; }

void check_device(int index) {
  const int n = device_count();
  HAP_CHECK(n > 0, "cuda:", index, ": no CUDA device is visible to this process (",
            unavailable_reason(), "); use the CPU (train.device: cpu)");
  HAP_CHECK(index >= 0 && index < n, "cuda:", index, ": no such device; this process sees ", n,
            " CUDA device(s), cuda:0 to cuda:", n - 1);
}

std::string device_description(int index) {
  check_device(index);
  cudaDeviceProp p{};
  HAP_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  return detail::concat(p.name, ", sm_", p.major, p.minor, ", ", p.totalGlobalMem >> 20, " MiB");
}

void set_device(int index) {
  // (Read once; a malformed value throws here on every call, naming the variable.)
  static const SmPartitionRequest request = sm_partition_from_environment();
  if (!request.asked.empty()) {
    static std::once_flag entered;  // a failed entry throws and is tried again by the next call
    std::call_once(entered, [&] { enter_green_context(index, request.asked, request.group); });
  }
  if (make_green_context_current(index)) return;
  HAP_CUDA_CHECK(cudaSetDevice(index));
}

MemoryInfo memory_info(int index) {
  check_device(index);
  set_device(index);
  MemoryInfo m;
  HAP_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

void set_memory_cap(size_t bytes) { allocator().set_cap(bytes); }
size_t memory_cap() { return allocator().cap(); }

void synchronize(int index) {
  check_device(index);
  set_device(index);
  HAP_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace hap::cuda
