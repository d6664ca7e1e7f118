#include "io/convert.h"

#include <cstring>

namespace kestrel::io {

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

inline float load_f(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(p)[i]);
    case DType::I64: return float(static_cast<const int64_t*>(p)[i]);
    case DType::U8: return float(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

inline int64_t load_i(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<const int64_t*>(p)[i];
    case DType::U8: return static_cast<const uint8_t*>(p)[i];
    default: return int64_t(load_f(p, t, i));
  }
}

inline void store(void* p, DType t, int64_t i, float f, int64_t v, bool from_int) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = f; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(f); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = float_to_f16(f); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = from_int ? int32_t(v) : int32_t(f); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = from_int ? v : int64_t(f); break;
    case DType::U8: static_cast<uint8_t*>(p)[i] = from_int ? uint8_t(v) : uint8_t(f); break;
  }
}

}  // namespace

void convert_elements(const void* src, DType sdt, void* dst, DType ddt, int64_t n) {
  if (n <= 0) return;
  if (sdt == ddt) {
    std::memmove(dst, src, size_t(n) * dtype_size(sdt));
    return;
  }
  const bool from_int = !is_float(sdt);
  // Static partition: each element is converted independently, so the result
  // does not depend on the thread count.
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    if (from_int) store(dst, ddt, i, float(load_i(src, sdt, i)), load_i(src, sdt, i), true);
    else store(dst, ddt, i, load_f(src, sdt, i), 0, false);
  }
}

}  // namespace kestrel::io
