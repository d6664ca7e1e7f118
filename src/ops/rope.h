#pragma once
#include <string>

#include "core/tensor.h"

namespace kestrel::ops {

// Rotary embedding parameters from HF config.json (rope_theta, rope_scaling).
struct RopeConfig {
  int64_t head_dim = 0;
  double theta = 10000.0;
  std::string scaling_type = "default";  // default | linear | llama3 | yarn
  double factor = 1.0;
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_position = 8192;  // llama3, yarn
  double beta_fast = 32.0;               // yarn
  double beta_slow = 1.0;                // yarn
  double attention_factor = 0.0;         // yarn; 0 = HF default 0.1*ln(factor)+1
};

// cos/sin for positions [0, max_positions): f32 [P, head_dim/2], the attention
// factor (yarn) already folded in, as HF does.
struct RopeTable {
  Tensor cos, sin;
  int64_t head_dim = 0;
};
RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions);
// HF inv_freq for the config (exposed for tests): [head_dim/2].
std::vector<double> rope_inv_freq(const RopeConfig& cfg, double* attention_scale);

// In place on x[T, n_heads*head_dim] with HF's rotate_half (non-interleaved) layout;
// positions: i32 [T] (per-token position within its sequence).
void rope_fwd(Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads);
// The transpose rotation, in place on the gradient.
void rope_bwd(Tensor& dx, const Tensor& positions, const RopeTable& table, int64_t n_heads);

}  // namespace kestrel::ops
