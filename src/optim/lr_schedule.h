// Learning-rate schedules with linear warmup, matching verl's FSDP path
// (verl/utils/torch_functional.py, current main: get_constant_schedule_with_warmup,
// get_cosine_schedule_with_warmup; both LambdaLR factors on the base lr).
//
// `step` counts optimizer steps already taken: 0 for the first update. verl
// builds a LambdaLR (evaluated at step 0 on construction) and calls
// scheduler.step() after each optimizer.step(), so update k uses factor(k);
// with warmup the very first update therefore runs at lr 0, as in verl.
//
// W = warmup_steps, T = total_steps, r = min_lr_ratio, c = num_cycles,
// i = init_lr_ratio (verl's cosine init_lr_ratio; default 0):
// D = decay_steps (Megatron's lr_decay_steps: the step where the decay ends;
//     0 = T, verl's "null decays over total_training_steps"):
//   warmup (s < W, all styles): factor = i + (1 - i) * s / max(1, W)
//   constant: factor = 1 after warmup (so W = 0 gives 1 from step 0; verl's
//             older min(1, s / max(1, W)) form gave 0 at step 0)
//   cosine:   p = (s - W) / max(1, D - W)   (not clamped, as in verl, when D = T)
//             factor = max(r, r + (1 - r) * 0.5 * (1 + cos(2*pi*c*p)))
//             with D given and s >= D: factor = r (Megatron: min_lr after the decay)
//   linear:   factor = r + (1 - r) * max(0, (D - s) / max(1, D - W))
//             (transformers' get_linear_schedule_with_warmup, with verl's
//              min_lr_ratio floor; verl's FSDP path has no linear style)
// lr(s) = base_lr * factor(s).
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace kestrel::optim {

enum class LrStyle { Constant, Linear, Cosine };
const char* lr_style_name(LrStyle s);
// "constant" | "linear" | "cosine"; `origin` (e.g. "config.yaml: optim.lr_scheduler_type") prefixes errors.
Result<LrStyle> parse_lr_style(const std::string& s, const std::string& origin);

// verl: lr_warmup_steps < 0 means int(lr_warmup_steps_ratio * total_steps).
int64_t resolve_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total_steps);

struct LrScheduleConfig {
  double lr = 1e-6;
  LrStyle style = LrStyle::Constant;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // needed by linear and cosine
  int64_t decay_steps = 0;  // > 0: the decay ends here (then min_lr); 0 = total_steps
  double min_lr_ratio = 0.0;
  double num_cycles = 0.5;
  double init_lr_ratio = 0.0;  // warmup starts at init_lr_ratio * lr
};

class LrSchedule {
 public:
  // Throws Error for inconsistent settings (negative warmup, min_lr_ratio
  // outside [0, 1], decay styles without total_steps).
  explicit LrSchedule(LrScheduleConfig cfg);
  double factor(int64_t step) const;
  double lr(int64_t step) const { return cfg_.lr * factor(step); }
  const LrScheduleConfig& config() const { return cfg_; }

 private:
  LrScheduleConfig cfg_;
};

}  // namespace kestrel::optim
