// Shape/dtype validation and device dispatch for causal GQA attention and the
// block attention of ring context parallelism.
#include "ops/attention.h"

#include <cmath>
#include <vector>

#include "backend/cpu/attention_block_cpu.h"
#include "backend/cpu/attention_cpu.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/attention_ops.h"
#endif
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

#if KESTREL_HAVE_CUDA
// The CUDA paths: cu_seqlens and prefix_of are read back (small) and checked as on the CPU.
Tensor host_copy(const Tensor& t) {
  Tensor h = Tensor::empty(t.shape(), t.dtype(), MemCategory::Other, Device::CPU);
  h.copy_from(t);
  return h;
}
cuda::AttnDims cuda_dims(const AttentionShape& s) {
  const cpu::AttnParams p = params(s);
  return {p.n_heads, p.n_kv_heads, p.head_dim, p.scale, p.v_head_dim};
}
void cuda_checks(const char* op, const Tensor& cu, int64_t T, const Tensor* prefix_of) {
  const Tensor hc = host_copy(cu);
  check_cu_seqlens(op, hc, T);
  if (prefix_of) {
    const Tensor hp = host_copy(*prefix_of);
    check_prefix_of(op, &hp, cu.size(0) - 1);
  }
}
void cuda_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, const AttentionShape& s,
                        Tensor& out, Tensor& lse, const Tensor* prefix_of) {
  cuda_checks("attention_fwd", cu, q.size(0), prefix_of);
  cuda::attention_fwd(q, k, v, cu, cuda_dims(s), out, lse, prefix_of);
}
void cuda_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, const Tensor& cu, const AttentionShape& s, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor* prefix_of) {
  cuda_checks("attention_bwd", cu, q.size(0), prefix_of);
  cuda::attention_bwd(q, k, v, out, lse, dout, cu, cuda_dims(s), dq, dk, dv, prefix_of);
}
#endif

constexpr detail::Kernels<decltype(cpu_attention_fwd)> kAttentionFwd{
    .cpu = cpu_attention_fwd KS_CUDA_KERNEL(cuda_attention_fwd)};
constexpr detail::Kernels<decltype(cpu_attention_bwd)> kAttentionBwd{
    .cpu = cpu_attention_bwd KS_CUDA_KERNEL(cuda_attention_bwd)};

// ---- Block attention ----

// Validates the AttentionShape and q, k, v of a block pairing; returns the
// number of sequences (cu_q and cu_k must agree on it).
int64_t check_block(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                    const AttentionShape& s) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads || s.v_head_dim < 0)
    KS_FAIL(op, ": bad AttentionShape n_heads=", s.n_heads, " n_kv_heads=", s.n_kv_heads, " head_dim=", s.head_dim,
            " v_head_dim=", s.v_head_dim, " (need positive values with n_heads divisible by n_kv_heads, v_head_dim "
            ">= 0; 0 = head_dim)");
  if (!(s.scale >= 0.f) || std::isinf(s.scale)) KS_FAIL(op, ": scale must be finite and >= 0 (0 = 1/sqrt(head_dim)), got ", s.scale);
  if (!q.defined() || q.dim() != 2 || !is_float(q))
    KS_FAIL(op, ": q must be f32 or bf16 [Tq, n_heads*head_dim], got ", q.defined() ? q.describe() : "undefined");
  if (!k.defined() || k.dim() != 2)
    KS_FAIL(op, ": k must be ", dtype_name(q.dtype()), " [Tk, n_kv_heads*head_dim], got ",
            k.defined() ? k.describe() : "undefined");
  const int64_t Tq = q.size(0), Tk = k.size(0);
  check_2d(op, "q", q, Tq, s.n_heads * s.head_dim, q.dtype());
  check_2d(op, "k", k, Tk, s.n_kv_heads * s.head_dim, q.dtype());
  check_2d(op, "v", v, Tk, s.n_kv_heads * s.value_dim(), q.dtype());
  // n < 0: any length >= 1.
  auto check_i32 = [&](const char* name, const Tensor& t, int64_t n, const char* what) {
    if (!t.defined() || t.dtype() != DType::I32 || t.dim() != 1 || (n >= 0 ? t.size(0) != n : t.size(0) < 1))
      KS_FAIL(op, ": AttentionBlock::", name, " must be i32 ", what, ", got ", t.defined() ? t.describe() : "undefined");
  };
  check_i32("cu_q", blk.cu_q, -1, "[n_seqs+1]");
  check_i32("cu_k", blk.cu_k, blk.cu_q.size(0), "[n_seqs+1] like cu_q (the same sequences)");
  // Positions of no rows may be left undefined.
  if (Tq > 0 || blk.q_pos.defined()) check_i32("q_pos", blk.q_pos, Tq, "[Tq] (one position per q row)");
  if (Tk > 0 || blk.k_pos.defined()) check_i32("k_pos", blk.k_pos, Tk, "[Tk] (one position per k/v row)");
  return blk.cu_q.size(0) - 1;
}

