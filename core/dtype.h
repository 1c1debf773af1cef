// Element types. F32 is the training type, BF16 a storage type (kernels compute in f32),
// F64 exists for gradcheck, I64 for indices and token ids, U8 for boolean masks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace hap {

enum class DType : uint8_t { F32 = 0, BF16 = 1, F64 = 2, I64 = 3, U8 = 4 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F64:
      return 8;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  HAP_ASSERT(false, "unknown dtype");
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F64:
      return "f64";
    case DType::I64:
      return "i64";
    case DType::U8:
      return "u8";
  }
  return "?";
}

inline bool is_floating(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F64; }

// bfloat16: the upper 16 bits of an IEEE f32, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a quiet NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>((u + rounding) >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace hap
