// CUDA kernel source run on the CPU, for kernels that machines without a GPU must still test (the
// flash attention kernels, ops/cuda/flash_attention.cuh). Include this before the kernel source
// with HAP_CUDA_EMULATION defined: it gives the subset of CUDA such kernels may use.
//
// - A launch runs the grid's blocks one after another; a block's threads are std::threads (one per
//   CUDA thread, blockDim.x a multiple of 32, y = z = 1) sharing the block's dynamic shared memory
//   (HAP_DYNAMIC_SHARED), with __syncthreads a barrier of the block and __syncwarp one of the warp.
//   A missing barrier shows as a race here as on a GPU.
// - WMMA (nvcuda::wmma) with 16x16x16 bf16 tiles and f32 accumulators: each fragment op is a
//   warp-collective operation, carried out once, by lane 0 of the warp, on whole tiles (the
//   elements' distribution over lanes is opaque in CUDA too: kernels never index fragments).
//   Products are summed in f32 in the k order; a GPU's tensor cores may sum in another order.
// - bf16 (__nv_bfloat16): conversions round to nearest even, as the GPU's __float2bfloat16_rn.
// - No warp shuffles, atomics or static __shared__ arrays.
#pragma once

#ifndef HAP_CUDA_EMULATION
#error "define HAP_CUDA_EMULATION before including tests/cuda_emulation.h"
#endif

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace hap::cuda_emulation {

struct BlockState {
  std::unique_ptr<std::barrier<>> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<unsigned char> shared;
  std::atomic<bool> misuse{false};  // a WMMA access broke the rules below (launch throws)
  std::string what;                 // the first one's description (set by the first only)
};

inline thread_local dim3 t_thread, t_block;
inline thread_local BlockState* t_state = nullptr;
inline dim3 g_block_dim, g_grid_dim;

inline unsigned lane() { return t_thread.x % 32; }

// The most dynamic shared memory a block may ask for on the oldest GPU the kernels are built for
// (sm_80: 163 KiB, with cudaFuncAttributeMaxDynamicSharedMemorySize).
constexpr size_t kMaxSharedBytes = 163 * 1024;

// A WMMA load or store of 16 rows (or columns) of 16 elements of `element` bytes, `ldm` elements
// apart, at p: CUDA requires p 256-bit aligned and ldm a multiple of 16 bytes. Pointers into shared
// memory are checked against its start (a block's dynamic shared memory is 128-byte aligned on a
// GPU) and its end; the first violation is recorded and launch() throws it. False where the
// access is refused: the caller then touches no memory (a load or store beyond the block's
// shared memory would read or write past its buffer).
inline bool check_fragment(const void* p, unsigned ldm, size_t element, const char* op) {
  BlockState* state = t_state;
  const auto* base = state->shared.data();
  const auto* at = static_cast<const unsigned char*>(p);
  std::string problem;
  if (ldm * element % 16 != 0) {
    problem = "ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes";
  } else if (at >= base && at < base + state->shared.size()) {
    const size_t offset = static_cast<size_t>(at - base);
    const size_t last = offset + (15 * static_cast<size_t>(ldm) + 16) * element;
    if (offset % 32 != 0)
      problem = "shared-memory offset " + std::to_string(offset) + " is not 32-byte aligned";
    else if (last > state->shared.size())
      problem = "reaches byte " + std::to_string(last) + " of " +
                std::to_string(state->shared.size()) + " of shared memory";
  } else if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    problem = "global pointer not 32-byte aligned";
  }
  if (problem.empty()) return true;
  if (!state->misuse.exchange(true)) state->what = std::string(op) + ": " + problem;
  return false;
}

// Runs kernel(args...) over the grid, block after block, a block's threads concurrently.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x % 32 != 0)
    throw std::invalid_argument("cuda emulation: blocks must be [32 k, 1, 1] threads");
  if (shared_bytes > kMaxSharedBytes)
    throw std::invalid_argument("cuda emulation: " + std::to_string(shared_bytes) +
                                " bytes of shared memory per block; sm_80 allows " +
                                std::to_string(kMaxSharedBytes));
  g_grid_dim = grid;
  g_block_dim = block;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        BlockState state;
        state.block = std::make_unique<std::barrier<>>(block.x);
        for (unsigned w = 0; w < block.x / 32; ++w)
          state.warps.push_back(std::make_unique<std::barrier<>>(32));
        // Uninitialised on a GPU: filled with NaN bytes here, so a kernel reading shared memory it
        // has not written shows it.
        state.shared.assign(shared_bytes, 0xFF);
        std::vector<std::thread> threads;
        threads.reserve(block.x);
        for (unsigned t = 0; t < block.x; ++t)
          threads.emplace_back([&, t] {
            t_thread = dim3(t);
            t_block = dim3(bx, by, bz);
            t_state = &state;
            kernel(args...);
          });
        for (std::thread& th : threads) th.join();
        if (state.misuse) throw std::logic_error("cuda emulation: WMMA " + state.what);
      }
}

}  // namespace hap::cuda_emulation

#define threadIdx (::hap::cuda_emulation::t_thread)
#define blockIdx (::hap::cuda_emulation::t_block)
#define blockDim (::hap::cuda_emulation::g_block_dim)
#define gridDim (::hap::cuda_emulation::g_grid_dim)

inline void __syncthreads() { ::hap::cuda_emulation::t_state->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  ::hap::cuda_emulation::t_state->warps[threadIdx.x / 32]->arrive_and_wait();
}

#define HAP_DYNAMIC_SHARED(name) unsigned char* name = ::hap::cuda_emulation::t_state->shared.data()

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

struct __nv_bfloat16 {
  uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = static_cast<uint32_t>(b.x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// A whole tile, row-major: M x K (matrix_a), K x N (matrix_b) or M x N (accumulator).
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int kRows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int kCols = std::is_same_v<Use, matrix_a> ? K : N;
  T x[kRows * kCols];
};

template <typename Use, int M, int N, int K, typename T, typename Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T v) {
  if (::hap::cuda_emulation::lane() != 0) return;
  for (T& e : f.x) e = v;
}

template <typename Use, int M, int N, int K, typename Layout>
void load_matrix_sync(fragment<Use, M, N, K, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  if (::hap::cuda_emulation::lane() != 0) return;
  if (!::hap::cuda_emulation::check_fragment(p, ldm, sizeof(*p), "load_matrix_sync")) return;
  using F = fragment<Use, M, N, K, __nv_bfloat16, Layout>;
  for (int r = 0; r < F::kRows; ++r)
    for (int c = 0; c < F::kCols; ++c)
      f.x[r * F::kCols + c] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm,
                      layout_t layout) {
  if (::hap::cuda_emulation::lane() != 0) return;
  if (!::hap::cuda_emulation::check_fragment(p, ldm, sizeof(*p), "load_matrix_sync")) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm,
                       layout_t layout) {
  if (::hap::cuda_emulation::lane() != 0) return;
  if (!::hap::cuda_emulation::check_fragment(p, ldm, sizeof(*p), "store_matrix_sync")) return;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
}

template <int M, int N, int K, typename LA, typename LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d,
              const fragment<matrix_a, M, N, K, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, M, N, K, __nv_bfloat16, LB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  if (::hap::cuda_emulation::lane() != 0) return;
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k)
        s += __bfloat162float(a.x[i * K + k]) * __bfloat162float(b.x[k * N + j]);
      out[i * N + j] = s;
    }
  std::memcpy(d.x, out, sizeof(out));
}

}  // namespace nvcuda::wmma
