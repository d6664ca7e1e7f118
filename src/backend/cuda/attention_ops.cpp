// Host side of the CUDA attention kernels (kernels_attention.cu).
#include "backend/cuda/attention_ops.h"

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels_block.h"

namespace kestrel::cuda {
namespace {

void check_dims(const char* op, const AttnDims& s) {
  const int64_t lim = launch::attention_max_head_dim();
  if (s.head_dim > lim || s.v_head_dim > lim)
    KS_FAIL("not supported yet: CUDA ", op, " with head_dim ", s.head_dim, " / value dim ", s.v_head_dim,
            " (this kernel takes up to ", lim, ")");
}
const int32_t* i32(const Tensor* t) { return t ? static_cast<const int32_t*>(t->raw()) : nullptr; }

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, const AttnDims& s, Tensor& out,
                   Tensor& lse, const Tensor* prefix_of) {
  check_dims("attention_fwd", s);
  launch::attention_fwd(q.raw(), k.raw(), v.raw(), float_kind(q, "attention_fwd"), i32(&cu), int(cu.size(0) - 1),
                        i32(prefix_of), q.size(0), int(s.n_heads), int(s.n_kv_heads), int(s.head_dim),
                        int(s.v_head_dim), s.scale, out.raw(), static_cast<float*>(lse.raw()), stream());
  check_launch("attention_fwd");
}

void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const Tensor& cu, const AttnDims& s, Tensor& dq, Tensor& dk, Tensor& dv,
                   const Tensor* prefix_of) {
  check_dims("attention_bwd", s);
  Tensor dsum = Tensor::empty({s.n_heads, q.size(0)}, DType::F32, MemCategory::Activations, Device::CUDA);
  launch::attention_bwd(q.raw(), k.raw(), v.raw(), out.raw(), float_kind(q, "attention_bwd"),
                        static_cast<const float*>(lse.raw()), dout.raw(), float_kind(dout, "attention_bwd"), i32(&cu),
                        int(cu.size(0) - 1), i32(prefix_of), q.size(0),
                        int(s.n_heads), int(s.n_kv_heads), int(s.head_dim), int(s.v_head_dim), s.scale,
                        static_cast<float*>(dsum.raw()), dq.raw(), dk.raw(), dv.raw(), stream());
  check_launch("attention_bwd");
}

namespace {
const int32_t* rows_of(const Tensor* t) {
  return t && t->defined() && t->numel() > 0 ? static_cast<const int32_t*>(t->raw()) : nullptr;
}
launch::BlockArgs block_args(const Tensor& q, const Tensor& k, const BlockMeta& m, const AttnDims& s) {
  return {rows_of(m.cu_q), rows_of(m.cu_k), rows_of(m.q_pos), rows_of(m.k_pos), int(m.n_seqs), q.size(0), k.size(0),
          int(s.n_heads), int(s.n_kv_heads), int(s.head_dim), int(s.v_head_dim), s.scale};
}
}  // namespace

void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const BlockMeta& m, const AttnDims& s,
                         Tensor& out, Tensor& lse) {
  check_dims("attention_block_fwd", s);
  launch::attention_block_fwd(q.raw(), k.raw(), v.raw(), float_kind(q, "attention_block_fwd"), block_args(q, k, m, s),
                              out.raw(), float_kind(out, "attention_block_fwd"), static_cast<float*>(lse.raw()),
                              stream());
  check_launch("attention_block_fwd");
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t H = lse.size(0), Tq = lse.size(1);
  const int64_t vd = Tq > 0 ? out.size(1) / H : 0;
  launch::attention_merge(out.raw(), float_kind(out, "attention_merge"), static_cast<float*>(lse.raw()), out_b.raw(),
                          float_kind(out_b, "attention_merge"), static_cast<const float*>(lse_b.raw()), int(H), Tq,
                          int(vd), stream());
  check_launch("attention_merge");
}

void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const BlockMeta& m, const AttnDims& s, Tensor& dq, Tensor& dk,
                         Tensor& dv) {
  check_dims("attention_block_bwd", s);
  Tensor dsum = Tensor::empty({s.n_heads, q.size(0)}, DType::F32, MemCategory::Activations, Device::CUDA);
  launch::attention_block_bwd(q.raw(), k.raw(), v.raw(), float_kind(q, "attention_block_bwd"), out.raw(), dout.raw(),
                              float_kind(out, "attention_block_bwd"), static_cast<const float*>(lse.raw()),
                              block_args(q, k, m, s), static_cast<float*>(dsum.raw()), static_cast<float*>(dq.raw()),
                              static_cast<float*>(dk.raw()), static_cast<float*>(dv.raw()), stream());
  check_launch("attention_block_bwd");
}

std::vector<float> mma_tile_product(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  KS_CHECK(a.size() == 16 * 16 && b.size() == 16 * 8, "mma_tile_product: a is 16 x 16 and b 16 x 8, got ", a.size(),
           " and ", b.size(), " values");
  auto up = [](const std::vector<uint16_t>& v, Shape s) {
    Tensor h = Tensor::empty(std::move(s), DType::BF16, MemCategory::Other);
    std::copy(v.begin(), v.end(), static_cast<uint16_t*>(h.raw()));
    return h.copy_to(Device::CUDA);
  };
  const Tensor ad = up(a, {16, 16}), bd = up(b, {16, 8});
  Tensor cd = Tensor::empty({16, 8}, DType::F32, MemCategory::Other, Device::CUDA);
  launch::mma_tile_product(static_cast<const uint16_t*>(dptr(ad)), static_cast<const uint16_t*>(dptr(bd)),
                           static_cast<float*>(dptr(cd)), stream());
  check_launch("mma_tile_product");
  return cd.to_host<float>();
}

}  // namespace kestrel::cuda
