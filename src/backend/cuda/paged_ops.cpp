// Host side of the CUDA paged-KV kernels (kernels_paged.cu).
#include "backend/cuda/paged_ops.h"

#include "backend/cuda/cuda_util.h"

namespace kestrel::cuda {
namespace {
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }
}  // namespace

void paged_kv_write(const Tensor& k, const Tensor& v, const Tensor& slot_mapping, Tensor& k_cache, Tensor& v_cache) {
  launch::paged_kv_write(k.raw(), v.raw(), i32(slot_mapping), k.size(0), k.size(1), int(dtype_size(k.dtype())),
                         k_cache.raw(), v_cache.raw(), stream());
  check_launch("paged_kv_write");
}

void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                         const Tensor& cu_q, const Tensor& seq_lens, int64_t n_heads, int64_t n_kv_heads,
                         int64_t head_dim, float scale, Tensor& out) {
  if (head_dim > launch::attention_max_head_dim())
    KS_FAIL("not supported yet: CUDA paged_attention_fwd with head_dim ", head_dim, " (this kernel takes up to ",
            launch::attention_max_head_dim(), ")");
  launch::paged_attention_fwd(q.raw(), k_cache.raw(), v_cache.raw(), float_kind(q, "paged_attention_fwd"),
                              i32(block_tables), i32(cu_q), i32(seq_lens), int(cu_q.size(0) - 1), q.size(0),
                              int(n_heads), int(n_kv_heads), int(head_dim), int(k_cache.size(1)),
                              int(block_tables.size(1)), scale, out.raw(), stream());
  check_launch("paged_attention_fwd");
}

void copy_kv_blocks(const Tensor& src_cache, Tensor& dst_cache, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  if (pairs.empty()) return;
  std::vector<int32_t> flat;
  flat.reserve(pairs.size() * 2);
  for (const auto& [s, d] : pairs) flat.push_back(s), flat.push_back(d);
  Tensor dev = Tensor::empty({int64_t(flat.size())}, DType::I32, MemCategory::Other, Device::CUDA);
  dev.copy_from(Tensor::from_ints(flat, {int64_t(flat.size())}));
  const int64_t block_bytes = int64_t(src_cache.nbytes()) / src_cache.size(0);
  KS_CHECK(block_bytes % 4 == 0, "copy_kv_blocks: a block of ", block_bytes, " bytes (not a multiple of 4)");
  launch::copy_kv_blocks(src_cache.raw(), dst_cache.raw(), i32(dev), int(pairs.size()), block_bytes, stream());
  check_launch("copy_kv_blocks");
}

}  // namespace kestrel::cuda
