#include "core/dtype.h"

#include <cmath>

namespace kestrel {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  struct { std::string_view name; DType t; } table[] = {
      {"f32", DType::F32}, {"fp32", DType::F32}, {"float32", DType::F32}, {"float", DType::F32},
      {"bf16", DType::BF16}, {"bfloat16", DType::BF16},
      {"f16", DType::F16}, {"fp16", DType::F16}, {"float16", DType::F16}, {"half", DType::F16},
      {"i32", DType::I32}, {"int32", DType::I32}, {"i64", DType::I64}, {"int64", DType::I64},
      {"u8", DType::U8}, {"uint8", DType::U8}};
  for (auto& e : table)
    if (e.name == s) { *out = e.t; return true; }
  return false;
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      float f = std::ldexp(float(mant), -24);
      std::memcpy(&u, &f, 4);
      u |= sign;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow -> inf (RNE threshold 65520)
  if (absu < 0x38800000u) {  // subnormal or zero in f16
    float a;
    std::memcpy(&a, &absu, 4);
    // scale so that one f16 subnormal ulp (2^-24) is 1.0, then round to nearest even
    float scaled = a * 16777216.0f;
    uint32_t m = uint32_t(std::nearbyint(scaled));
    return uint16_t(sign | m);
  }
  uint32_t exp = (absu >> 23) - 112;
  uint32_t mant = absu & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return uint16_t(sign | h);
}

}  // namespace kestrel
