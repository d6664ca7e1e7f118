// Validation and device dispatch of the MLA ops (ops/mla.h). Index checks
// (slots, block ids, context lengths) run here once per call, on the host
// copies of the metadata, so a bad block table fails with a message instead
// of reading out of bounds.
#include "ops/mla.h"

#include <cmath>

#include "backend/cpu/mla_cpu.h"
#if KESTREL_HAVE_CUDA
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/mla_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {
namespace {

using namespace detail;

void check_mla_shape(const char* op, const MlaShape& s) {
  if (s.n_heads <= 0 || s.kv_lora_rank <= 0 || s.qk_nope_head_dim <= 0 || s.qk_rope_head_dim <= 0 ||
      s.v_head_dim <= 0)
    KS_FAIL("ops::", op, ": bad MlaShape n_heads=", s.n_heads, " kv_lora_rank=", s.kv_lora_rank,
            " qk_nope_head_dim=", s.qk_nope_head_dim, " qk_rope_head_dim=", s.qk_rope_head_dim,
            " v_head_dim=", s.v_head_dim, " (all must be positive; check config.json)");
  if (!(s.scale >= 0.f) || std::isinf(s.scale))
    KS_FAIL("ops::", op, ": scale must be finite and >= 0 (0 = 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)), got ",
            s.scale);
}

cpu::MlaParams params(const MlaShape& s, int64_t block_size = 0, int64_t max_blocks = 0) {
  const double qk = double(s.qk_nope_head_dim + s.qk_rope_head_dim);
  return {s.n_heads,  s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim,
          s.scale > 0.f ? s.scale : float(1.0 / std::sqrt(qk)), block_size, max_blocks};
}

// kv_b_proj.weight [H*(nope+v), kv_lora].
void check_kv_b(const char* op, const Tensor& kv_b, const MlaShape& s) {
  check_float(op, "kv_b", kv_b);
  check_shape(op, "kv_b", kv_b, {s.n_heads * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank});
}

// out is written while in is read: they must not share memory.
void check_disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name, const Tensor& in) {
  check_no_partial_alias(op, out_name, out, in_name, in);
  if (same_buffer(out, in)) KS_FAIL("ops::", op, ": ", out_name, " must not alias ", in_name);
}

// [num_blocks, block_size, width] of the given dtype.
void check_cache(const char* op, const Tensor& cache, DType dt, int64_t width) {
  check_defined(op, "cache", cache);
  if (cache.dim() != 3 || cache.dtype() != dt || (width >= 0 && cache.size(2) != width))
    KS_FAIL("ops::", op, ": cache must be ", dtype_name(dt), "[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim",
            width >= 0 ? " = " + std::to_string(width) : std::string(), "], got ", cache.describe());
}

void cpu_paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache) {
  const int64_t T = c_kv.size(0), n_slots = cache.size(0) * cache.size(1);
  const int32_t* slots = slot_mapping.data<int32_t>();
  check_slots("paged_latent_write", slots, T, n_slots);
  cpu::paged_latent_write(c_kv, k_pe, slots, cache);
}

void cpu_paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                    const Tensor& cu_q, const Tensor& seq_lens, const MlaShape& s, Tensor& o_lat) {
  const char* op = "paged_latent_attention_fwd";
  const int64_t T = q_lat.size(0), B = cu_q.size(0) - 1;
  const int64_t num_blocks = cache.size(0), bs = cache.size(1), max_blocks = block_tables.size(1);
  const int32_t* cu = cu_q.data<int32_t>();
  const int32_t* sl = seq_lens.data<int32_t>();
  const int32_t* bt = block_tables.data<int32_t>();
  check_paged_tables(op, cu, sl, bt, B, T, max_blocks, num_blocks, bs);
  cpu::paged_latent_attention_fwd(q_lat, cache, bt, cu, sl, B, params(s, bs, max_blocks), o_lat);
}

void cpu_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaShape& s, Tensor& q_lat) {
  cpu::mla_absorb_q(q, kv_b, params(s), q_lat);
}

void cpu_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaShape& s, Tensor& o) {
  cpu::mla_absorb_out(o_lat, kv_b, params(s), o);
}

#if KESTREL_HAVE_CUDA
// The CUDA paths: the metadata is read back (small copies) for the CPU path's checks.
cuda::MlaArgs cuda_args(const MlaShape& s) {
  const cpu::MlaParams p = params(s);
  return {p.n_heads, p.kv_lora_rank, p.qk_nope_head_dim, p.qk_rope_head_dim, p.v_head_dim, p.scale};
}
void cuda_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaShape& s, Tensor& q_lat) {
  cuda::mla_absorb_q(q, kv_b, cuda_args(s), q_lat);
}
void cuda_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaShape& s, Tensor& o) {
  cuda::mla_absorb_out(o_lat, kv_b, cuda_args(s), o);
}
// Not while a CUDA graph captures (ops/paged_attention.cpp's reason): the graph's owner checks.
void cuda_paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache) {
  if (!cuda::capturing()) {
    const std::vector<int32_t> slots = slot_mapping.to_host<int32_t>();
    check_slots("paged_latent_write", slots.data(), c_kv.size(0), cache.size(0) * cache.size(1));
  }
  cuda::paged_latent_write(c_kv, k_pe, slot_mapping, cache);
}
void cuda_paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                     const Tensor& cu_q, const Tensor& seq_lens, const MlaShape& s, Tensor& o_lat) {
  const int64_t T = q_lat.size(0), B = cu_q.size(0) - 1;
  if (!cuda::capturing()) {
    const std::vector<int32_t> cu = cu_q.to_host<int32_t>(), sl = seq_lens.to_host<int32_t>(),
                               bt = block_tables.to_host<int32_t>();
    check_paged_tables("paged_latent_attention_fwd", cu.data(), sl.data(), bt.data(), B, T, block_tables.size(1),
                       cache.size(0), cache.size(1));
  }
  cuda::paged_latent_attention_fwd(q_lat, cache, block_tables, cu_q, seq_lens, cuda_args(s), o_lat);
}
#endif

