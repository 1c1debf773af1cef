// Flash attention on bf16 operands: scaled dot-product attention and its backward in tiles on the
// tensor cores (WMMA 16x16x16, bf16 products summed in f32), never materialising the [T, T]
// scores. Used by ops/cuda/attention.cu for bf16 q, k and v with head sizes up to 128; run on the
// CPU by tests/ops/test_flash_attention_emulated.cc through tests/cuda_emulation.h, which is why
// the kernels keep to a small subset of CUDA (dynamic shared memory, __syncthreads, __syncwarp,
// WMMA; no shuffles or atomics).
//
// Semantics are the CPU kernel's (ops/defs/attention.cc): the causal mask, the key padding mask,
// dropout drawn from the Philox stream at the element's index in the logical probabilities
// [B, H, T, T], a row with no key to attend to gives zeros and a log-sum-exp of -inf, the maximum
// skips NaN scores and a NaN score makes its row NaN. Numerics: the products of bf16 operands are
// exact in f32 and summed in f32; the softmax, its statistics and every accumulation are f32; the
// probabilities P (forward and backward) and dS = P (dP - delta) are rounded to bf16 before their
// products on the tensor cores (as flash-attention does), which the CPU's f32 route does not.
//
// Forward (one block of 4 warps per (pair, 64 queries), 16 query rows per warp): for each tile of
// 64 keys, S = Q K^T, the online softmax (running max m and sum l per row, the output rescaled by
// exp(m_old - m_new)), O += P V; at the end O / l and lse = m + log l. Backward, deterministic (no
// atomics): delta = rowsum(dO o O) - dlse per row; one kernel per (pair, 64 keys) accumulates
// dV += Pd^T dO and dK += dS^T Q over the query tiles, another per (pair, 64 queries) accumulates
// dQ += dS K over the key tiles (S and P computed twice: 2 more products than a kernel that adds
// dQ with atomics).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/philox.h"

#if defined(HAP_CUDA_EMULATION)
// tests/cuda_emulation.h, included before this file, gives the CUDA subset on the CPU.
#define HAP_FLASH_LAUNCH(kernel, grid, block, shared, ...) \
  ::hap::cuda_emulation::launch(kernel, grid, block, shared, __VA_ARGS__)
#define HAP_FLASH_SHARED_LIMIT(kernel, bytes) static_cast<void>(bytes)
#define HAP_FLASH_UNROLL
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "core/cuda/check.h"
#define HAP_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#define HAP_FLASH_LAUNCH(kernel, grid, block, shared, ...) \
  kernel<<<grid, block, shared>>>(__VA_ARGS__)
#include <mutex>
// Raises a kernel's dynamic shared-memory limit once per device (cudaFuncSetAttribute costs a
// few microseconds; before every launch it did): Kernel, a template argument, keys the flags.
#define HAP_FLASH_SHARED_LIMIT(kernel, bytes) \
  ::hap::ops::cuda::flash::raise_shared_limit_once<kernel>(bytes)
// Loops over the fragments of a tile row (compile-time counts): unrolled, so that the fragment
// arrays they index stay in registers.
#define HAP_FLASH_UNROLL _Pragma("unroll")
#endif

