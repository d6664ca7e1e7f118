#include "optim/grad_clip.h"

#include <cmath>

#include "ops/optim_ops.h"

namespace kestrel::optim {

double grad_sq_sum(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const auto& g : grads)
    if (g.defined()) s += ops::sum_squares(g);
  return s;
}

double global_grad_norm(const std::vector<Tensor>& grads, comm::ProcessGroup* pg) {
  double s = grad_sq_sum(grads);
  if (pg && pg->size() > 1) {
    // There is no f64 DType: gather the 8 raw bytes of every rank's sum and
    // add them in rank order, which is exact to double and the same everywhere.
    std::vector<double> all(size_t(pg->size()));
    pg->all_gather(&s, all.data(), int64_t(sizeof(double)), DType::U8);
    s = 0;
    for (double v : all) s += v;
  }
  return std::sqrt(s);
}

ClipResult clip_grad_norm(const std::vector<Tensor>& grads, double max_norm, comm::ProcessGroup* pg) {
  ClipResult r;
  r.norm = global_grad_norm(grads, pg);
  r.finite = std::isfinite(r.norm);
  if (!r.finite || max_norm <= 0) return r;
  const double coef = max_norm / (r.norm + 1e-6);
  if (coef >= 1.0) return r;
  r.coef = coef;
  r.clipped = true;
  const float c = float(coef);  // torch multiplies f32 grads by an f32 coefficient
  for (Tensor g : grads)
    if (g.defined()) ops::scale_(g, c);
  return r;
}

ClipResult clip_grad_norm(const std::vector<ParamSlot>& params, double max_norm, comm::ProcessGroup* pg) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad);
  return clip_grad_norm(grads, max_norm, pg);
}

}  // namespace kestrel::optim
