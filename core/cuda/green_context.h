// Green contexts: a rank of an emulated mixed GPU cluster runs its kernels on its own group of
// the GPU's SMs (core/sm_partition.h says how the groups are drawn; scripts/hap-emulate sets the
// environment). A green context is a driver context limited to some SMs; once it is current to a
// thread, everything that thread launches through the runtime (our kernels, cuBLAS's, on the
// default stream) runs on those SMs only, and memory is shared with the device's primary context.
//
// HAP enters one on the first use of a GPU in a process whose environment has HAP_EMULATE_SMS
// (cuda::set_device, core/cuda/backend.h) and keeps it for the life of the process; every later
// set_device of that GPU makes it current again. The driver lets a green context be current to
// one thread at a time: HAP calls CUDA from one thread per process (its CPU worker threads run
// only CPU kernels).
//
// The driver functions are found through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links the driver library: a process without a GPU loads this as it loads the rest of
// the CUDA backend, and only entering a green context is an error there, naming why.
#pragma once
#include <string>
#include <vector>

#include "core/sm_partition.h"

namespace hap::cuda {

struct GreenContextInfo {
  int device = -1;           // cuda:N; -1: no green context in effect
  int group = -1;            // which of the groups this process holds
  std::vector<int> asked;    // every rank's SM count on this GPU, in rank order
  std::vector<int> granted;  // the same rounded to the driver's granularity
  SmGranularity granularity;
  int sms = 0;  // the SMs the green context holds, as the driver reports them
};

// What the driver allows a partition of cuda:`device`'s SMs to be (throws as entering does where
// it cannot tell).
SmGranularity sm_granularity(int device);

// Makes this thread run cuda:`device`'s work in a green context holding SM group `group` of the
// partition `asked` (the same on every process sharing the GPU, so the groups are disjoint).
// Throws a hap::Error naming the device where the GPU or driver cannot (no GPU, a driver older
// than CUDA 12.4, counts the GPU cannot give: sm_groups' errors), or a green context is already
// in effect.
const GreenContextInfo& enter_green_context(int device, const std::vector<int>& asked, int group);
// Back to the device's primary context, the green context destroyed (tests).
void leave_green_context();
// The green context in effect in this process (device -1: none).
const GreenContextInfo& green_context();
// Makes the green context current to the calling thread if one is in effect on `device`; false
// (nothing done) where none is.
bool make_green_context_current(int device);
// For run descriptions: "in a green context of 64 of cuda:0's 132 SMs (SM group 0 of 64, 32,
// 16, 16)", "" without one.
std::string green_context_note();

// The SMs the context current to this thread may run on, as the driver reports them.
int current_context_sms();
// The SM each of `blocks` blocks of a kernel launched on cuda:`device`'s default stream ran on
// (diagnostics and tests: a green context's kernels stay on its SMs).
std::vector<int> sm_ids_of_blocks(int device, int blocks);

}  // namespace hap::cuda