namespace hap::ops::cuda::flash {

#if !defined(HAP_CUDA_EMULATION)
template <auto Kernel>
void raise_shared_limit_once(size_t bytes) {
  constexpr int kDevices = 64;
  static std::once_flag raised[kDevices];
  int device = 0;
  HAP_CUDA_CHECK(cudaGetDevice(&device));
  auto raise = [&] {
    HAP_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  };
  if (device < 0 || device >= kDevices) return raise();
  // (Where it throws, the flag stays unset and the next launch tries again.)
  std::call_once(raised[device], raise);
}
#endif

using bf16 = __nv_bfloat16;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;  // queries and keys per tile
constexpr int kWarps = kTile / 16;
constexpr int kBlock = 32 * kWarps;
constexpr int kMaxHead = 128;  // head sizes up to this (padded to a multiple of 16 in the tiles)
constexpr int64_t kMaxTiles = 65535;  // grid.y

// One call's operands, all dense ([B H, T, head] row-major, pair by pair).
struct Params {
  const bf16* q = nullptr;       // [BH, T, dh]
  const bf16* k = nullptr;       // [BH, T, dh]
  const bf16* v = nullptr;       // [BH, T, dhv]
  bf16* o = nullptr;             // forward: [BH, T, dhv]
  float* lse = nullptr;          // forward: written; backward: read. [BH, T]
  const bf16* go = nullptr;      // backward: dO [BH, T, dhv]
  const float* delta = nullptr;  // backward: rowsum(dO o O) - dlse [BH, T]
  bf16* gq = nullptr;
  bf16* gk = nullptr;
  bf16* gv = nullptr;
  int64_t bh = 0, t = 0, heads = 1;
  int dh = 0, dhv = 0;
  float scale = 1;
  bool causal = true;
  const uint8_t* keys = nullptr;  // [B, T], 0 = masked key; or null
  bool dropout = false;
  uint64_t seed = 0, stream = 0;
  double keep = 1;                   // 1 - p, compared in double as the CPU does
  float inv_keep = 1;                // the factor of a kept element
  int64_t offset[4] = {0, 0, 0, 0};  // of this call's [B, H, T, T] in the logical probabilities
  int64_t stride[4] = {0, 0, 0, 1};  // the logical probabilities' strides
  bool vectors = false;  // q, k, v, go start 16-byte aligned (set by forward() and backward())
};

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline int padded_head(int d) { return (d + 15) / 16 * 16; }
// The tile width the kernels are built for that holds both head sizes; 0 when none does.
inline int tile_head(int dh, int dhv) {
  const int d = padded_head(dh > dhv ? dh : dhv);
  if (dh < 1 || dhv < 1 || d > kMaxHead) return 0;
  for (int w : {16, 32, 64, 96, 128})
    if (d <= w) return w;
  return 0;
}

// Leading dimensions (elements) of the tiles in shared memory, each row padded by 16 bytes so
// that consecutive rows start 4 banks apart: a WMMA load of 8 rows of 16 bytes then touches 32
// different banks, where unpadded rows of 128 or 256 bytes all start in the same bank and the
// rows' accesses serialise. Every leading dimension is a multiple of 16 bytes and every row block
// of 16 rows a multiple of 32 bytes, as WMMA requires.
template <int DP>
struct Ld {
  static constexpr int tile = DP + 8;  // bf16 [64, DP]: Q, K, V, dO
  static constexpr int acc = DP + 4;   // f32 [64, DP]: the forward's O, the backward's staging
  static constexpr int s = kTile + 4;  // f32 [64, 64]: S, dP
  static constexpr int p = kTile + 8;  // bf16 [64, 64]: P, dS
};

// Shared memory of each kernel, byte offsets (every region a multiple of 128 bytes).
template <int DP>
struct ForwardLayout {
  static constexpr size_t tile = kTile * Ld<DP>::tile * 2;
  static constexpr size_t q = 0, k = q + tile, v = k + tile, s = v + tile,
                          p = s + kTile * Ld<DP>::s * 4, o = p + kTile * Ld<DP>::p * 2,
                          m = o + kTile * Ld<DP>::acc * 4, l = m + kTile * 4, alpha = l + kTile * 4,
                          part = alpha + kTile * 4, bytes = part + kTile * 2 * 4;
};
template <int DP>
struct KeysLayout {  // dK and dV
  static constexpr size_t tile = kTile * Ld<DP>::tile * 2;
  static constexpr size_t k = 0, v = k + tile, q = v + tile, go = q + tile, lse = go + tile,
                          delta = lse + kTile * 4, s = delta + kTile * 4,
                          dp = s + kTile * Ld<DP>::s * 4, p = dp + kTile * Ld<DP>::s * 4,
                          ds = p + kTile * Ld<DP>::p * 2, bytes = ds + kTile * Ld<DP>::p * 2;
  static_assert(Ld<DP>::acc <= 2 * Ld<DP>::s, "s and dp stage a [64, DP] f32 tile");
};
template <int DP>
struct QueriesLayout {  // dQ
  static constexpr size_t tile = kTile * Ld<DP>::tile * 2;
  static constexpr size_t q = 0, go = q + tile, k = go + tile, v = k + tile, lse = v + tile,
                          delta = lse + kTile * 4, s = delta + kTile * 4,
                          dp = s + kTile * Ld<DP>::s * 4, ds = dp + kTile * Ld<DP>::s * 4,
                          bytes = ds + kTile * Ld<DP>::p * 2;
  static_assert(Ld<DP>::acc <= 2 * Ld<DP>::s, "s and dp stage a [64, DP] f32 tile");
};
// sm_80 gives a block at most 163 KiB of shared memory (sm_90: 227 KiB).
static_assert(ForwardLayout<kMaxHead>::bytes <= 163 * 1024 &&
                  KeysLayout<kMaxHead>::bytes <= 163 * 1024 &&
                  QueriesLayout<kMaxHead>::bytes <= 163 * 1024,
              "the widest tiles fit sm_80's shared memory");

// The most shared memory a block of these kernels asks for, for a tile width.
inline size_t shared_bytes(int dp) {
  auto most = [](size_t a, size_t b, size_t c) {
    return a > b ? (a > c ? a : c) : (b > c ? b : c);
  };
  switch (dp) {
    case 16:
      return most(ForwardLayout<16>::bytes, KeysLayout<16>::bytes, QueriesLayout<16>::bytes);
    case 32:
      return most(ForwardLayout<32>::bytes, KeysLayout<32>::bytes, QueriesLayout<32>::bytes);
    case 64:
      return most(ForwardLayout<64>::bytes, KeysLayout<64>::bytes, QueriesLayout<64>::bytes);
    case 96:
      return most(ForwardLayout<96>::bytes, KeysLayout<96>::bytes, QueriesLayout<96>::bytes);
    default:
      return most(ForwardLayout<128>::bytes, KeysLayout<128>::bytes, QueriesLayout<128>::bytes);
  }
}

template <typename T>
__device__ __forceinline__ T* region(unsigned char* smem, size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}

// May query i attend to key j of batch b.
__device__ __forceinline__ bool allowed(const Params& p, int64_t b, int64_t i, int64_t j) {
  return i < p.t && j < p.t && (!p.causal || j <= i) &&
         (p.keys == nullptr || p.keys[b * p.t + j] != 0);
}

// Element (b, h, i, j)'s dropout factor: 1 / (1 - p) when kept, else 0 (1 without dropout).
__device__ __forceinline__ float drop_factor(const Params& p, int64_t b, int64_t h, int64_t i,
                                             int64_t j) {
  if (!p.dropout) return 1.0f;
  const uint64_t index =
      static_cast<uint64_t>((b + p.offset[0]) * p.stride[0] + (h + p.offset[1]) * p.stride[1] +
                            (i + p.offset[2]) * p.stride[2] + (j + p.offset[3]) * p.stride[3]);
  return static_cast<double>(philox_uniform(p.seed, p.stream, index)) < p.keep ? p.inv_keep : 0.0f;
}

// Rows r0 .. r0 + 63 of one pair's x [t, width] into s [64, DP] (ld Ld<DP>::tile), zeros past t
// and width.
// Where the operands start 16-byte aligned (Params::vectors) and rows have a multiple of 8
// elements, rows move as 16-byte vectors of 8 elements, else element by element.
template <int DP>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* x, int64_t r0, int64_t t, int width,
                                          bool vectors) {
  if (vectors && width % 8 == 0) {
    const uint4 zeros = {0u, 0u, 0u, 0u};
    for (int e = threadIdx.x; e < kTile * DP / 8; e += kBlock) {
      const int r = e / (DP / 8), c = (e % (DP / 8)) * 8;
      *reinterpret_cast<uint4*>(s + r * Ld<DP>::tile + c) =
          r0 + r < t && c < width ? *reinterpret_cast<const uint4*>(x + (r0 + r) * width + c)
                                  : zeros;
    }
    return;
  }
  const bf16 zero = __float2bfloat16_rn(0.0f);
  for (int e = threadIdx.x; e < kTile * DP; e += kBlock) {
    const int r = e / DP, c = e % DP;
    s[r * Ld<DP>::tile + c] = r0 + r < t && c < width ? x[(r0 + r) * width + c] : zero;
  }
}

