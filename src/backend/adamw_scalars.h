// The per-step scalars of an AdamW update (ops::adamw_step), shared by the
// ops layer and every backend's kernel.
#pragma once
#include <cmath>
#include <cstdint>

// Computed as torch does, without fused multiply-adds (1 - lr * wd fused
// would differ in the last bit from the product rounded first).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace kestrel {

// The per-step scalars of AdamW, as torch computes them: in double, cast once
// to f32 (torch.optim.AdamW for f32 tensors, foreach=False, capturable=False).
struct AdamWScalars {
  bool decay = false;      // decoupled weight decay applied to this range
  float decay_keep = 1.f;  // 1 - lr * weight_decay
  float one_m_beta1 = 0.1f, beta2 = 0.999f, one_m_beta2 = 0.001f;
  float neg_step = 0.f;    // -lr / (1 - beta1^t)
  float bc2_sqrt = 1.f;    // sqrt(1 - beta2^t)
  float eps = 1e-8f;

  // t: the step count after increment (>= 1). decay: the parameter takes
  // weight decay (it is applied only when weight_decay and lr are nonzero).
  static AdamWScalars make(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t t,
                           bool decay) {
    AdamWScalars s;
    const double bc1 = 1.0 - std::pow(beta1, double(t));
    const double bc2 = 1.0 - std::pow(beta2, double(t));
    s.decay = decay && weight_decay != 0.0 && lr != 0.0;
    s.decay_keep = float(1.0 - lr * weight_decay);
    s.one_m_beta1 = float(1.0 - beta1);  // torch: 1 - beta as a Python float, cast once
    s.beta2 = float(beta2);
    s.one_m_beta2 = float(1.0 - beta2);
    s.neg_step = -float(lr / bc1);
    s.bc2_sqrt = float(std::sqrt(bc2));
    s.eps = float(eps);
    return s;
  }
};

}  // namespace kestrel

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
