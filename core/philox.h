// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The output for a counter is a pure function of (key, counter), so
// element i of a logical tensor can be drawn on any rank and any device without drawing the
// elements before it.
#pragma once
#include <array>
#include <cstdint>

// Host and CUDA kernels compute the same words: the rounds are written once, on plain integers,
// and compiled for both where nvcc compiles this header.
#if defined(__CUDACC__)
#define HAP_HOST_DEVICE __host__ __device__
#else
#define HAP_HOST_DEVICE
#endif

namespace hap {

// The ten rounds on the counter words c0..c3 under the key (k0, k1), in place.
HAP_HOST_DEVICE inline void philox4x32_rounds(uint32_t& c0, uint32_t& c1, uint32_t& c2,
                                              uint32_t& c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
}

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr,
                                          std::array<uint32_t, 2> key) {
  philox4x32_rounds(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1]);
  return ctr;
}

// The four 32-bit words for element `index` of stream `stream` under `seed`.
inline std::array<uint32_t, 4> philox_words(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// Word 0 of philox_words, on the host or in a kernel.
HAP_HOST_DEVICE inline uint32_t philox_first_word(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  philox4x32_rounds(c0, c1, c2, c3, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return c0;
}

// Uniform in [0, 1) with 24 bits (exactly representable in f32), on the host or in a kernel.
HAP_HOST_DEVICE inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(philox_first_word(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller on two words of the same counter; computed in double so that
// every backend that follows this formula gets the same f32 after rounding.
double philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace hap
