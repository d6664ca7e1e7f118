// Element conversion between dtypes for weight loading and saving (internal
// to io). Floats convert through f32 with round-to-nearest-even; integers
// convert through int64; mixed int/float converts through f32.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace kestrel::io {

// dst[i] = convert(src[i]) for i < n; src and dst must not overlap unless equal dtypes.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace kestrel::io
