/// Storage types. Compute is fp32 unless a mixed-precision policy says otherwise. @file
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace sw {

enum class DType : uint8_t { F32, BF16, F16 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
const char* dtype_name(DType t);             ///< "f32", "bf16", "f16"
DType dtype_from_name(const std::string& s);  ///< accepts f32/fp32/float32, bf16/bfloat16, f16/fp16/float16; throws sw::Error

/// Round-to-nearest-even fp32 -> bf16 (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace sw
// ---- Reference documentation (Doxygen): the members above without a comment of their own.

/// @enum sw::DType
/// An element type in memory: fp32, bfloat16 or IEEE half.

/// @fn sw::dtype_size(DType t)
/// Bytes per element.

/// @fn sw::bf16_to_f32(uint16_t h)
/// The bfloat16 `h` as a float (exact).

/// @fn sw::f32_to_f16(float f)
/// Round-to-nearest-even fp32 -> IEEE half (overflow gives +-inf, NaN stays NaN).

/// @fn sw::f16_to_f32(uint16_t h)
/// The IEEE half `h` as a float (exact).
