#include "model/cp_batch.h"

#include <algorithm>

#include "parallel/cp_split.h"

namespace kestrel::model {

PackedBatch cp_local_batch(const CausalLM& m, const PackedBatch& full) {
  const parallel::CpGroups* g = m.cp_groups();
  if (!g) return full;
  KS_CHECK(!full.cp, "cp_local_batch: the batch is already a cp rank's share");
  KS_CHECK(!full.prefix_of.defined(),
           "context parallelism (context_parallel_size ", m.cp_size(), ") runs whole sequences: prompt sharing "
           "(prefix_of) would put a prompt and its samples on different cp ranks; pack the sequences without it");
  KS_CHECK(!full.routed_experts.defined() && full.record_routing == nullptr,
           "not supported yet: routing replay under context parallelism");
  // The share is built from the host mirrors and its tensors (and the
  // layout's tables) uploaded to the model's device, where its kernels run.
  const Device dev = m.device();
  auto L = parallel::make_cp_layout_ptr({&full.host.cu_seqlens, &full.host.positions}, g->cp->size(),
                                        g->cp->rank(), g->ulysses_degree(), dev);
  // Pad rows continue their sequence's positions (parallel/cp_split.h): the
  // longest padded sequence must fit the RoPE table. Every cp rank checks the
  // same (whole-batch) numbers, so all fail together.
  const int64_t table = m.rope().cos.size(0), two_cp = 2 * int64_t(m.cp_size());
  int64_t longest = 0;  // padded length of the longest sequence (positions start at 0: no prefix_of)
  for (int64_t c : L->chunk) longest = std::max(longest, c * two_cp);
  KS_CHECK(longest <= table, "context parallelism (context_parallel_size ", m.cp_size(),
           ") pads each sequence to a multiple of ", two_cp, " positions; a sequence of this batch then needs ",
           longest, " positions but the RoPE table (max_position_embeddings) has ", table,
           ": keep sequences within ", table - two_cp + 1, " tokens");
  PackedBatch b;
  b.cp = L;
  b.host.input_ids = L->take_local(full.host.input_ids, -1);  // pad rows: a zero embedding
  b.host.targets = L->take_local(full.host.targets, -1);      // pad rows predict nothing
  b.host.positions = L->local.positions;
  b.host.cu_seqlens = L->local.cu_seqlens;
  b.num_tokens = L->local_tokens;
  b.num_seqs = full.num_seqs;
  b.max_seqlen = L->local.max_seqlen;
  const int64_t T = b.num_tokens, B = b.num_seqs;
  b.input_ids = Tensor::from_host(b.host.input_ids, {T}, MemCategory::Activations, dev);
  b.positions = Tensor::from_host(b.host.positions, {T}, MemCategory::Activations, dev);
  b.targets = Tensor::from_host(b.host.targets, {T}, MemCategory::Activations, dev);
  b.cu_seqlens = Tensor::from_host(b.host.cu_seqlens, {B + 1}, MemCategory::Activations, dev);
  return b;
}

Tensor cp_full_rows(const CausalLM& m, const PackedBatch& b, const Tensor& local) {
  if (!b.cp) return local;
  const parallel::CpGroups* g = m.cp_groups();
  KS_CHECK(g, "cp_full_rows: a cp rank's batch on a model without context parallelism");
  return parallel::cp_gather_rows(*g->cp, *b.cp, local);
}

Tensor cp_rank_rows(const PackedBatch& b, const Tensor& full, float pad_fill) {
  if (!b.cp) return full;
  return parallel::cp_local_rows(*b.cp, full, pad_fill);
}

}  // namespace kestrel::model
