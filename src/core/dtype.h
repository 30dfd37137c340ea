// Element types of checkpoint tensors and their conversions to float32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tf {

enum class DType : uint8_t { kF32, kBF16, kF16 };

inline size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

// bf16 is the top half of an IEEE float32.
inline float bf16_to_f32(uint16_t h) {
  return std::bit_cast<float>(uint32_t{h} << 16);
}
// Round to nearest even (NaN stays NaN), as PyTorch's float -> bfloat16 cast.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float f16_to_f32(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}

}  // namespace tf