// One pair's keys and values, rows k0 .. k0 + 63, into sk and sv.
template <int DP>
__device__ __forceinline__ void load_keys(bf16* sk, bf16* sv, const Params& p, int64_t pair,
                                          int64_t k0) {
  load_tile<DP>(sk, p.k + pair * p.t * p.dh, k0, p.t, p.dh, p.vectors);
  load_tile<DP>(sv, p.v + pair * p.t * p.dhv, k0, p.t, p.dhv, p.vectors);
}

// The backward's query side, rows q0 .. q0 + 63 of one pair: Q and dO into sq and sgo, each row's
// lse and delta into slse and sdelta (-inf and 0 past t).
template <int DP>
__device__ __forceinline__ void load_queries(bf16* sq, bf16* sgo, float* slse, float* sdelta,
                                             const Params& p, int64_t pair, int64_t q0) {
  load_tile<DP>(sq, p.q + pair * p.t * p.dh, q0, p.t, p.dh, p.vectors);
  load_tile<DP>(sgo, p.go + pair * p.t * p.dhv, q0, p.t, p.dhv, p.vectors);
  for (int e = threadIdx.x; e < kTile; e += kBlock) {
    const bool in = q0 + e < p.t;
    slse[e] = in ? p.lse[pair * p.t + q0 + e] : -INFINITY;
    sdelta[e] = in ? p.delta[pair * p.t + q0 + e] : 0.0f;
  }
}

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// out [16, 64] (ld Ld::s) = a [16, DP] times b^T, b [64, DP] (both ld Ld::tile): one warp.
template <int DP>
__device__ __forceinline__ void rows_times_tile_t(float* out, const bf16* a, const bf16* b) {
  HAP_FLASH_UNROLL
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    HAP_FLASH_UNROLL
    for (int kk = 0; kk < DP / 16; ++kk) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + kk * 16, Ld<DP>::tile);
      wmma::load_matrix_sync(fb, b + n * 16 * Ld<DP>::tile + kk * 16, Ld<DP>::tile);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, Ld<DP>::s, wmma::mem_row_major);
  }
}