// An output or input of [rows, cols] in q's dtype or f32.
void check_2d_q_or_f32(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols, DType qd) {
  if (t.defined() && t.dim() == 2 && t.dtype() == DType::F32) return check_2d(op, name, t, rows, cols, DType::F32);
  check_2d(op, name, t, rows, cols, qd);
}

// The CPU path's check of the row ranges (read on the host).
void check_cu_rows(const char* op, const char* name, const int32_t* c, int64_t n, int64_t T) {
  if (c[0] != 0 || c[n] != T)
    KS_FAIL(op, ": AttentionBlock::", name, " must start at 0 and end at ", T, " (the rows), got [", c[0], " .. ",
            c[n], "]");
  for (int64_t b = 0; b < n; ++b)
    if (c[b + 1] < c[b])
      KS_FAIL(op, ": AttentionBlock::", name, " must be non-decreasing, got ", c[b], " then ", c[b + 1], " at ", b);
}

cpu::BlockRows block_rows(const char* op, const AttentionBlock& blk, int64_t n, int64_t Tq, int64_t Tk) {
  const int32_t* cq = blk.cu_q.data<int32_t>();
  const int32_t* ck = blk.cu_k.data<int32_t>();
  check_cu_rows(op, "cu_q", cq, n, Tq);
  check_cu_rows(op, "cu_k", ck, n, Tk);
  return {cq, ck, Tq > 0 ? blk.q_pos.data<int32_t>() : nullptr, Tk > 0 ? blk.k_pos.data<int32_t>() : nullptr, n};
}

void cpu_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, int64_t n,
                   const AttentionShape& s, Tensor& out, Tensor& lse) {
  const cpu::BlockRows rows = block_rows("attention_block_fwd", blk, n, q.size(0), k.size(0));
  cpu::attention_block_fwd(q, k, v, rows, params(s), out, lse);
}

void cpu_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const AttentionBlock& blk, int64_t n, const AttentionShape& s, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  const cpu::BlockRows rows = block_rows("attention_block_bwd", blk, n, q.size(0), k.size(0));
  cpu::attention_block_bwd(q, k, v, out, lse, dout, rows, params(s), dq, dk, dv);
}

#if KESTREL_HAVE_CUDA
// The CUDA paths: the row ranges are read back (small copies) for the CPU path's checks.
cuda::BlockMeta cuda_block_meta(const char* op, const AttentionBlock& blk, int64_t n, int64_t Tq, int64_t Tk) {
  const std::vector<int32_t> cq = blk.cu_q.to_host<int32_t>(), ck = blk.cu_k.to_host<int32_t>();
  check_cu_rows(op, "cu_q", cq.data(), n, Tq);
  check_cu_rows(op, "cu_k", ck.data(), n, Tk);
  return {&blk.cu_q, &blk.cu_k, &blk.q_pos, &blk.k_pos, n};
}
void cuda_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk, int64_t n,
                    const AttentionShape& s, Tensor& out, Tensor& lse) {
  const cuda::BlockMeta m = cuda_block_meta("attention_block_fwd", blk, n, q.size(0), k.size(0));
  cuda::attention_block_fwd(q, k, v, m, cuda_dims(s), out, lse);
}
void cuda_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& dout, const AttentionBlock& blk, int64_t n, const AttentionShape& s, Tensor& dq,
                    Tensor& dk, Tensor& dv) {
  const cuda::BlockMeta m = cuda_block_meta("attention_block_bwd", blk, n, q.size(0), k.size(0));
  cuda::attention_block_bwd(q, k, v, out, lse, dout, m, cuda_dims(s), dq, dk, dv);
}
#endif

