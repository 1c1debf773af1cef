// The CUDA backend's host side: which GPUs this process sees, and the caching allocator and
// copies it registers for DeviceKind::CUDA (core/allocator.h) when the library loads. Built where
// nvcc is found (CMake option HAP_CUDA); a process without a GPU or driver loads it all the same,
// and only using a CUDA tensor is an error, naming the device.
//
// Host tensors made pinned (TensorOptions::pinned: the staging backend's buffers) come from
// cudaHostAlloc, cached the same way; ordinary host memory in a process without a GPU.
//
// The allocator caches freed blocks by rounded size (all work runs on the default stream, so a
// freed block is reusable by the next kernel in stream order), keeps statistics per device, and
// honours a cap: HAP_CUDA_MEMORY_CAP in the environment (a byte count as cluster files write
// memory: 2GiB, 512MB, 1e9), or set_memory_cap(). An allocation over the cap, or one the GPU cannot
// satisfy after the cache is returned, is a hap::Error naming the device, the bytes asked for, in
// use, cached and free.
#pragma once
#include <cstddef>
#include <string>

namespace hap::cuda {

// The number of GPUs this process can use: 0 without a driver or device (never throws).
int device_count();
// Why device_count() is 0 ("" when it is not): the runtime's own words.
std::string unavailable_reason();
// Throws a hap::Error naming cuda:`index` when it is not a usable device.
void check_device(int index);
// The device's name and compute capability ("NVIDIA H200, sm_90").
std::string device_description(int index);

// The device's free and total memory as the driver reports them (cudaMemGetInfo).
struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
MemoryInfo memory_info(int index);

// Bytes a CUDA device may hold through the allocator (0: no cap).
void set_memory_cap(size_t bytes);
size_t memory_cap();

// Makes cuda:`index` the calling thread's device: its green context where one is in effect
// (core/cuda/green_context.h), else its primary context (cudaSetDevice). Every CUDA path of HAP
// goes through it. The first call in a process whose environment has HAP_EMULATE_SMS (an emulated
// mixed GPU cluster, scripts/hap-emulate) enters the green context of the SM group
// HAP_EMULATE_SM_GROUP names on that device, for the rest of the process.
void set_device(int index);

// Waits for every kernel and copy queued on the device.
void synchronize(int index);

}  // namespace hap::cuda
