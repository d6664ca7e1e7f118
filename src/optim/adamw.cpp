#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace kestrel::optim {

AdamW::AdamW(std::vector<ParamSlot> params, AdamWConfig cfg, int64_t state_begin, int64_t state_end)
    : params_(std::move(params)), cfg_(cfg) {
  offsets_.reserve(params_.size() + 1);
  offsets_.push_back(0);
  for (const auto& p : params_) {
    KS_CHECK(p.master.defined() && p.master.dtype() == DType::F32 && p.master.device() == Device::CPU,
             "AdamW: master of '", p.name, "' must be a host f32 tensor, got ", p.master.describe());
    KS_CHECK(p.grad.defined() && p.grad.dtype() == DType::F32 && p.grad.numel() == p.master.numel(),
             "AdamW: grad of '", p.name, "' must be f32 with ", p.master.numel(), " elements, got ", p.grad.describe());
    if (p.model_copy.defined())
      KS_CHECK(p.model_copy.numel() == p.master.numel() &&
                   (p.model_copy.dtype() == DType::BF16 || p.model_copy.dtype() == DType::F16 ||
                    p.model_copy.dtype() == DType::F32),
               "AdamW: model copy of '", p.name, "' must be a float tensor with ", p.master.numel(),
               " elements, got ", p.model_copy.describe());
    offsets_.push_back(offsets_.back() + p.master.numel());
  }
  KS_CHECK(cfg_.beta1 >= 0 && cfg_.beta1 < 1 && cfg_.beta2 >= 0 && cfg_.beta2 < 1 && cfg_.eps >= 0 &&
               cfg_.weight_decay >= 0,
           "AdamW: invalid hyperparameters beta1=", cfg_.beta1, " beta2=", cfg_.beta2, " eps=", cfg_.eps,
           " weight_decay=", cfg_.weight_decay);
  state_begin_ = state_begin;
  state_end_ = state_end < 0 ? numel() : state_end;
  KS_CHECK(0 <= state_begin_ && state_begin_ <= state_end_ && state_end_ <= numel(), "AdamW: owned range [",
           state_begin_, ", ", state_end_, ") outside the flat space of ", numel(), " elements");
  m_ = Tensor::zeros({state_end_ - state_begin_}, DType::F32, MemCategory::OptimizerState);
  v_ = Tensor::zeros({state_end_ - state_begin_}, DType::F32, MemCategory::OptimizerState);
}

void AdamW::step_range(int64_t begin, int64_t end, double lr) { step_ranges({{begin, end}}, lr); }

void AdamW::step_ranges(const std::vector<std::pair<int64_t, int64_t>>& ranges, double lr) {
  for (auto [b, e] : ranges)
    KS_CHECK(state_begin_ <= b && b <= e && e <= state_end_, "AdamW: step range [", b, ", ", e,
             ") outside the owned range [", state_begin_, ", ", state_end_, ")");
  ++step_;
  const double t = double(step_);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, t);
  const double bc2 = 1.0 - std::pow(cfg_.beta2, t);
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (auto [b, e] : ranges)
    step_one(b, e, float(1.0 - lr * cfg_.weight_decay), float(cfg_.beta1), float(cfg_.beta2), float(step_size),
             float(bc2_sqrt), float(cfg_.eps), lr);
}

void AdamW::step_one(int64_t begin, int64_t end, float decay_keep, float beta1, float beta2, float step_size,
                     float bc2_sqrt, float eps, double lr) {
  // torch computes 1 - beta as a Python float and casts it once to f32.
  const float one_m_beta1 = float(1.0 - cfg_.beta1);
  const float one_m_beta2 = float(1.0 - cfg_.beta2);
  const float neg_step = -step_size;
  const bool wd_on = cfg_.weight_decay != 0.0 && lr != 0.0;
  // Parameters overlapping [begin, end): offsets_ is sorted.
  size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (; i < params_.size() && offsets_[i] < end; ++i) {
    const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i + 1]);
    if (lo >= hi) continue;
    ParamSlot& p = params_[i];
    float* w = p.master.data<float>() + (lo - offsets_[i]);
    const float* g = p.grad.data<float>() + (lo - offsets_[i]);
    float* m = m_.data<float>() + (lo - state_begin_);
    float* v = v_.data<float>() + (lo - state_begin_);
    const int64_t n = hi - lo;
    const bool decay = wd_on && p.decay;
    // Each element is independent, so the static split cannot change results.
#pragma omp parallel for schedule(static) if (n > (1 << 15))
    for (int64_t k = 0; k < n; ++k) {
      float pk = w[k];
      if (decay) pk = pk * decay_keep;
      const float gk = g[k];
      // torch.lerp for weight < 0.5: self + weight * (end - self)
      const float mk = m[k] + one_m_beta1 * (gk - m[k]);
      const float vk = v[k] * beta2 + one_m_beta2 * gk * gk;
      const float denom = std::sqrt(vk) / bc2_sqrt + eps;
      m[k] = mk;
      v[k] = vk;
      w[k] = pk + neg_step * mk / denom;
    }
  }
  refresh_model_copies(begin, end);
}

