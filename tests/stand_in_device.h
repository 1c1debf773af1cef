// A stand-in device behind the CUDA slot, for tests of the device seams on machines without a
// GPU: its memory is host memory (counted), its host<->device copies are memcpy (counted), waiting
// for it is counted. The
// object registers both while it lives and puts back whatever was registered before (the real
// CUDA backend, when built).
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/allocator.h"
#include "core/tensor.h"

namespace hap::test_util {

struct StandInAllocator : Allocator {
  size_t live = 0;  // bytes allocated and not yet freed
  void* allocate(size_t nbytes, int) override {
    live += nbytes;
    return std::malloc(std::max<size_t>(nbytes, 1));
  }
  void deallocate(void* p, size_t nbytes, int) override {
    live -= nbytes;
    std::free(p);
  }
  AllocatorStats stats(int) const override { return {live, live, 0}; }
  void reset_peak(int) override {}
  void release_cache(int) override {}
};

// Copies between the host and the stand-in device so far (any StandInDevice).
inline int g_stand_in_copies = 0;
inline void stand_in_copy(void* dst, Device, const void* src, Device, size_t nbytes) {
  ++g_stand_in_copies;
  std::memcpy(dst, src, nbytes);
}
// Waits for the stand-in device so far, and the device index of the last one.
inline int g_stand_in_syncs = 0;
inline int g_stand_in_synced_index = -1;
inline void stand_in_synchronize(Device d) {
  ++g_stand_in_syncs;
  g_stand_in_synced_index = d.index;
}

class StandInDevice {
 public:
  StandInDevice()
      : saved_allocator_(registered_allocator(DeviceKind::CUDA)),
        saved_copy_(registered_device_copy(DeviceKind::CUDA)),
        saved_sync_(registered_device_synchronize(DeviceKind::CUDA)) {
    register_allocator(DeviceKind::CUDA, &allocator);
    register_device_copy(DeviceKind::CUDA, &stand_in_copy);
    register_device_synchronize(DeviceKind::CUDA, &stand_in_synchronize);
  }
  ~StandInDevice() {
    register_allocator(DeviceKind::CUDA, saved_allocator_);
    register_device_copy(DeviceKind::CUDA, saved_copy_);
    register_device_synchronize(DeviceKind::CUDA, saved_sync_);
  }
  StandInDevice(const StandInDevice&) = delete;
  StandInDevice& operator=(const StandInDevice&) = delete;

  StandInAllocator allocator;

 private:
  Allocator* saved_allocator_;
  DeviceCopyFn saved_copy_;
  DeviceSyncFn saved_sync_;
};

}  // namespace hap::test_util