// acc[c] += a [16, 64] (ld Ld::p) times b [64, DP] (ld Ld::tile), column block c: one warp.
template <int DP>
__device__ __forceinline__ void accumulate_rows_times_tile(FragC* acc, const bf16* a,
                                                           const bf16* b) {
  HAP_FLASH_UNROLL
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + kk * 16, Ld<DP>::p);
    HAP_FLASH_UNROLL
    for (int c = 0; c < DP / 16; ++c) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, b + kk * 16 * Ld<DP>::tile + c * 16, Ld<DP>::tile);
      wmma::mma_sync(acc[c], fa, fb, acc[c]);
    }
  }
}

template <int DP>
__global__ void __launch_bounds__(kBlock) forward_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; flash_accepts keeps older GPUs on the f32 route
#else
  HAP_DYNAMIC_SHARED(smem);
  using L = ForwardLayout<DP>;
  bf16* sq = region<bf16>(smem, L::q);
  bf16* sk = region<bf16>(smem, L::k);
  bf16* sv = region<bf16>(smem, L::v);
  float* ss = region<float>(smem, L::s);
  bf16* sp = region<bf16>(smem, L::p);
  float* so = region<float>(smem, L::o);
  float* sm = region<float>(smem, L::m);
  float* sl = region<float>(smem, L::l);
  float* salpha = region<float>(smem, L::alpha);
  float* spart = region<float>(smem, L::part);  // per row, the two halves' maximum, then sum
  const int64_t pair = blockIdx.x, q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t b = pair / p.heads, h = pair % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<DP>(sq, p.q + pair * p.t * p.dh, q0, p.t, p.dh, p.vectors);
  for (int e = threadIdx.x; e < kTile * Ld<DP>::acc; e += kBlock) so[e] = 0.0f;
  for (int e = threadIdx.x; e < kTile; e += kBlock) {
    sm[e] = -INFINITY;
    sl[e] = 0.0f;
  }
  const int64_t end = p.causal && q0 + kTile < p.t ? q0 + kTile : p.t;
  for (int64_t k0 = 0; k0 < end; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_keys<DP>(sk, sv, p, pair, k0);
    __syncthreads();
    rows_times_tile_t<DP>(ss + warp * 16 * Ld<DP>::s, sq + warp * 16 * Ld<DP>::tile, sk);
    __syncwarp();
    {  // The online softmax, two lanes per row: lane l takes row l mod 16, half l / 16 of it.
      constexpr int kHalf = kTile / 2;
      const int r = warp * 16 + (lane & 15), half = lane >> 4;
      const int64_t i = q0 + r;
      float* srow = ss + r * Ld<DP>::s;
      bf16* prow = sp + r * Ld<DP>::p;
      // Column half * 32 + (n + lane) mod 32 at step n: lane l's word is 5 l + n (mod 32) banks
      // from the tile's start (rows Ld::s = 68 words apart), the 32 lanes read 32 different banks.
      float part = -INFINITY;
      for (int n = 0; n < kHalf; ++n) {
        const int j = half * kHalf + (n + lane) % kHalf;
        const float x = allowed(p, b, i, k0 + j) ? srow[j] * p.scale : -INFINITY;
        srow[j] = x;
        part = fmaxf(part, x);  // skips NaN
      }
      spart[r * 2 + half] = part;
      __syncwarp();
      const float m_old = sm[r];
      const float mx = fmaxf(m_old, fmaxf(spart[r * 2], spart[r * 2 + 1]));
      float sum = 0.0f;
      for (int n = 0; n < kHalf; ++n) {
        const int j = half * kHalf + (n + lane) % kHalf;
        // 0 for a masked key; NaN for a NaN score (also where mx is still -inf: a row of NaN).
        const float e = srow[j] == -INFINITY ? 0.0f : expf(srow[j] - mx);
        sum += e;
        prow[j] =
            __float2bfloat16_rn(p.dropout && e != 0.0f ? e * drop_factor(p, b, h, i, k0 + j) : e);
      }
      __syncwarp();  // both halves have read the maxima and m_old
      spart[r * 2 + half] = sum;
      __syncwarp();
      if (half == 0) {
        const float alpha = mx != -INFINITY ? expf(m_old - mx) : 1.0f;  // 0 while no key was seen
        sm[r] = mx;
        sl[r] = sl[r] * alpha + (spart[r * 2] + spart[r * 2 + 1]);
        salpha[r] = alpha;
      }
    }
    __syncwarp();
    for (int e = lane; e < 16 * DP; e += 32) {
      const int r = warp * 16 + e / DP;
      so[r * Ld<DP>::acc + e % DP] *= salpha[r];
    }
    __syncwarp();
    FragC acc[DP / 16];
    HAP_FLASH_UNROLL
    for (int c = 0; c < DP / 16; ++c)
      wmma::load_matrix_sync(acc[c], so + warp * 16 * Ld<DP>::acc + c * 16, Ld<DP>::acc,
                             wmma::mem_row_major);
    accumulate_rows_times_tile<DP>(acc, sp + warp * 16 * Ld<DP>::p, sv);
    HAP_FLASH_UNROLL
    for (int c = 0; c < DP / 16; ++c)
      wmma::store_matrix_sync(so + warp * 16 * Ld<DP>::acc + c * 16, acc[c], Ld<DP>::acc,
                              wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * p.dhv; e += kBlock) {
    const int r = e / p.dhv, c = e % p.dhv;
    const int64_t i = q0 + r;
    if (i >= p.t) continue;
    // No key to attend to: l is exactly 0 (a row with any key has l >= 1, or NaN).
    const float value = sl[r] == 0.0f ? 0.0f : so[r * Ld<DP>::acc + c] / sl[r];
    p.o[(pair * p.t + i) * p.dhv + c] = __float2bfloat16_rn(value);
  }
  for (int r = threadIdx.x; r < kTile; r += kBlock) {
    const int64_t i = q0 + r;
    if (i < p.t) p.lse[pair * p.t + i] = sl[r] == 0.0f ? -INFINITY : sm[r] + logf(sl[r]);
  }
#endif
}

