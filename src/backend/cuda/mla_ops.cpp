// Host side of the CUDA MLA kernels (kernels_mla.cu).
#include "backend/cuda/mla_ops.h"

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels_mla.h"

namespace kestrel::cuda {
namespace {
launch::MlaDims dims(const MlaArgs& a, int64_t T) {
  return {T, int(a.n_heads), int(a.kv_lora_rank), int(a.qk_nope_head_dim), int(a.qk_rope_head_dim),
          int(a.v_head_dim), a.scale};
}
const int32_t* i32(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }
}  // namespace

void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaArgs& a, Tensor& q_lat) {
  launch::mla_absorb_q(q.raw(), float_kind(q, "mla_absorb_q"), kv_b.raw(), float_kind(kv_b, "mla_absorb_q"),
                       dims(a, q.size(0)), q_lat.raw(), float_kind(q_lat, "mla_absorb_q"), stream());
  check_launch("mla_absorb_q");
}

void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaArgs& a, Tensor& o) {
  launch::mla_absorb_out(o_lat.raw(), float_kind(o_lat, "mla_absorb_out"), kv_b.raw(),
                         float_kind(kv_b, "mla_absorb_out"), dims(a, o_lat.size(0)), o.raw(),
                         float_kind(o, "mla_absorb_out"), stream());
  check_launch("mla_absorb_out");
}

void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const Tensor& slot_mapping, Tensor& cache) {
  launch::paged_latent_write(c_kv.raw(), k_pe.raw(), float_kind(cache, "paged_latent_write"), i32(slot_mapping),
                             c_kv.size(0), int(c_kv.size(1)), int(k_pe.size(1)), cache.raw(), stream());
  check_launch("paged_latent_write");
}

void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const Tensor& block_tables,
                                const Tensor& cu_q, const Tensor& seq_lens, const MlaArgs& a, Tensor& o_lat) {
  if (a.kv_lora_rank + a.qk_rope_head_dim > launch::mla_max_latent_dim())
    KS_FAIL("not supported yet: CUDA paged_latent_attention_fwd with a latent width of ",
            a.kv_lora_rank + a.qk_rope_head_dim, " (this kernel takes up to ", launch::mla_max_latent_dim(), ")");
  launch::paged_latent_attention_fwd(q_lat.raw(), cache.raw(), float_kind(cache, "paged_latent_attention_fwd"),
                                     i32(block_tables), i32(cu_q), i32(seq_lens), int(cu_q.size(0) - 1),
                                     dims(a, q_lat.size(0)), int(cache.size(1)), int(block_tables.size(1)),
                                     o_lat.raw(), stream());
  check_launch("paged_latent_attention_fwd");
}

}  // namespace kestrel::cuda
