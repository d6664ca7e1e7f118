// Argument checks shared by the ops dispatch layer (device dispatch: ops/dispatch.h). Each failure names the op,
// the argument and what it expected, e.g.
//   "ops::linear_fwd: w must be [out, in] = [*, 64], got f32[128, 32]".
#pragma once
#include <initializer_list>
#include <string>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace kestrel::ops::detail {

inline void check_defined(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) KS_FAIL("ops::", op, ": ", name, " is an undefined tensor");
}

// f32 or bf16: the floating dtypes the dense kernels implement.
inline void check_float(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  if (t.dtype() != DType::F32 && t.dtype() != DType::BF16)
    KS_FAIL("ops::", op, ": ", name, " must be f32 or bf16, got ", t.describe());
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
  check_defined(op, name, t);
  if (t.dtype() != want) KS_FAIL("ops::", op, ": ", name, " must be ", dtype_name(want), ", got ", t.describe());
}

inline void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                             const Tensor& ref) {
  if (t.dtype() != ref.dtype())
    KS_FAIL("ops::", op, ": ", name, " must have the dtype of ", ref_name, " (", dtype_name(ref.dtype()), "), got ",
            t.describe());
}

// want: expected sizes, -1 for "any".
inline void check_shape(const char* op, const char* name, const Tensor& t, std::initializer_list<int64_t> want) {
  check_defined(op, name, t);
  bool ok = t.dim() == int64_t(want.size());
  int64_t i = 0;
  for (int64_t w : want) {
    if (ok && w >= 0 && t.shape()[size_t(i)] != w) ok = false;
    ++i;
  }
  if (!ok) {
    std::string s = "[";
    i = 0;
    for (int64_t w : want) s += (i++ ? ", " : "") + (w < 0 ? std::string("*") : std::to_string(w));
    KS_FAIL("ops::", op, ": ", name, " must have shape ", s, "], got ", t.describe());
  }
}

// Same storage bytes (for ops that allow in-place use).
inline bool same_buffer(const Tensor& a, const Tensor& b) { return a.defined() && b.defined() && a.raw() == b.raw(); }

// Overlapping but not identical buffers break elementwise in-place kernels.
inline void check_no_partial_alias(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                                   const Tensor& b) {
  if (!a.defined() || !b.defined()) return;
  const char* a0 = static_cast<const char*>(a.raw());
  const char* b0 = static_cast<const char*>(b.raw());
  const bool overlap = a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
  if (overlap && !(a0 == b0 && a.nbytes() == b.nbytes() && a.dtype() == b.dtype()))
    KS_FAIL("ops::", op, ": ", a_name, " and ", b_name, " overlap without being the same buffer");
}

}  // namespace kestrel::ops::detail
