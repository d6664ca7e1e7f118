// Shape/dtype validation and device dispatch for causal GQA attention.
#include "ops/attention.h"

#include <cmath>

#include "backend/cpu/attention_cpu.h"
#include "ops/dispatch.h"

namespace kestrel::ops {
namespace {

bool is_float(const Tensor& t) { return t.dtype() == DType::F32 || t.dtype() == DType::BF16; }

// Checks one [rows, cols] activation of the op's dtype.
void check_2d(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols, DType dtype) {
  if (!t.defined()) KS_FAIL(op, ": ", name, " is undefined");
  if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols || t.dtype() != dtype)
    KS_FAIL(op, ": ", name, " must be ", dtype_name(dtype), "[", rows, ", ", cols, "], got ", t.describe());
}

// Validates the shapes and dtypes the kernels assume; returns the number of sequences.
int64_t check_common(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                     const AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads)
    KS_FAIL(op, ": bad AttentionShape n_heads=", s.n_heads, " n_kv_heads=", s.n_kv_heads, " head_dim=", s.head_dim,
            " (need positive values with n_heads divisible by n_kv_heads; check num_attention_heads and "
            "num_key_value_heads in config.json)");
  if (s.v_head_dim < 0)
    KS_FAIL(op, ": bad AttentionShape v_head_dim=", s.v_head_dim, " (0 = head_dim, else the value head width, e.g. "
            "v_head_dim in config.json)");
  if (!(s.scale >= 0.f) || std::isinf(s.scale)) KS_FAIL(op, ": scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ", s.scale);
  if (!q.defined() || q.dim() != 2 || !is_float(q))
    KS_FAIL(op, ": q must be f32 or bf16 [T, n_heads*head_dim], got ", q.defined() ? q.describe() : "undefined");
  const int64_t T = q.size(0);
  check_2d(op, "q", q, T, s.n_heads * s.head_dim, q.dtype());
  check_2d(op, "k", k, T, s.n_kv_heads * s.head_dim, q.dtype());
  check_2d(op, "v", v, T, s.n_kv_heads * s.value_dim(), q.dtype());
  if (!cu.defined() || cu.dtype() != DType::I32 || cu.dim() != 1 || cu.size(0) < 1)
    KS_FAIL(op, ": cu_seqlens must be i32 [n_seqs+1], got ", cu.defined() ? cu.describe() : "undefined");
  return cu.size(0) - 1;
}

// The CPU path's check of the cu_seqlens values (read on the host).
void check_cu_seqlens(const char* op, const Tensor& cu, int64_t T) {
  const int32_t* c = cu.data<int32_t>();
  const int64_t n = cu.size(0) - 1;
  if (c[0] != 0 || c[n] != T)
    KS_FAIL(op, ": cu_seqlens must start at 0 and end at T=", T, ", got [", c[0], " .. ", c[n], "]");
  for (int64_t b = 0; b < n; ++b)
    if (c[b + 1] < c[b]) KS_FAIL(op, ": cu_seqlens must be non-decreasing, got ", c[b], " then ", c[b + 1], " at ", b);
}

// Validates the shape of prefix_of (see attention.h).
void check_prefix_shape(const char* op, const Tensor* prefix_of, int64_t n) {
  if (!prefix_of) return;
  const Tensor& t = *prefix_of;
  if (!t.defined() || t.dtype() != DType::I32 || t.dim() != 1 || t.size(0) != n)
    KS_FAIL(op, ": prefix_of must be i32 [n_seqs] = [", n, "] (one entry per sequence of cu_seqlens), got ",
            t.defined() ? t.describe() : "undefined");
}

// The CPU path's check of the prefix_of values; returns its data, or null when absent.
const int32_t* check_prefix_of(const char* op, const Tensor* prefix_of, int64_t n) {
  if (!prefix_of) return nullptr;
  const int32_t* p = prefix_of->data<int32_t>();
  for (int64_t b = 0; b < n; ++b) {
    if (p[b] == -1) continue;
    if (p[b] < 0 || p[b] >= b)
      KS_FAIL(op, ": prefix_of[", b, "] = ", p[b], ": must be -1 (no prefix) or the index of an earlier sequence (0 <= p < ",
              b, ")");
    if (p[p[b]] != -1)
      KS_FAIL(op, ": prefix_of[", b, "] = ", p[b], " but sequence ", p[b], " itself continues sequence ", p[p[b]],
              ": only one level of prefix is supported (point ", b, " at the root sequence and give it the positions "
              "that follow)");
  }
  return p;
}

