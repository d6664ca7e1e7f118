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

// The paged ops' metadata (ops/paged_attention.h, ops/mla.h), read on the
// host once per call so that a bad table fails with a message instead of a
// read out of bounds: cu_q [B+1] from 0 to T, non-decreasing; each context
// seq_lens[b] at least its query rows and within block_tables' width
// [B, max_blocks]; every block a sequence with query rows reads is a block id.
inline void check_paged_tables(const char* op, const int32_t* cu, const int32_t* sl, const int32_t* bt, int64_t B,
                               int64_t T, int64_t max_blocks, int64_t num_blocks, int64_t block_size) {
  if (cu[0] != 0 || cu[B] != T)
    KS_FAIL("ops::", op, ": cu_q must start at 0 and end at T=", T, ", got [", cu[0], " .. ", cu[B], "]");
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nq = cu[b + 1] - cu[b];
    if (nq < 0) KS_FAIL("ops::", op, ": cu_q must be non-decreasing, got ", cu[b], " then ", cu[b + 1]);
    if (sl[b] < nq) KS_FAIL("ops::", op, ": sequence ", b, " has ", nq, " query rows but a context of ", sl[b]);
    const int64_t need = (int64_t(sl[b]) + block_size - 1) / block_size;
    if (need > max_blocks)
      KS_FAIL("ops::", op, ": sequence ", b, " needs ", need, " blocks, block_tables has ", max_blocks);
    if (nq == 0) continue;
    for (int64_t i = 0; i < need; ++i)
      if (bt[b * max_blocks + i] < 0 || bt[b * max_blocks + i] >= num_blocks)
        KS_FAIL("ops::", op, ": block_tables[", b, ", ", i, "] = ", bt[b * max_blocks + i], " is not a block id (",
                num_blocks, " blocks)");
  }
}

// Cache slots of T new rows: each in [0, n_slots), or -1 (vLLM's PAD_SLOT_ID: the row is skipped).
inline void check_slots(const char* op, const int32_t* slots, int64_t T, int64_t n_slots) {
  for (int64_t t = 0; t < T; ++t)
    if (slots[t] < -1 || slots[t] >= n_slots)
      KS_FAIL("ops::", op, ": slot ", slots[t], " of row ", t, " is outside the cache (", n_slots,
              " slots; -1 skips a row)");
}

}  // namespace kestrel::ops::detail
