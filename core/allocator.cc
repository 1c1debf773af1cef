#include "core/allocator.h"

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#include "core/error.h"

namespace hap {
namespace {

constexpr size_t kAlign = 64;
// Blocks above this size are cached; small ones go straight to malloc, which is fast for them.
constexpr size_t kCacheMin = 1 << 16;
// Upper bound on cached bytes so that a one-off peak does not pin memory forever.
constexpr size_t kCacheMax = size_t(8) << 30;

size_t round_size(size_t n) {
  if (n < kCacheMin) return (n + kAlign - 1) / kAlign * kAlign;
  // Round large blocks up to 1/8 of their power of two, so that near sizes share blocks.
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = std::max(p / 8, kCacheMin);
  return (n + step - 1) / step * step;
}

struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;
  AllocatorStats stats;
};

Cache& cache() {
  static Cache* c = new Cache();  // leaked on purpose: outlives static tensors at exit
  return *c;
}

}  // namespace

namespace {

// HAP_POISON_ALLOC=1: every allocation starts as 0xFF bytes (NaN in every floating dtype), so a
// kernel that leaves part of its output unwritten shows at once instead of reading whatever the
// block held before.
bool poison_allocations() {
  static const bool on = [] {
    const char* v = std::getenv("HAP_POISON_ALLOC");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return on;
}

void* fresh_block(size_t nbytes) {
  void* p = std::aligned_alloc(kAlign, nbytes);
  HAP_CHECK(p != nullptr, "out of host memory: could not allocate ", nbytes, " bytes");
  return p;
}

// A block of n bytes (a rounded size): a cached one of that size, or a fresh one.
void* take_block(size_t n) {
  Cache& c = cache();
  if (n >= kCacheMin) {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(n);
    if (it != c.free_blocks.end()) {
      void* p = it->second;
      c.free_blocks.erase(it);
      c.stats.cached_bytes -= n;
      c.stats.allocated_bytes += n;
      c.stats.peak_allocated_bytes =
          std::max(c.stats.peak_allocated_bytes, c.stats.allocated_bytes);
      return p;
    }
  }
  void* p = fresh_block(n);
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.allocated_bytes += n;
  c.stats.peak_allocated_bytes = std::max(c.stats.peak_allocated_bytes, c.stats.allocated_bytes);
  return p;
}

}  // namespace

void* cpu_alloc(size_t nbytes) {
  const size_t n = round_size(std::max<size_t>(nbytes, 1));
  void* p = take_block(n);
  if (poison_allocations()) std::memset(p, 0xFF, n);
  return p;
}

void cpu_free(void* ptr, size_t nbytes) {
  if (!ptr) return;
  size_t n = round_size(std::max<size_t>(nbytes, 1));
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.allocated_bytes -= n;
  if (n >= kCacheMin && c.stats.cached_bytes + n <= kCacheMax) {
    c.free_blocks.emplace(n, ptr);
    c.stats.cached_bytes += n;
    return;
  }
  std::free(ptr);
}

AllocatorStats cpu_allocator_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

void cpu_allocator_reset_peak() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.peak_allocated_bytes = c.stats.allocated_bytes;
}

void cpu_allocator_release_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [n, p] : c.free_blocks) std::free(p);
  c.free_blocks.clear();
  c.stats.cached_bytes = 0;
}

namespace {

class CpuAllocator : public Allocator {
 public:
  void* allocate(size_t nbytes, int) override { return cpu_alloc(nbytes); }
  void deallocate(void* ptr, size_t nbytes, int) override { cpu_free(ptr, nbytes); }
  AllocatorStats stats(int) const override { return cpu_allocator_stats(); }
  void reset_peak(int) override { cpu_allocator_reset_peak(); }
  void release_cache(int) override { cpu_allocator_release_cache(); }
};

constexpr size_t kKinds = kNumDeviceKinds;

struct Registry {
  std::mutex mu;
  std::array<Allocator*, kKinds> allocators{};
  std::array<DeviceCopyFn, kKinds> copies{};
  std::array<DeviceSyncFn, kKinds> syncs{};
  Allocator* pinned = nullptr;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // leaked on purpose, as the cache: outlives static tensors
    static CpuAllocator cpu;
    reg->allocators[static_cast<size_t>(DeviceKind::CPU)] = &cpu;
    return reg;
  }();
  return *r;
}

const char* kind_name(DeviceKind kind) { return kind == DeviceKind::CPU ? "cpu" : "cuda"; }

}  // namespace

Allocator& allocator_for(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Allocator* a = r.allocators[static_cast<size_t>(kind)];
  HAP_CHECK(a != nullptr, "no allocator for ", kind_name(kind),
            " devices: this build or process has no ", kind_name(kind),
            " backend (tensors can live on the "
            "CPU only)");
  return *a;
}

Allocator* registered_allocator(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.allocators[static_cast<size_t>(kind)];
}

DeviceCopyFn registered_device_copy(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.copies[static_cast<size_t>(kind)];
}

bool has_allocator(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.allocators[static_cast<size_t>(kind)] != nullptr;
}

void register_pinned_host_allocator(Allocator* allocator) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.pinned = allocator;
}

Allocator* pinned_host_allocator() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.pinned;
}

void register_allocator(DeviceKind kind, Allocator* allocator) {
  HAP_CHECK(kind != DeviceKind::CPU || allocator != nullptr,
            "register_allocator: the CPU needs an allocator");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.allocators[static_cast<size_t>(kind)] = allocator;
}

void register_device_copy(DeviceKind kind, DeviceCopyFn copy) {
  HAP_CHECK(kind != DeviceKind::CPU, "register_device_copy: host copies are built in");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.copies[static_cast<size_t>(kind)] = copy;
}

void register_device_synchronize(DeviceKind kind, DeviceSyncFn sync) {
  HAP_CHECK(kind != DeviceKind::CPU,
            "register_device_synchronize: the CPU has nothing to wait for");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.syncs[static_cast<size_t>(kind)] = sync;
}

DeviceSyncFn registered_device_synchronize(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.syncs[static_cast<size_t>(kind)];
}

void synchronize(Device device) {
  if (device.is_cpu()) return;
  DeviceSyncFn sync = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    sync = r.syncs[static_cast<size_t>(device.kind)];
  }
  HAP_CHECK(sync != nullptr, "waiting for ", device.str(), ": no ", kind_name(device.kind),
            " backend registered how");
  sync(device);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  const DeviceKind kind = dst_device.is_cpu() ? src_device.kind : dst_device.kind;
  DeviceCopyFn copy = nullptr;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    copy = r.copies[static_cast<size_t>(kind)];
  }
  HAP_CHECK(copy != nullptr, "copying from ", src_device.str(), " to ", dst_device.str(), ": no ",
            kind_name(kind), " backend registered its copies");
  copy(dst, dst_device, src, src_device, nbytes);
}

}  // namespace hap