// delta = rowsum(dO o O) - dlse, one thread per row.
__global__ void __launch_bounds__(256)
    delta_kernel(const bf16* go, const bf16* o, const float* glse, float* delta, int64_t rows,
                 int dhv) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    float dot = 0.0f;
    for (int c = 0; c < dhv; ++c)
      dot += __bfloat162float(go[row * dhv + c]) * __bfloat162float(o[row * dhv + c]);
    delta[row] = dot - (glse != nullptr ? glse[row] : 0.0f);
  }
}

// Element (i, j)'s Pd and dS in the backward (zeros where i may not attend to j).
__device__ __forceinline__ void backward_element(const Params& p, int64_t b, int64_t h, int64_t i,
                                                 int64_t j, float score, float dp, float lse,
                                                 float delta, bf16* pd_out, bf16* ds_out) {
  float pd = 0.0f, ds = 0.0f;
  if (allowed(p, b, i, j) && lse != -INFINITY) {
    const float x = score * p.scale;
    const float pj = x == -INFINITY ? 0.0f : expf(x - lse);
    const float m = drop_factor(p, b, h, i, j);
    pd = pj * m;
    ds = pj * (dp * m - delta);
  }
  if (pd_out != nullptr) *pd_out = __float2bfloat16_rn(pd);
  *ds_out = __float2bfloat16_rn(ds);
}

