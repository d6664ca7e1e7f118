#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kestrel::optim {

namespace {
constexpr int64_t kChunk = 4096;

double sq_sum(const float* g, int64_t n) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> part(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 8)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0;
    for (int64_t k = lo; k < hi; ++k) s += double(g[k]) * double(g[k]);
    part[size_t(c)] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}
}  // namespace

double grad_sq_sum(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    KS_CHECK(g.dtype() == DType::F32 && g.device() == Device::CPU, "grad norm: grads must be host f32, got ",
             g.describe());
    s += sq_sum(g.data<float>(), g.numel());
  }
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
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    float* p = g.data<float>();
    const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t k = 0; k < n; ++k) p[k] *= c;
  }
  return r;
}

ClipResult clip_grad_norm(const std::vector<ParamSlot>& params, double max_norm, comm::ProcessGroup* pg) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) grads.push_back(p.grad);
  return clip_grad_norm(grads, max_norm, pg);
}

}  // namespace kestrel::optim
