// Device memory: one allocator per device type, behind one interface. The CPU's is a caching
// allocator of 64-byte aligned host blocks (training allocates the same activation sizes every
// step; reusing freed blocks avoids page faults on every large buffer). A device backend (CUDA)
// registers its allocator and its copies to and from the host; until one does, allocating on that
// device type is an error that says so.
#pragma once
#include <cstddef>

#include "core/device.h"

namespace hap {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // handed out and not yet freed
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  size_t cached_bytes = 0;          // freed blocks kept for reuse
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `nbytes` (>= 0) on device `index` of this type; never null (throws when out of memory,
  // naming the device, the size and any cap).
  virtual void* allocate(size_t nbytes, int index) = 0;
  virtual void deallocate(void* ptr, size_t nbytes, int index) = 0;
  virtual AllocatorStats stats(int index) const = 0;
  virtual void reset_peak(int index) = 0;
  // Returns cached blocks to the system (or the driver).
  virtual void release_cache(int index) = 0;
};

// The allocator of a device type; throws hap::Error when no backend registered one.
Allocator& allocator_for(DeviceKind kind);
// For a device backend: its allocator (which must outlive every tensor on that device type);
// null removes it (tests).
void register_allocator(DeviceKind kind, Allocator* allocator);
bool has_allocator(DeviceKind kind);

// Copies `nbytes` from `src` on `src_device` to `dst` on `dst_device` (host <-> device, or between
// devices), registered by the backend of the non-CPU device; CPU to CPU is a memcpy.
using DeviceCopyFn = void (*)(void* dst, Device dst_device, const void* src, Device src_device,
                              size_t nbytes);
void register_device_copy(DeviceKind kind, DeviceCopyFn copy);  // null removes it
// What is registered now (null: nothing), so that a test can put back what it replaced.
Allocator* registered_allocator(DeviceKind kind);
DeviceCopyFn registered_device_copy(DeviceKind kind);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);

// Waiting for a device's queued work, registered by its backend (a GPU's kernels run after their
// launch; CUDA: cudaDeviceSynchronize in the device's context).
using DeviceSyncFn = void (*)(Device device);
void register_device_synchronize(DeviceKind kind, DeviceSyncFn sync);  // null removes it
DeviceSyncFn registered_device_synchronize(DeviceKind kind);
// Returns once every kernel and copy queued on `device` has finished, so that a time taken after
// it covers the work and not only its launch: nothing to wait for on the CPU (its kernels finish
// before they return); an error naming the device where no backend registered one.
void synchronize(Device device);

// Page-locked ("pinned") host memory, registered by a device backend (CUDA: cudaHostAlloc, cached):
// host tensors made with TensorOptions::pinned come from it, so that copies between them and
// the device run at the link's full rate (staging, parallel/staging.h). Null where none is
// registered: pinned tensors are then ordinary host memory. The allocator must outlive every
// tensor made with it; null removes it (tests).
void register_pinned_host_allocator(Allocator* allocator);
Allocator* pinned_host_allocator();

// The CPU caching allocator itself (what allocator_for(DeviceKind::CPU) wraps).
void* cpu_alloc(size_t nbytes);
void cpu_free(void* ptr, size_t nbytes);
AllocatorStats cpu_allocator_stats();
void cpu_allocator_reset_peak();
// Returns every cached block to the system.
void cpu_allocator_release_cache();

}  // namespace hap
