// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The output for a counter is a pure function of (key, counter), so
// element i of a logical tensor can be drawn on any rank and any device without drawing the
// elements before it.
#pragma once
#include <array>
#include <cstdint>

namespace hap {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr,
                                          std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// The four 32-bit words for element `index` of stream `stream` under `seed`.
inline std::array<uint32_t, 4> philox_words(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                     static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
}

// Uniform in [0, 1) with 24 bits (exactly representable in f32).
inline float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  return static_cast<float>(philox_words(seed, stream, index)[0] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller on two words of the same counter; computed in double so that
// every backend that follows this formula gets the same f32 after rounding.
double philox_normal(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace hap
