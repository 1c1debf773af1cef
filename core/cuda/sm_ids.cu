// Which SM each block of a kernel ran on (cuda::sm_ids_of_blocks, core/cuda/green_context.h): a
// green context's kernels must stay on its SMs.
#include <cuda_runtime_api.h>

namespace hap::cuda {
namespace {

__global__ void sm_ids_kernel(int* ids) {
  if (threadIdx.x != 0) return;
  unsigned int sm = 0;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  ids[blockIdx.x] = static_cast<int>(sm);
  // Long enough that the blocks spread over every SM the context may use.
  const long long start = clock64();
  while (clock64() - start < 200000) {
  }
}

}  // namespace

void launch_sm_ids(int* ids, int blocks) { sm_ids_kernel<<<blocks, 32>>>(ids); }

}  // namespace hap::cuda