constexpr detail::Kernels<decltype(cpu_block_fwd)> kBlockFwd{.cpu = cpu_block_fwd KS_CUDA_KERNEL(cuda_block_fwd)};
constexpr detail::Kernels<decltype(cpu::attention_merge)> kMerge{
    .cpu = cpu::attention_merge KS_CUDA_KERNEL(cuda::attention_merge)};
constexpr detail::Kernels<decltype(cpu_block_bwd)> kBlockBwd{.cpu = cpu_block_bwd KS_CUDA_KERNEL(cuda_block_bwd)};

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

void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                         const AttentionShape& s, Tensor& out, Tensor& lse) {
  const char* op = "attention_block_fwd";
  const int64_t n = check_block(op, q, k, v, blk, s);
  check_2d_q_or_f32(op, "out", out, q.size(0), s.n_heads * s.value_dim(), q.dtype());
  check_lse(op, lse, s, q.size(0));
  detail::dispatch(op, kBlockFwd, {&q, &k, &v, &blk.cu_q, &blk.cu_k, &blk.q_pos, &blk.k_pos, &out, &lse}, q, k, v,
                   blk, n, s, out, lse);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* op = "attention_merge";
  if (!lse.defined() || lse.dtype() != DType::F32 || lse.dim() != 2 || lse.size(0) < 1)
    KS_FAIL(op, ": lse must be f32 [n_heads, Tq], got ", lse.defined() ? lse.describe() : "undefined");
  const int64_t H = lse.size(0), Tq = lse.size(1);
  if (!out.defined() || out.dim() != 2 || !is_float(out) || out.size(0) != Tq || out.size(1) % H)
    KS_FAIL(op, ": out must be f32 or bf16 [Tq, n_heads*v_head_dim] = [", Tq, ", ", H, "*v_head_dim] (lse is ",
            lse.describe(), "), got ", out.defined() ? out.describe() : "undefined");
  if (!out_b.defined() || !is_float(out_b) || out_b.shape() != out.shape())
    KS_FAIL(op, ": out_b must be f32 or bf16 of out's shape ", shape_str(out.shape()), ", got ",
            out_b.defined() ? out_b.describe() : "undefined");
  if (!lse_b.defined() || lse_b.dtype() != DType::F32 || lse_b.shape() != lse.shape())
    KS_FAIL(op, ": lse_b must be f32 ", shape_str(lse.shape()), " like lse, got ",
            lse_b.defined() ? lse_b.describe() : "undefined");
  detail::dispatch(op, kMerge, {&out, &lse, &out_b, &lse_b}, out, lse, out_b, lse_b);
}

void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const AttentionBlock& blk, const AttentionShape& s, Tensor& dq,
                         Tensor& dk, Tensor& dv) {
  const char* op = "attention_block_bwd";
  const int64_t n = check_block(op, q, k, v, blk, s);
  const int64_t Tq = q.size(0), Tk = k.size(0);
  check_2d_q_or_f32(op, "out", out, Tq, s.n_heads * s.value_dim(), q.dtype());
  check_2d_q_or_f32(op, "dout", dout, Tq, s.n_heads * s.value_dim(), q.dtype());
  check_lse(op, lse, s, Tq);
  check_2d(op, "dq", dq, Tq, q.size(1), DType::F32);
  check_2d(op, "dk", dk, Tk, k.size(1), DType::F32);
  check_2d(op, "dv", dv, Tk, v.size(1), DType::F32);
  detail::dispatch(op, kBlockBwd,
                   {&q, &k, &v, &out, &lse, &dout, &blk.cu_q, &blk.cu_k, &blk.q_pos, &blk.k_pos, &dq, &dk, &dv}, q,
                   k, v, out, lse, dout, blk, n, s, dq, dk, dv);
}

}  // namespace kestrel::ops
