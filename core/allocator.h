// Host memory: 64-byte aligned blocks from a caching allocator. Training allocates the same
// activation sizes every step; reusing freed blocks avoids page faults on every large buffer.
#pragma once
#include <cstddef>

namespace hap {

struct AllocatorStats {
  size_t allocated_bytes = 0;       // handed out and not yet freed
  size_t peak_allocated_bytes = 0;  // high-water mark of allocated_bytes
  size_t cached_bytes = 0;          // freed blocks kept for reuse
};

void* cpu_alloc(size_t nbytes);
void cpu_free(void* ptr, size_t nbytes);
AllocatorStats cpu_allocator_stats();
void cpu_allocator_reset_peak();
// Returns every cached block to the system.
void cpu_allocator_release_cache();

}  // namespace hap