constexpr Kernels<decltype(cpu_absorb_q)> kAbsorbQ{.cpu = cpu_absorb_q KS_CUDA_KERNEL(cuda_absorb_q)};
constexpr Kernels<decltype(cpu_absorb_out)> kAbsorbOut{.cpu = cpu_absorb_out KS_CUDA_KERNEL(cuda_absorb_out)};
constexpr Kernels<decltype(cpu_paged_latent_write)> kLatentWrite{
    .cpu = cpu_paged_latent_write KS_CUDA_KERNEL(cuda_paged_latent_write)};
constexpr Kernels<decltype(cpu_paged_latent_attention_fwd)> kLatentAttention{
    .cpu = cpu_paged_latent_attention_fwd KS_CUDA_KERNEL(cuda_paged_latent_attention_fwd)};

}  // namespace

void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaShape& s, Tensor& q_lat) {
  const char* op = "mla_absorb_q";
  check_mla_shape(op, s);
  check_float(op, "q", q);
  check_float(op, "q_lat", q_lat);
  const int64_t T = q.dim() == 2 ? q.size(0) : -1;
  check_shape(op, "q", q, {T, s.n_heads * (s.qk_nope_head_dim + s.qk_rope_head_dim)});
  check_kv_b(op, kv_b, s);
  check_shape(op, "q_lat", q_lat, {T, s.n_heads * s.latent_dim()});
  check_disjoint(op, "q_lat", q_lat, "q", q);
  check_disjoint(op, "q_lat", q_lat, "kv_b", kv_b);
  dispatch(op, kAbsorbQ, {&q, &kv_b, &q_lat}, q, kv_b, s, q_lat);
}

void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaShape& s, Tensor& o) {
  const char* op = "mla_absorb_out";
  check_mla_shape(op, s);
  check_float(op, "o_lat", o_lat);
  check_float(op, "o", o);
  const int64_t T = o_lat.dim() == 2 ? o_lat.size(0) : -1;
  check_shape(op, "o_lat", o_lat, {T, s.n_heads * s.kv_lora_rank});
  check_kv_b(op, kv_b, s);
  check_shape(op, "o", o, {T, s.n_heads * s.v_head_dim});
  check_disjoint(op, "o", o, "o_lat", o_lat);
  check_disjoint(op, "o", o, "kv_b", kv_b);
  dispatch(op, kAbsorbOut, {&o_lat, &kv_b, &o}, o_lat, kv_b, s, o);
}

void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache) {
  const char* op = "paged_latent_write";
  check_float(op, "c_kv", c_kv);
  check_shape(op, "c_kv", c_kv, {-1, -1});
  const int64_t T = c_kv.size(0), L = c_kv.size(1);
  check_cache(op, cache, c_kv.dtype(), -1);
  if (cache.size(2) <= L)
    KS_FAIL("ops::", op, ": cache rows of ", cache.size(2), " values leave no room for k_pe after c_kv's ", L,
            " (cache must be [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim], got ", cache.describe(), ")");
  check_shape(op, "k_pe", k_pe, {T, cache.size(2) - L});
  check_same_dtype(op, "k_pe", k_pe, "c_kv", c_kv);
  check_dtype(op, "slot_mapping", slot_mapping, DType::I32);
  check_shape(op, "slot_mapping", slot_mapping, {T});
  check_disjoint(op, "cache", cache, "c_kv", c_kv);
  check_disjoint(op, "cache", cache, "k_pe", k_pe);
  dispatch(op, kLatentWrite, {&c_kv, &k_pe, &slot_mapping, &cache}, c_kv, k_pe, slot_mapping, cache);
}

void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                const Tensor& cu_q, const Tensor& seq_lens, const MlaShape& s, Tensor& o_lat) {
  const char* op = "paged_latent_attention_fwd";
  check_mla_shape(op, s);
  check_float(op, "q_lat", q_lat);
  const int64_t T = q_lat.dim() == 2 ? q_lat.size(0) : -1;
  check_shape(op, "q_lat", q_lat, {T, s.n_heads * s.latent_dim()});
  check_shape(op, "o_lat", o_lat, {T, s.n_heads * s.kv_lora_rank});
  check_same_dtype(op, "o_lat", o_lat, "q_lat", q_lat);
  check_cache(op, cache, q_lat.dtype(), s.latent_dim());
  check_dtype(op, "cu_q", cu_q, DType::I32);
  const int64_t B = cu_q.dim() == 1 ? cu_q.size(0) - 1 : -1;
  if (B < 0) KS_FAIL("ops::", op, ": cu_q must be i32 [B+1], got ", cu_q.describe());
  check_dtype(op, "seq_lens", seq_lens, DType::I32);
  check_shape(op, "seq_lens", seq_lens, {B});
  check_dtype(op, "block_tables", block_tables, DType::I32);
  check_shape(op, "block_tables", block_tables, {B, -1});
  check_disjoint(op, "o_lat", o_lat, "q_lat", q_lat);
  check_disjoint(op, "o_lat", o_lat, "cache", cache);
  dispatch(op, kLatentAttention, {&q_lat, &cache, &block_tables, &cu_q, &seq_lens, &o_lat}, q_lat, cache,
           block_tables, cu_q, seq_lens, s, o_lat);
}

}  // namespace kestrel::ops
