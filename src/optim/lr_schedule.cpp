#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace kestrel::optim {

const char* lr_style_name(LrStyle s) {
  switch (s) {
    case LrStyle::Constant: return "constant";
    case LrStyle::Linear: return "linear";
    case LrStyle::Cosine: return "cosine";
  }
  return "?";
}

Result<LrStyle> parse_lr_style(const std::string& s, const std::string& origin) {
  if (s == "constant") return LrStyle::Constant;
  if (s == "linear") return LrStyle::Linear;
  if (s == "cosine") return LrStyle::Cosine;
  return KS_ERR(origin, ": unknown lr schedule '", s, "'; use constant, linear or cosine");
}

int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps) {
  if (warmup_steps >= 0) return warmup_steps;
  return int64_t(warmup_ratio * double(total_steps));  // Python int() truncates toward zero
}

LrSchedule::LrSchedule(LrScheduleConfig cfg) : cfg_(cfg) {
  if (cfg_.warmup_steps < 0) KS_FAIL("lr schedule: warmup_steps must be >= 0, got ", cfg_.warmup_steps);
  if (!(cfg_.min_lr_ratio >= 0 && cfg_.min_lr_ratio <= 1))
    KS_FAIL("lr schedule: min_lr_ratio must be in [0, 1], got ", cfg_.min_lr_ratio);
  if (!(cfg_.init_lr_ratio >= 0 && cfg_.init_lr_ratio <= 1))
    KS_FAIL("lr schedule: init_lr_ratio must be in [0, 1], got ", cfg_.init_lr_ratio);
  if (cfg_.decay_steps < 0) KS_FAIL("lr schedule: decay_steps must be >= 0, got ", cfg_.decay_steps);
  if (cfg_.style != LrStyle::Constant && cfg_.total_steps <= 0 && cfg_.decay_steps <= 0)
    KS_FAIL("lr schedule: the ", lr_style_name(cfg_.style), " style needs total_steps > 0, got ", cfg_.total_steps);
}

double LrSchedule::factor(int64_t step) const {
  const bool own_decay = cfg_.decay_steps > 0;
  const double s = double(step), w = double(cfg_.warmup_steps),
               t = double(own_decay ? cfg_.decay_steps : cfg_.total_steps);
  const double r = cfg_.min_lr_ratio, i = cfg_.init_lr_ratio;
  if (step < cfg_.warmup_steps) return i + (1.0 - i) * (s / std::max(1.0, w));
  switch (cfg_.style) {
    case LrStyle::Constant: return 1.0;
    case LrStyle::Cosine: {
      if (own_decay && step >= cfg_.decay_steps) return r;
      const double p = (s - w) / std::max(1.0, t - w);
      const double x = std::cos(M_PI * cfg_.num_cycles * 2.0 * p);
      // verl's form: x * coef + intercept with coef = (1-r)/2, intercept = (1+r)/2.
      return std::max(r, x * ((1 - r) * 0.5) + (1 + r) * 0.5);
    }
    case LrStyle::Linear: return r + (1 - r) * std::max(0.0, (t - s) / std::max(1.0, t - w));
  }
  return 1.0;
}

}  // namespace kestrel::optim