cpu::AttnParams params(const AttentionShape& s) {
  return {s.n_heads, s.n_kv_heads, s.head_dim, s.scale > 0.f ? s.scale : float(1.0 / std::sqrt(double(s.head_dim))),
          s.value_dim()};
}

void check_lse(const char* op, const Tensor& lse, const AttentionShape& s, int64_t T) {
  if (!lse.defined() || lse.dtype() != DType::F32 || lse.shape() != Shape{s.n_heads, T})
    KS_FAIL(op, ": lse must be f32 [n_heads, T] = [", s.n_heads, ", ", T, "], got ",
            lse.defined() ? lse.describe() : "undefined");
}

void cpu_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, const AttentionShape& s,
                       Tensor& out, Tensor& lse, const Tensor* prefix_of) {
  const int64_t n = cu.size(0) - 1;
  check_cu_seqlens("attention_fwd", cu, q.size(0));
  const int32_t* pre = check_prefix_of("attention_fwd", prefix_of, n);
  cpu::attention_fwd(q, k, v, cu.data<int32_t>(), n, params(s), out, lse, pre);
}

void cpu_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                       const Tensor& dout, const Tensor& cu, const AttentionShape& s, Tensor& dq, Tensor& dk,
                       Tensor& dv, const Tensor* prefix_of) {
  const int64_t n = cu.size(0) - 1;
  check_cu_seqlens("attention_bwd", cu, q.size(0));
  const int32_t* pre = check_prefix_of("attention_bwd", prefix_of, n);
  cpu::attention_bwd(q, k, v, out, lse, dout, cu.data<int32_t>(), n, params(s), dq, dk, dv, pre);
}

constexpr detail::Kernels<decltype(cpu_attention_fwd)> kAttentionFwd{.cpu = cpu_attention_fwd};
constexpr detail::Kernels<decltype(cpu_attention_bwd)> kAttentionBwd{.cpu = cpu_attention_bwd};

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                   const AttentionShape& s, Tensor& out, Tensor& lse, const Tensor* prefix_of) {
  const int64_t n = check_common("attention_fwd", q, k, v, cu_seqlens, s);
  check_2d("attention_fwd", "out", out, q.size(0), s.n_heads * s.value_dim(), q.dtype());
  check_lse("attention_fwd", lse, s, q.size(0));
  check_prefix_shape("attention_fwd", prefix_of, n);
  detail::dispatch("attention_fwd", kAttentionFwd, {&q, &k, &v, &cu_seqlens, &out, &lse, prefix_of}, q, k, v,
                   cu_seqlens, s, out, lse, prefix_of);
}

void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const Tensor& cu_seqlens, const AttentionShape& s, Tensor& dq, Tensor& dk,
                   Tensor& dv, const Tensor* prefix_of) {
  const int64_t n = check_common("attention_bwd", q, k, v, cu_seqlens, s);
  check_2d("attention_bwd", "out", out, q.size(0), s.n_heads * s.value_dim(), q.dtype());
  // Gradients may be f32 while q/k/v are bf16 (bf16 mode keeps activation grads in f32).
  check_2d("attention_bwd", "dout", dout, q.size(0), out.size(1), dout.dtype());
  check_2d("attention_bwd", "dq", dq, q.size(0), q.size(1), dout.dtype());
  check_2d("attention_bwd", "dk", dk, k.size(0), k.size(1), dout.dtype());
  check_2d("attention_bwd", "dv", dv, v.size(0), v.size(1), dout.dtype());
  if (!is_float(dout)) KS_FAIL("ops::attention_bwd: dout must be f32 or bf16, got ", dout.describe());
  check_lse("attention_bwd", lse, s, q.size(0));
  check_prefix_shape("attention_bwd", prefix_of, n);
  detail::dispatch("attention_bwd", kAttentionBwd,
                   {&q, &k, &v, &out, &lse, &dout, &cu_seqlens, &dq, &dk, &dv, prefix_of}, q, k, v, out, lse, dout,
                   cu_seqlens, s, dq, dk, dv, prefix_of);
}

}  // namespace kestrel::ops
