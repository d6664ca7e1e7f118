// A context-parallel rank's share of a packed batch, and the row maps between
// that share and the full batch.
//
// Under context parallelism (ModelParallel::cp, cp > 1) every cp rank of a
// data-parallel slice receives the same full micro-batch; each trains and
// scores its rows of every sequence (chunks r and 2cp-1-r, parallel/
// cp_split.h): the embedding, norms, projections, MLP and head run on those
// rows alone, attention goes through parallel/cp_attention.h. The per-token
// objective (train/token_objective.h) still sees the full batch's rows: the
// log-probs and entropies of the local rows are gathered to every cp rank, the
// objective runs there (the same on each), and the rank's rows of its
// gradients flow back. Pad rows (sequences padded to a multiple of 2cp) have
// no target and never reach a loss.
//
// Prompt sharing (PackedBatch::prefix_of) is off under context parallelism:
// a prompt's rows and its samples' rows would sit on different cp ranks in
// different chunks, so the trainers pack whole sequences when cp > 1.
#pragma once
#include "model/batch.h"
#include "model/transformer.h"

namespace kestrel::model {

// The batch this rank runs: `full` itself without context parallelism, else
// its local rows with PackedBatch::cp set. Fails on prompt sharing or routing
// replay (MoE models refuse cp), naming the reason.
PackedBatch cp_local_batch(const CausalLM& model, const PackedBatch& full);

// The full batch's rows [T, ...] of a per-row tensor of this rank's rows
// [Tl, ...] (pad rows dropped); `local` itself without cp. Collective over
// the cp group (one all-gather).
Tensor cp_full_rows(const CausalLM& model, const PackedBatch& batch, const Tensor& local);

// This rank's rows [Tl, ...] of a per-row tensor of the full batch [T, ...],
// `pad_fill` on pad rows; `full` itself without cp.
Tensor cp_rank_rows(const PackedBatch& batch, const Tensor& full, float pad_fill);

}  // namespace kestrel::model
