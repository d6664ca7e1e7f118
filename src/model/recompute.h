// Activation recompute (Megatron's full / selective recompute, MindSpeed's
// activation-function and norm recompute): which of a block's kept
// activations (model/activations.h) the training forward drops, and rebuilds
// in the backward from what it kept.
//
//   full, uniform, n   the slice's blocks [0, L) cut into chunks of n: only the
//                      input x_in [Tl, D] of each chunk's first block survives
//                      the forward; the backward reruns the chunk's forward
//                      (keeping everything for that chunk only), then runs the
//                      chunk's backward.
//   full, block, n     the first n blocks keep only their x_in (one chunk
//                      each); the others keep everything.
//   selective          recompute_modules: core_attn drops the attention core's
//                      output attn [Tp, H*hd] and lse [H, T] (recomputed from
//                      q, k, v before o_proj's backward); layernorm is the norm
//                      recompute below on every block; mlp (the dense MLP)
//                      drops gate, up and act [Tp, F] and reruns gate/up and
//                      swiglu from norm2 before the MLP's backward. MoE/MLA
//                      modules (moe_act, moe, shared_experts, mla_up_proj) are
//                      refused: those blocks are not built.
//   activation fn      drops act = swiglu(gate, up) [Tp, F] once the down
//                      projection consumed it; recomputed before the down
//                      projection's weight gradient.
//   norm               drops both norms' outputs (the entered [Tp, D]) once
//                      q/k/v and gate/up consumed them; recomputed from x_in /
//                      x_mid (rmsnorm + enter, an all-gather under SP: every
//                      rank recomputes in the same order) before their backward.
//
// Bit-identical to no recompute: the recomputation runs the same kernels on
// the same inputs in the same order (and the same thread partitioning, which
// depends only on the shapes). The forward draws nothing random (no dropout),
// so there is no RNG state to save and replay.
//
// Only the training forward (CausalLM::forward / forward_hidden, kept
// activations) reads the policy: scoring and the rollout keep nothing anyway.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace kestrel::model {

enum class RecomputeGranularity { None, Full, Selective };
enum class RecomputeMethod { None, Uniform, Block };

// What one block of a slice does (RecomputePolicy::plan).
struct BlockRecompute {
  bool full = false;        // part of a full-recompute chunk: keeps only the chunk's x_in
  int64_t chunk_first = 0;  // full: local index of the chunk's first block (its x_in is the checkpoint)
  int64_t chunk_last = 0;   // full: local index of the chunk's last block
  bool core_attn = false;   // drop attn + lse, recompute with attend()
  bool act = false;         // drop swiglu's output, recompute it
  bool norm = false;        // drop norm1 / norm2 outputs, recompute them
  bool mlp = false;         // drop gate, up and act, recompute them from norm2 (selective mlp)
};

struct RecomputePolicy {
  RecomputeGranularity granularity = RecomputeGranularity::None;
  RecomputeMethod method = RecomputeMethod::None;
  int64_t num_layers = -1;  // full: chunk size (uniform) or recomputed blocks (block); -1 unset
  // selective: recompute_modules (core_attn, layernorm)
  bool core_attn = false;
  bool layernorm = false;
  bool mlp = false;  // dense MLP: gate, up, act [Tp, F] recomputed from norm2 before its backward
  // MindSpeed activation-function recompute; num_layers -1: every block
  // (after the full-recompute blocks of method block).
  bool activation_function = false;
  int64_t activation_function_num_layers = -1;
  // MindSpeed norm recompute; num_layers -1: every block (after the full ones).
  bool norm = false;
  int64_t norm_num_layers = -1;

  bool enabled() const {
    return granularity != RecomputeGranularity::None || activation_function || norm;
  }
  // The rules of Megatron and MindSpeed (see validate_recompute); each error
  // names the config keys (under `prefix`, e.g.
  // "actor_rollout_ref.actor.megatron.override_transformer_config.") and the fix.
  Status validate(const std::string& prefix = "") const;
  // Per block of a slice of `num_blocks` blocks (local indices).
  std::vector<BlockRecompute> plan(int64_t num_blocks) const;
  std::string describe() const;  // "none", "full/uniform/2", "selective[core_attn]+act+norm", ...
};

// Builds the policy from the config strings (verl/Megatron key values);
// `modules` is recompute_modules (used with granularity selective). Unknown
// names and modules that need MoE/MLA are refused with the key in the message.
Result<RecomputePolicy> make_recompute_policy(const std::string& granularity, const std::string& method,
                                              int64_t num_layers, const std::vector<std::string>& modules,
                                              bool activation_function, int64_t activation_function_num_layers,
                                              bool norm, int64_t norm_num_layers, const std::string& prefix);

}  // namespace kestrel::model