void AdamW::refresh_model_copies(int64_t begin, int64_t end) {
  KS_CHECK(0 <= begin && begin <= end && end <= numel(), "AdamW: refresh range [", begin, ", ", end,
           ") outside the flat space of ", numel(), " elements");
  size_t i = size_t(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (; i < params_.size() && offsets_[i] < end; ++i) {
    ParamSlot& p = params_[i];
    if (!p.model_copy.defined()) continue;
    const int64_t lo = std::max(begin, offsets_[i]) - offsets_[i], hi = std::min(end, offsets_[i + 1]) - offsets_[i];
    const float* src = p.master.data<float>();
    switch (p.model_copy.dtype()) {
      case DType::BF16: {
        auto* d = static_cast<uint16_t*>(p.model_copy.raw());
#pragma omp parallel for schedule(static) if (hi - lo > (1 << 15))
        for (int64_t k = lo; k < hi; ++k) d[k] = float_to_bf16(src[k]);
        break;
      }
      case DType::F16: {
        auto* d = static_cast<uint16_t*>(p.model_copy.raw());
#pragma omp parallel for schedule(static) if (hi - lo > (1 << 15))
        for (int64_t k = lo; k < hi; ++k) d[k] = float_to_f16(src[k]);
        break;
      }
      case DType::F32:
        if (p.model_copy.raw() != p.master.raw())
          std::memcpy(static_cast<float*>(p.model_copy.raw()) + lo, src + lo, size_t(hi - lo) * 4);
        break;
      default: KS_FAIL("AdamW: model copy of '", p.name, "' has non-float dtype ", dtype_name(p.model_copy.dtype()));
    }
  }
}

std::string AdamW::layout_string() const {
  std::ostringstream os;
  for (size_t i = 0; i < params_.size(); ++i)
    os << (i ? ";" : "") << params_[i].name << ":" << params_[i].master.numel() << (params_[i].decay ? "" : ":nodecay");
  return os.str();
}

OptimizerState AdamW::state() const {
  OptimizerState s;
  Tensor step = Tensor::empty({1}, DType::I64, MemCategory::Other);
  step.data<int64_t>()[0] = step_;
  s.tensors = {{"exp_avg", m_}, {"exp_avg_sq", v_}, {"step", step}};
  auto num = [](double v) {
    std::ostringstream os;
    os.precision(17);
    os << v;
    return os.str();
  };
  s.metadata = {{"optimizer", "adamw"},
                {"layout", layout_string()},
                {"state_begin", std::to_string(state_begin_)},
                {"state_end", std::to_string(state_end_)},
                {"beta1", num(cfg_.beta1)},
                {"beta2", num(cfg_.beta2)},
                {"eps", num(cfg_.eps)},
                {"weight_decay", num(cfg_.weight_decay)}};
  return s;
}

Status AdamW::load_state(const std::map<std::string, Tensor>& tensors, const std::map<std::string, std::string>& md,
                         const std::string& origin) {
  auto meta = [&](const std::string& k) -> std::string {
    auto it = md.find(k);
    return it == md.end() ? std::string() : it->second;
  };
  if (meta("optimizer") != "adamw")
    return KS_ERR(origin, ": not an AdamW state (metadata optimizer='", meta("optimizer"), "')");
  if (meta("layout") != layout_string())
    return KS_ERR(origin, ": optimizer state was saved for different parameters (names, sizes or decay flags differ); "
                          "resume with the same model and parameter grouping");
  if (meta("state_begin") != std::to_string(state_begin_) || meta("state_end") != std::to_string(state_end_))
    return KS_ERR(origin, ": optimizer state covers [", meta("state_begin"), ", ", meta("state_end"),
                  ") of the flat space but this rank owns [", state_begin_, ", ", state_end_,
                  "); not supported yet: resharding optimizer state across a different data-parallel size");
  for (const char* k : {"exp_avg", "exp_avg_sq", "step"})
    if (!tensors.count(k)) return KS_ERR(origin, ": optimizer state has no tensor '", k, "'");
  const Tensor& m = tensors.at("exp_avg");
  const Tensor& v = tensors.at("exp_avg_sq");
  const Tensor& st = tensors.at("step");
  for (const Tensor* t : {&m, &v})
    if (t->dtype() != DType::F32 || t->numel() != m_.numel())
      return KS_ERR(origin, ": optimizer moment is ", t->describe(), ", expected f32[", m_.numel(), "]");
  if (st.dtype() != DType::I64 || st.numel() != 1) return KS_ERR(origin, ": 'step' must be i64[1], got ", st.describe());
  std::memcpy(m_.raw(), m.raw(), m_.nbytes());
  std::memcpy(v_.raw(), v.raw(), v_.nbytes());
  step_ = static_cast<const int64_t*>(st.raw())[0];
  return Status::ok();
}

}  // namespace kestrel::optim