// Writes a warp's 16 rows of acc (scaled) as bf16 rows r0 .. of x [t, width], staged in stage.
template <int DP>
__device__ __forceinline__ void write_rows(bf16* x, int64_t r0, int64_t t, int width, FragC* acc,
                                           float* stage, float scale) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  HAP_FLASH_UNROLL
  for (int c = 0; c < DP / 16; ++c)
    wmma::store_matrix_sync(stage + warp * 16 * Ld<DP>::acc + c * 16, acc[c], Ld<DP>::acc,
                            wmma::mem_row_major);
  __syncwarp();
  for (int e = lane; e < 16 * width; e += 32) {
    const int r = warp * 16 + e / width, c = e % width;
    if (r0 + r < t)
      x[(r0 + r) * width + c] = __float2bfloat16_rn(stage[r * Ld<DP>::acc + c] * scale);
  }
  __syncwarp();
}

template <int DP>
__global__ void __launch_bounds__(kBlock) keys_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; flash_accepts keeps older GPUs on the f32 route
#else
  HAP_DYNAMIC_SHARED(smem);
  using L = KeysLayout<DP>;
  bf16* sk = region<bf16>(smem, L::k);
  bf16* sv = region<bf16>(smem, L::v);
  bf16* sq = region<bf16>(smem, L::q);
  bf16* sgo = region<bf16>(smem, L::go);
  float* slse = region<float>(smem, L::lse);
  float* sdelta = region<float>(smem, L::delta);
  float* ss = region<float>(smem, L::s);
  float* sdp = region<float>(smem, L::dp);
  bf16* sp = region<bf16>(smem, L::p);
  bf16* sds = region<bf16>(smem, L::ds);
  const int64_t pair = blockIdx.x, k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t b = pair / p.heads, h = pair % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_keys<DP>(sk, sv, p, pair, k0);
  FragC dk[DP / 16], dv[DP / 16];
  HAP_FLASH_UNROLL
  for (int c = 0; c < DP / 16; ++c) {
    wmma::fill_fragment(dk[c], 0.0f);
    wmma::fill_fragment(dv[c], 0.0f);
  }
  // Queries before k0 attend to none of these keys under the causal mask.
  for (int64_t q0 = p.causal ? k0 : 0; q0 < p.t; q0 += kTile) {
    __syncthreads();  // the previous tile's Q and dO are no longer read
    load_queries<DP>(sq, sgo, slse, sdelta, p, pair, q0);
    __syncthreads();
    // This warp's 16 keys against the 64 queries: S^T = K Q^T, dP^T = V dO^T.
    rows_times_tile_t<DP>(ss + warp * 16 * Ld<DP>::s, sk + warp * 16 * Ld<DP>::tile, sq);
    rows_times_tile_t<DP>(sdp + warp * 16 * Ld<DP>::s, sv + warp * 16 * Ld<DP>::tile, sgo);
    __syncwarp();
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = warp * 16 + e / kTile, c = e % kTile;
      const int at = r * Ld<DP>::s + c, to = r * Ld<DP>::p + c;
      backward_element(p, b, h, q0 + c, k0 + r, ss[at], sdp[at], slse[c], sdelta[c], sp + to,
                       sds + to);
    }
    __syncwarp();
    accumulate_rows_times_tile<DP>(dv, sp + warp * 16 * Ld<DP>::p, sgo);  // dV += Pd^T dO
    accumulate_rows_times_tile<DP>(dk, sds + warp * 16 * Ld<DP>::p, sq);  // dK += dS^T Q
  }
  __syncthreads();
  write_rows<DP>(p.gk + pair * p.t * p.dh, k0, p.t, p.dh, dk, ss, p.scale);
  write_rows<DP>(p.gv + pair * p.t * p.dhv, k0, p.t, p.dhv, dv, ss, 1.0f);
