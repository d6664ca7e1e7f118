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
  bool interleaved = false;              // rotate pairs (2i, 2i+1), not halves (DeepSeek; see rope_fwd)
};

// cos/sin for positions [0, max_positions): f32 [P, head_dim/2], the attention
// factor (yarn) already folded in, as HF does. HF's cos/sin are [P, head_dim]
// with both halves equal (cat(freqs, freqs)); one half is stored. head_dim is
// the rotated width (MLA: qk_rope_head_dim, not the whole query head).
struct RopeTable {
  Tensor cos, sin;
  int64_t head_dim = 0;
  bool interleaved = false;  // RopeConfig::interleaved
};
// Computed with HF's float32 arithmetic, in HF's order, so the table matches
// transformers' LlamaRotaryEmbedding to float32 rounding (libm vs Sleef ulps).
RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions);
// The same table on device dev (the kernels read it where x lives); a copy of the handles when already there.
RopeTable rope_table_to(const RopeTable& table, Device dev);
// HF inv_freq for the config (exposed for tests): [head_dim/2], float32 values
// widened to double. *attention_scale (if non-null) receives HF's
// attention_scaling (1 except yarn).
std::vector<double> rope_inv_freq(const RopeConfig& cfg, double* attention_scale);

// In place on x [T, n_heads*W] (f32 or bf16), W = x.size(1) / n_heads: in
// each head only the columns [rot_offset, rot_offset + table.head_dim) rotate
// (call them r[0 .. head_dim); W == head_dim with rot_offset 0 is a plain
// rotary head; MLA's query heads [q_nope | q_pe] rotate their last
// qk_rope_head_dim columns: rot_offset = qk_nope_head_dim). For i < head_dim/2,
// with cos/sin of frequency i at the token's position:
//  - table.interleaved == false, HF's rotate_half layout (pair i = (i, i+half)):
//      r[i] <- r[i]*cos - r[i+half]*sin,  r[i+half] <- r[i+half]*cos + r[i]*sin;
//  - table.interleaved == true, DeepSeek's layout (pair i = (2i, 2i+1)):
//      r[2i] <- r[2i]*cos - r[2i+1]*sin,  r[2i+1] <- r[2i+1]*cos + r[2i]*sin,
//    written back in place, pairs kept. HF DeepSeek-V2 (apply_rotary_emb,
//    complex numbers) keeps the pairs too; HF DeepSeek-V3
//    (apply_rotary_pos_emb_interleave) writes the result de-interleaved
//    ([all r[2i] | all r[2i+1]]). q and k get the same layout either way, so
//    q.k, and so the attention, are identical; only the column order of the
//    rotated q/k (and of MLA's cached k_pe) differs from V3's.
// Rounding: f32 math on the f32 table, the result rounded once to x's dtype
// (the same in both layouts). This is exactly V2's (float math, cast once);
// V3 and Llama in bf16 round cos/sin and every product to bf16, so a bf16
// result may differ from theirs by a bf16 rounding.
// positions: i32 [T] (per-token position within its sequence, in [0, P)).
void rope_fwd(Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads, int64_t rot_offset = 0);
// The transpose rotation (sin negated), in place on the gradient; same layout.
void rope_bwd(Tensor& dx, const Tensor& positions, const RopeTable& table, int64_t n_heads, int64_t rot_offset = 0);

}  // namespace kestrel::ops
