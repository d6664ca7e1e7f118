#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kestrel::ops {

// Rotary embedding parameters from HF config.json (rope_theta, rope_scaling /
// rope_parameters). Field meanings follow transformers' modeling_rope_utils.py.
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
  double attention_factor = 0.0;         // yarn; 0 = HF default (from factor, mscale, mscale_all_dim)
  double mscale = 0.0;                   // yarn; 0 = absent. With mscale_all_dim (both non-zero) the default
  double mscale_all_dim = 0.0;           //   attention factor is get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
  bool truncate = true;                  // yarn: floor/ceil the correction range (HF default true)
};

// cos/sin for positions [0, max_positions): f32 [P, head_dim/2], the attention
// factor (yarn) already folded in, as HF does. HF's cos/sin are [P, head_dim]
// with both halves equal (cat(freqs, freqs)); one half is stored.
struct RopeTable {
  Tensor cos, sin;
  int64_t head_dim = 0;
};
// Computed with HF's float32 arithmetic, in HF's order, so the table matches
// transformers' LlamaRotaryEmbedding to float32 rounding (libm vs Sleef ulps).
RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions);
// HF inv_freq for the config (exposed for tests): [head_dim/2], float32 values
// widened to double. *attention_scale (if non-null) receives HF's
// attention_scaling (1 except yarn).
std::vector<double> rope_inv_freq(const RopeConfig& cfg, double* attention_scale);

// In place on x[T, n_heads*head_dim] (f32 or bf16) with HF's rotate_half
// (non-interleaved) layout: for i < head_dim/2,
//   x[i] <- x[i]*cos - x[i+half]*sin,  x[i+half] <- x[i+half]*cos + x[i]*sin.
// positions: i32 [T] (per-token position within its sequence, in [0, P)).
void rope_fwd(Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads);
// The transpose rotation, in place on the gradient.
void rope_bwd(Tensor& dx, const Tensor& positions, const RopeTable& table, int64_t n_heads);

}  // namespace kestrel::ops
