#include "rollout/decode_linear.h"

#include "ops/linear.h"

namespace kestrel::rollout {

void decode_linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y, WeightPacks* packs) {
  if (packs && packs->linear(x, w, b, y)) return;
  if (x.defined() && x.dim() == 2 && x.size(0) <= kSkinnyRows && cpu::skinny_linear_applies(x, w, b, y)) {
    cpu::skinny_linear(x, w, b, y);
    return;
  }
  ops::linear_fwd(x, w, b, y);  // also reports bad arguments
}

}  // namespace kestrel::rollout
