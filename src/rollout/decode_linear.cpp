#include "rollout/decode_linear.h"

#include "core/cpu_features.h"
#include "ops/linear.h"

namespace kestrel::rollout {

int64_t packed_weight_bytes(int64_t out, int64_t in, DType dt) { return cpu::packed_linear_bytes(out, in, dt); }

int64_t packed_min_rows(DType weight_dtype) {
  return weight_dtype == DType::BF16 && cpu_features().has_amx() ? kPackedBf16AmxMinRows : kSkinnyRows;
}

void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, WeightPacks* packs) {
  const bool rows = x.defined() && x.dim() == 2;
  if (packs && rows && w.defined() && x.size(0) > packed_min_rows(w.dtype()))
    if (const cpu::PackedLinearWeight* p = packs->get(w); p && cpu::packed_linear_applies(*p, x, b, y)) {
      cpu::packed_linear(*p, x, b, y);
      return;
    }
  if (rows && x.size(0) <= kSkinnyRows && cpu::skinny_linear_applies(x, w, b, y)) {
    cpu::skinny_linear(x, w, b, y);
    return;
  }
  ops::linear_fwd(x, w, b, y);  // also reports bad arguments
}

}  // namespace kestrel::rollout