#endif
}

template <int DP>
__global__ void __launch_bounds__(kBlock) queries_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; flash_accepts keeps older GPUs on the f32 route
#else
  HAP_DYNAMIC_SHARED(smem);
  using L = QueriesLayout<DP>;
  bf16* sq = region<bf16>(smem, L::q);
  bf16* sgo = region<bf16>(smem, L::go);
  bf16* sk = region<bf16>(smem, L::k);
  bf16* sv = region<bf16>(smem, L::v);
  float* slse = region<float>(smem, L::lse);
  float* sdelta = region<float>(smem, L::delta);
  float* ss = region<float>(smem, L::s);
  float* sdp = region<float>(smem, L::dp);
  bf16* sds = region<bf16>(smem, L::ds);
  const int64_t pair = blockIdx.x, q0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t b = pair / p.heads, h = pair % p.heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_queries<DP>(sq, sgo, slse, sdelta, p, pair, q0);
  FragC dq[DP / 16];
  HAP_FLASH_UNROLL
  for (int c = 0; c < DP / 16; ++c) wmma::fill_fragment(dq[c], 0.0f);
  const int64_t end = p.causal && q0 + kTile < p.t ? q0 + kTile : p.t;
  for (int64_t k0 = 0; k0 < end; k0 += kTile) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_keys<DP>(sk, sv, p, pair, k0);
    __syncthreads();
    // S = Q K^T, dP = dO V^T
    rows_times_tile_t<DP>(ss + warp * 16 * Ld<DP>::s, sq + warp * 16 * Ld<DP>::tile, sk);
    rows_times_tile_t<DP>(sdp + warp * 16 * Ld<DP>::s, sgo + warp * 16 * Ld<DP>::tile, sv);
    __syncwarp();
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = warp * 16 + e / kTile, c = e % kTile;
      const int at = r * Ld<DP>::s + c, to = r * Ld<DP>::p + c;
      backward_element(p, b, h, q0 + r, k0 + c, ss[at], sdp[at], slse[r], sdelta[r], nullptr,
                       sds + to);
    }
    __syncwarp();
    accumulate_rows_times_tile<DP>(dq, sds + warp * 16 * Ld<DP>::p, sk);  // dQ += dS K
  }
  __syncthreads();
  write_rows<DP>(p.gq + pair * p.t * p.dh, q0, p.t, p.dh, dq, ss, p.scale);
