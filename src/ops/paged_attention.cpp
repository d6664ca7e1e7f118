// Validation and device dispatch of the paged-attention ops. Index checks
// (slots, block ids, context lengths) run here once per call, so a bad block
// table fails with a message instead of reading out of bounds.
#include "ops/paged_attention.h"

#include <cmath>

#include "backend/cpu/paged_attention_cpu.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/paged_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {
namespace {

// [num_blocks, block_size, n_kv_heads, head_dim] of the given dtype.
void check_cache(const char* op, const char* name, const Tensor& c, DType dt) {
  detail::check_defined(op, name, c);
  if (c.dim() != 4 || c.dtype() != dt)
    KS_FAIL("ops::", op, ": ", name, " must be ", dtype_name(dt), "[num_blocks, block_size, n_kv_heads, head_dim], got ",
            c.describe());
}

// The CPU paths: the index checks read the host-side metadata, then the kernels run.
void cpu_paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                        Tensor& v_cache) {
  const int64_t T = k.size(0), n_slots = k_cache.size(0) * k_cache.size(1);
  const int32_t* slots = slot_mapping.data<int32_t>();
  detail::check_slots("paged_kv_write", slots, T, n_slots);
  cpu::paged_kv_write(k, v, slots, k_cache, v_cache);
}

void cpu_paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                             const Tensor& cu_q, const Tensor& seq_lens, const AttentionShape& s, Tensor& out) {
  const char* op = "paged_attention_fwd";
  const int64_t T = q.size(0), B = cu_q.size(0) - 1;
  const int64_t num_blocks = k_cache.size(0), bs = k_cache.size(1), max_blocks = block_tables.size(1);
  const int32_t* cu = cu_q.data<int32_t>();
  const int32_t* sl = seq_lens.data<int32_t>();
  const int32_t* bt = block_tables.data<int32_t>();
  detail::check_paged_tables(op, cu, sl, bt, B, T, max_blocks, num_blocks, bs);
  cpu::PagedAttnParams p{s.n_heads, s.n_kv_heads, s.head_dim,
                         s.scale > 0.f ? s.scale : float(1.0 / std::sqrt(double(s.head_dim))), bs, max_blocks};
  cpu::paged_attention_fwd(q, k_cache, v_cache, bt, cu, sl, B, p, out);
}

#if KESTREL_HAVE_CUDA
// The CUDA paths: the metadata is read back (small copies) for the same checks as on the CPU,
// except while a CUDA graph captures: a read back cannot be part of a graph, so the graph's
// owner runs these checks on its host copies before every replay (rollout/decode_graphs.cpp).
std::vector<int32_t> host_ints(const Tensor& t) { return t.to_host<int32_t>(); }
void cuda_paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache,
                         Tensor& v_cache) {
  const int64_t T = k.size(0), n_slots = k_cache.size(0) * k_cache.size(1);
  if (!cuda::capturing()) {
    const std::vector<int32_t> slots = host_ints(slot_mapping);
    detail::check_slots("paged_kv_write", slots.data(), T, n_slots);
  }
  cuda::paged_kv_write(k, v, slot_mapping, k_cache, v_cache);
}
void cuda_paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const Tensor& block_tables, const Tensor& cu_q, const Tensor& seq_lens,
                              const AttentionShape& s, Tensor& out) {
  const int64_t T = q.size(0), B = cu_q.size(0) - 1;
  if (!cuda::capturing()) {
    const std::vector<int32_t> cu = host_ints(cu_q), sl = host_ints(seq_lens), bt = host_ints(block_tables);
    detail::check_paged_tables("paged_attention_fwd", cu.data(), sl.data(), bt.data(), B, T, block_tables.size(1),
                               k_cache.size(0), k_cache.size(1));
  }
  cuda::paged_attention_fwd(q, k_cache, v_cache, block_tables, cu_q, seq_lens, s.n_heads, s.n_kv_heads, s.head_dim,
                            s.scale > 0.f ? s.scale : float(1.0 / std::sqrt(double(s.head_dim))), out);
}
#endif

constexpr detail::Kernels<decltype(cpu_paged_kv_write)> kPagedKvWrite{
    .cpu = cpu_paged_kv_write KS_CUDA_KERNEL(cuda_paged_kv_write)};
constexpr detail::Kernels<decltype(cpu_paged_attention_fwd)> kPagedAttentionFwd{
    .cpu = cpu_paged_attention_fwd KS_CUDA_KERNEL(cuda_paged_attention_fwd)};
constexpr detail::Kernels<decltype(cpu::copy_kv_blocks)> kCopyKvBlocks{
    .cpu = cpu::copy_kv_blocks KS_CUDA_KERNEL(cuda::copy_kv_blocks)};

}  // namespace

void paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache) {
  const char* op = "paged_kv_write";
  detail::check_float(op, "k", k);
  check_cache(op, "k_cache", k_cache, k.dtype());
  check_cache(op, "v_cache", v_cache, k.dtype());
  if (k_cache.shape() != v_cache.shape()) KS_FAIL("ops::", op, ": k_cache ", k_cache.describe(), " and v_cache ", v_cache.describe(), " differ");
  const int64_t T = k.dim() == 2 ? k.size(0) : -1, kv_dim = k_cache.size(2) * k_cache.size(3);
  detail::check_shape(op, "k", k, {T, kv_dim});
  detail::check_shape(op, "v", v, {T, kv_dim});
  detail::check_same_dtype(op, "v", v, "k", k);
  detail::check_dtype(op, "slot_mapping", slot_mapping, DType::I32);
  detail::check_shape(op, "slot_mapping", slot_mapping, {T});
  detail::dispatch(op, kPagedKvWrite, {&k, &v, &slot_mapping, &k_cache, &v_cache}, k, v, slot_mapping, k_cache,
                   v_cache);
}

void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                         const Tensor& cu_q, const Tensor& seq_lens, const AttentionShape& s, Tensor& out) {
  const char* op = "paged_attention_fwd";
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || s.head_dim <= 0 || s.n_heads % s.n_kv_heads)
    KS_FAIL("ops::", op, ": bad AttentionShape n_heads=", s.n_heads, " n_kv_heads=", s.n_kv_heads,
            " head_dim=", s.head_dim, " (need positive values with n_heads divisible by n_kv_heads)");
  detail::check_float(op, "q", q);
  const int64_t T = q.dim() == 2 ? q.size(0) : -1;
  detail::check_shape(op, "q", q, {T, s.n_heads * s.head_dim});
  detail::check_shape(op, "out", out, {T, s.n_heads * s.head_dim});
  detail::check_same_dtype(op, "out", out, "q", q);
  check_cache(op, "k_cache", k_cache, q.dtype());
  check_cache(op, "v_cache", v_cache, q.dtype());
  detail::check_shape(op, "k_cache", k_cache, {-1, -1, s.n_kv_heads, s.head_dim});
  if (k_cache.shape() != v_cache.shape()) KS_FAIL("ops::", op, ": k_cache ", k_cache.describe(), " and v_cache ", v_cache.describe(), " differ");
  detail::check_dtype(op, "cu_q", cu_q, DType::I32);
  const int64_t B = cu_q.dim() == 1 ? cu_q.size(0) - 1 : -1;
  if (B < 0) KS_FAIL("ops::", op, ": cu_q must be i32 [B+1], got ", cu_q.describe());
  detail::check_dtype(op, "seq_lens", seq_lens, DType::I32);
  detail::check_shape(op, "seq_lens", seq_lens, {B});
  detail::check_dtype(op, "block_tables", block_tables, DType::I32);
  detail::check_shape(op, "block_tables", block_tables, {B, -1});
  detail::dispatch(op, kPagedAttentionFwd, {&q, &k_cache, &v_cache, &block_tables, &cu_q, &seq_lens, &out}, q, k_cache,
                   v_cache, block_tables, cu_q, seq_lens, s, out);
}

void copy_kv_blocks(const Tensor& src_cache, Tensor& dst_cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  const char* op = "copy_kv_blocks";
  detail::check_defined(op, "src_cache", src_cache);
  detail::check_defined(op, "dst_cache", dst_cache);
  if (src_cache.dtype() != dst_cache.dtype() || src_cache.dim() != dst_cache.dim() || src_cache.dim() < 2)
    KS_FAIL("ops::", op, ": caches must share dtype and block geometry, got ", src_cache.describe(), " and ",
            dst_cache.describe());
  for (int64_t i = 1; i < src_cache.dim(); ++i)
    if (src_cache.size(i) != dst_cache.size(i))
      KS_FAIL("ops::", op, ": block geometry differs: ", src_cache.describe(), " vs ", dst_cache.describe());
  for (const auto& [s, d] : pairs)
    if (s < 0 || s >= src_cache.size(0) || d < 0 || d >= dst_cache.size(0))
      KS_FAIL("ops::", op, ": block pair (", s, ", ", d, ") outside [0, ", src_cache.size(0), ") x [0, ",
              dst_cache.size(0), ")");
  if (src_cache.device() != dst_cache.device()) {
    // A swap between host and device memory: block by block through Tensor's copies (the backend's transfers).
    for (const auto& [s, d] : pairs) {
      Tensor dst_block = dst_cache.slice_rows(d, d + 1);
      dst_block.copy_from(src_cache.slice_rows(s, s + 1));
    }
    return;
  }
  detail::dispatch(op, kCopyKvBlocks, {&src_cache, &dst_cache}, src_cache, dst_cache, pairs);
}

}  // namespace kestrel::ops
