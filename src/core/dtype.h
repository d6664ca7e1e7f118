// Element types and the conversions between them. bf16/f16 are stored as raw
// uint16 bit patterns; arithmetic always happens in float or double.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kestrel {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}
const char* dtype_name(DType t);           // "f32", "bf16", ...
bool parse_dtype(std::string_view s, DType* out);  // accepts f32/float32/fp32, bf16/bfloat16, ...

struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };

inline float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, as PyTorch does; NaN stays NaN (quiet).
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Maps C++ element types to DType for typed data access.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::U8; };

}  // namespace kestrel
