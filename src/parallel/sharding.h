// How full HF tensors are split over a tensor-parallel group, and back.
// Megatron shards a master weight built once (use_cpu_initialization), so a TP
// run equals the single-process run it was sharded from; Kestrel does the same
// from the HF tensors on load, and gathers them back for saving and checking.
#pragma once
#include <cstdint>
#include <string>

#include "comm/process_group.h"
#include "core/tensor.h"

namespace kestrel::parallel {

enum class ShardKind {
  Replicated,  // every rank holds the full tensor (norms, row-linear biases)
  Column,      // dim 0 split in n equal blocks: column-parallel weights [out, in] and their biases [out]
  Row,         // dim 1 split: row-parallel weights [out, in]
  Vocab,       // dim 0 split: embedding / lm_head [V, D] (same rule as Column; named for messages)
  KvHeads,     // dim 0 split by kv heads; with fewer kv heads than ranks each head is replicated
               // on n / n_kv_heads consecutive ranks (Megatron's replication of query groups)
};
const char* shard_kind_name(ShardKind k);

struct ShardSpec {
  ShardKind kind = ShardKind::Replicated;
  int64_t n_kv_heads = 0;  // KvHeads only
  // Vocab only: > 0 pads dim 0 to padded_vocab_size(len, pad_multiple, n)
  // rows when it does not divide by the n ranks (Megatron's
  // make_vocab_size_divisible_by). The padding rows are zeros in a shard and
  // dropped when gathering: the full tensor keeps the HF shape.
  int64_t pad_multiple = 0;
};

// Rows of a vocab-parallel tensor over n ranks: vocab when n == 1 or n divides
// it (or multiple is 0), else vocab rounded up to a multiple of multiple * n.
int64_t padded_vocab_size(int64_t vocab, int64_t multiple, int n);

// Query/kv heads of one rank (head-sharded attention with GQA).
struct TpHeads {
  int64_t n_heads = 0;        // local query heads: H / n
  int64_t n_kv_heads = 0;     // local kv heads: Hkv / n, or 1 when replicated
  int64_t head_begin = 0;     // first global query head
  int64_t kv_head_begin = 0;  // first global kv head
  int64_t kv_replicas = 1;    // ranks holding the same kv heads (n / Hkv when Hkv < n)
  // True for the one rank of each replica set that counts the kv tensors (grad norm, saving).
  bool kv_owner = true;
};
// Needs H % n == 0 and either Hkv % n == 0 or n % Hkv == 0; errors name the keys.
TpHeads tp_heads(int64_t n_heads, int64_t n_kv_heads, int rank, int size);

// This rank's shard of `full` (a fresh contiguous tensor, same dtype and
// category as requested). Errors name the tensor when a dim does not divide.
Tensor shard_tensor(const Tensor& full, const ShardSpec& spec, int rank, int size, const std::string& name = "",
                    MemCategory cat = MemCategory::Params);
// Shape of the shard of a tensor of shape `full`.
Shape shard_shape(const Shape& full, const ShardSpec& spec, int size, const std::string& name = "");
// The inverse: collective over `tp` (every rank calls it with its shard);
// returns the full tensor on every rank (for saving and checking).
Tensor gather_tensor(comm::ProcessGroup& tp, const Tensor& shard, const ShardSpec& spec, const Shape& full_shape,
                     MemCategory cat = MemCategory::Other);

// The rule for Llama-family HF names (Llama, Qwen2/3, Mistral):
// q_proj, gate_proj, up_proj weights and biases (routed and shared experts'
// too), MLA's q_b_proj and kv_b_proj: Column; k_proj, v_proj: KvHeads;
// o_proj, down_proj weights: Row; embed_tokens, lm_head: Vocab; everything else
// (norms, o_proj/down_proj biases, q_norm/k_norm): Replicated.
ShardSpec hf_shard_spec(const std::string& name, int64_t n_kv_heads);

}  // namespace kestrel::parallel
