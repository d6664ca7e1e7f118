// CPU kernels of ops/reuse_fp32_ops.h: the f32 master held as its bf16 model
// copy (the high half) plus a 16-bit residual (the low half), MindSpeed's
// reuse_fp32_param (core/memory/reuse_param), in its exact
// round-to-nearest-even form.
//
// The split of one f32 bit pattern u into (b, r, flag):
//   b    = float_to_bf16(u): the plain mixed-precision copy (RNE; a NaN keeps
//          its sign and payload's high bits and is made quiet, | 0x40),
//   r    = u & 0xffff: the low half,
//   flag = the one bit (b, r) cannot tell: for a finite or infinite u, "b was
//          rounded up from an exact tie" (r == 0x8000 with an odd high half;
//          any other r says itself whether b was rounded up: r > 0x8000 up,
//          r < 0x8000 down); for a NaN, "the quiet bit was forced on".
// Recovery is exact for every one of the 2^32 patterns (ties, subnormals,
// +-0, the largest finite whose copy rounds to +-Inf, +-Inf, NaN payloads):
//   b not NaN: hi = b - (r > 0x8000 || (r == 0x8000 && flag)),  u = hi << 16 | r
//   b NaN:     hi = flag ? b & ~0x40 : b,                        u = hi << 16 | r
// One extra bit is unavoidable: RNE sends 65537 f32 patterns to each even
// bf16 value (both neighbouring ties) and 65535 to each odd one, so a 16-bit
// residual alone cannot invert it. MindSpeed keeps that bit in the sign of
// exp_avg_sq (v >= 0 always, a NaN's sign aside); so does this file: the
// flag is bit 31 of the element's v, set only where needed, and every kernel
// that reads v clears it first.
//
// The fused step recovers a chunk of masters into a stack buffer, runs
// optim_detail::adamw_loop (the plain path's arithmetic, the same code) on it
// and splits the results back, so reuse cannot change any number of the update.
#pragma once
#include <algorithm>
#include <bit>
#include <cstdint>

#include "backend/adamw_scalars.h"
#include "backend/cpu/optim_kernels.h"
#include "core/dtype.h"
#include "core/tensor.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace kestrel::cpu {

namespace reuse_detail {
constexpr uint32_t kFlag = 0x80000000u;  // bit 31 of exp_avg_sq: the split's extra bit
// f32 data read as bits: may_alias, because the same elements are also read and written as float.
using bits32 = uint32_t __attribute__((may_alias));

inline bool bf16_is_nan(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }
}  // namespace reuse_detail

// f32 bits u -> (bf16 copy, residual); returns the flag. b equals float_to_bf16.
// Branch-free (selects, no jumps) so the loops around it vectorize.
inline bool reuse_fp32_split_bits(uint32_t u, uint16_t* b, uint16_t* r) {
  const uint32_t lo = u & 0xffffu, hi = u >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rne = (u + 0x7fffu + (hi & 1u)) >> 16;  // float_to_bf16 of a non-NaN
  const uint32_t copy = nan ? (hi | 0x40u) : rne;        // a NaN is quieted as float_to_bf16 does
  *r = uint16_t(lo);
  *b = uint16_t(copy);
  // NaN: the quiet bit was forced on; otherwise: a tie rounded up (to even).
  return nan ? (hi & 0x40u) == 0 : (lo == 0x8000u) & (copy != hi);
}

// (bf16 copy, residual, flag) -> the f32 bits split produced them from.
inline uint32_t reuse_fp32_recover_bits(uint16_t b, uint16_t r, bool flag) {
  const uint32_t bb = b, rr = r, f = flag ? 1u : 0u;
  const uint32_t up = uint32_t(rr > 0x8000u) | (uint32_t(rr == 0x8000u) & f);
  const uint32_t hi = reuse_detail::bf16_is_nan(b) ? (bb & ~(f << 6)) : bb - up;
  return (hi << 16) | rr;
}

// master: f32 [n] -> copy: bf16 [n], residual: 16-bit [n], flags into bit 31 of v: f32 [n] (the other bits kept).
inline void reuse_fp32_split(const Tensor& master, Tensor& copy, Tensor& residual, Tensor& v) {
  const auto* w = static_cast<const reuse_detail::bits32*>(master.raw());
  auto* b = static_cast<uint16_t*>(copy.raw());
  auto* r = static_cast<uint16_t*>(residual.raw());
  auto* vb = static_cast<reuse_detail::bits32*>(v.raw());
  const int64_t n = master.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t k = 0; k < n; ++k) {
    const bool f = reuse_fp32_split_bits(w[k], &b[k], &r[k]);
    vb[k] = (vb[k] & ~reuse_detail::kFlag) | (f ? reuse_detail::kFlag : 0u);
  }
}

// (copy, residual, flags of v) -> master: f32 [n]; v_clean (nullptr: none): f32 [n], v without the flags.
inline void reuse_fp32_recover(const Tensor& copy, const Tensor& residual, const Tensor& v, Tensor& master,
                               Tensor* v_clean) {
  const auto* b = static_cast<const uint16_t*>(copy.raw());
  const auto* r = static_cast<const uint16_t*>(residual.raw());
  const auto* vb = static_cast<const reuse_detail::bits32*>(v.raw());
  auto* w = static_cast<reuse_detail::bits32*>(master.raw());
  auto* vc = v_clean ? static_cast<reuse_detail::bits32*>(v_clean->raw()) : nullptr;
  const int64_t n = copy.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t k = 0; k < n; ++k) {
    w[k] = reuse_fp32_recover_bits(b[k], r[k], (vb[k] & reuse_detail::kFlag) != 0);
    if (vc) vc[k] = vb[k] & ~reuse_detail::kFlag;
  }
}

// One AdamW step on masters held as (copy, residual, flags in v): copy bf16
// [n], residual 16-bit [n], m, v, grad f32 [n]. Bit-identical to
// adamw_step(master, m, v, grad, &copy) on the recovered master.
inline void adamw_step_reuse_fp32(const AdamWScalars& s, Tensor& copy, Tensor& residual, Tensor& exp_avg,
                                  Tensor& exp_avg_sq, const Tensor& grad) {
  // 32 KiB of recovered masters on the stack per thread; below adamw_loop's
  // threading threshold, so its loop runs serially inside one chunk.
  constexpr int64_t kChunk = 8192;
  auto* b = static_cast<uint16_t*>(copy.raw());
  auto* r = static_cast<uint16_t*>(residual.raw());
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = copy.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, len = std::min(n, lo + kChunk) - lo;
    float w[kChunk];
    uint16_t* bc = b + lo;
    uint16_t* rc = r + lo;
    auto* vc = reinterpret_cast<reuse_detail::bits32*>(v + lo);
    for (int64_t k = 0; k < len; ++k) {
      w[k] = std::bit_cast<float>(reuse_fp32_recover_bits(bc[k], rc[k], (vc[k] & reuse_detail::kFlag) != 0));
      vc[k] &= ~reuse_detail::kFlag;  // adamw_loop reads the plain v
    }
    optim_detail::adamw_loop(s, w, m + lo, v + lo, g + lo, len, [bc, rc, vc](int64_t k, float x) {
      vc[k] |= reuse_fp32_split_bits(std::bit_cast<uint32_t>(x), &bc[k], &rc[k]) ? reuse_detail::kFlag : 0u;
    });
  }
}

}  // namespace kestrel::cpu

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