#endif
}

template <int DP>
void forward_with(const Params& p) {
  const size_t bytes = ForwardLayout<DP>::bytes;
  HAP_FLASH_SHARED_LIMIT(forward_kernel<DP>, bytes);
  const dim3 grid(static_cast<unsigned>(p.bh), static_cast<unsigned>((p.t + kTile - 1) / kTile));
  HAP_FLASH_LAUNCH(forward_kernel<DP>, grid, dim3(kBlock), bytes, p);
}

template <int DP>
void backward_with(const Params& p) {
  const dim3 grid(static_cast<unsigned>(p.bh), static_cast<unsigned>((p.t + kTile - 1) / kTile));
  HAP_FLASH_SHARED_LIMIT(keys_kernel<DP>, KeysLayout<DP>::bytes);
  HAP_FLASH_LAUNCH(keys_kernel<DP>, grid, dim3(kBlock), KeysLayout<DP>::bytes, p);
  HAP_FLASH_SHARED_LIMIT(queries_kernel<DP>, QueriesLayout<DP>::bytes);
  HAP_FLASH_LAUNCH(queries_kernel<DP>, grid, dim3(kBlock), QueriesLayout<DP>::bytes, p);
}

// The forward: p.o and p.lse written. Requires tile_head(p.dh, p.dhv) != 0, p.bh >= 1,
// 1 <= p.t <= kMaxTiles * kTile.
inline void forward(const Params& given) {
  Params p = given;
  p.vectors = aligned16(p.q) && aligned16(p.k) && aligned16(p.v);
  switch (tile_head(p.dh, p.dhv)) {
    case 16:
      forward_with<16>(p);
      break;
    case 32:
      forward_with<32>(p);
      break;
    case 64:
      forward_with<64>(p);
      break;
    case 96:
      forward_with<96>(p);
      break;
    default:
      forward_with<128>(p);
      break;
  }
}

// The backward: delta (p.bh * p.t floats, the caller's) from dO, O and dlse (or null), then
// p.gq, p.gk and p.gv written. p.delta must point to delta.
inline void backward(const Params& given, const bf16* o, const float* glse, float* delta) {
  Params p = given;
  p.vectors = aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.go);
  const int64_t rows = p.bh * p.t;
  const int64_t blocks = (rows + 255) / 256;
  HAP_FLASH_LAUNCH(delta_kernel, dim3(static_cast<unsigned>(blocks < 65536 ? blocks : 65536)),
                   dim3(256), size_t{0}, p.go, o, glse, delta, rows, p.dhv);
  switch (tile_head(p.dh, p.dhv)) {
    case 16:
      backward_with<16>(p);
      break;
    case 32:
      backward_with<32>(p);
      break;
    case 64:
      backward_with<64>(p);
      break;
    case 96:
      backward_with<96>(p);
      break;
    default:
      backward_with<128>(p);
      break;
  }
}

}  // namespace hap::ops::cuda::flash
