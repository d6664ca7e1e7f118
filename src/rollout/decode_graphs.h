// CUDA-graph decode (vLLM's cudagraph_mode FULL_DECODE_ONLY; verl's
// rollout.enforce_eager=false with cudagraph_capture_sizes): for a model on a
// CUDA device, the step of a uniform decode batch (one new token per sequence,
// every sequence sampled) is recorded once per capture size as a CUDA graph
// and replayed; prefill, chunked-prefill and mixed steps, and decode batches
// larger than the largest size, run eagerly (ModelRunner::execute).
//
// A batch of B sequences replays the graph of the smallest size P >= B. Its
// inputs (token ids, positions, slots, cu_q, seq_lens, block tables [P, W] with
// W the blocks of max_model_len) live in persistent device buffers, filled by
// host-to-device copies before the replay; rows B..P-1 are padding: slot -1
// (vLLM's PAD_SLOT_ID: the cache write skips them), a context of one token
// read from the null block, and their logits are dropped. Every op of the
// forward computes each row from that row alone (GEMM rows, norms, one
// sequence's attention), so padding cannot change a real row's result on the
// emulator; on a GPU cuBLAS may pick another kernel for P rows than for B
// (tests/on_device/decode_graphs_test.cpp states the tolerance).
//
// Capture is lazy, at the first decode step that fits (the KV cache must be
// allocated): every size, largest first, each after one eager warm-up run,
// into one graph-private memory pool, logged once ("CUDA graphs: captured
// decode for batch sizes [1, 2, 4, 8] in 0.30 s (graph pool 48.0 KiB)"). The graphs
// bake in the addresses of the weights and the KV cache: release() drops them
// (sleep frees the KV cache; wake_up allocates it anew, maybe elsewhere), and
// a replay first compares those addresses with the capture's and recaptures
// when any moved (weights replaced instead of updated in place).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/transformer.h"
#include "rollout/kv_cache.h"
#include "rollout/model_runner.h"

namespace kestrel::rollout {

// vLLM's default capture sizes: 1, 2, 4, then every 8 up to 256, then every
// 16, up to max_size = min(512, max_num_seqs, max_num_batched_tokens) (a
// decode batch never has more rows than either).
std::vector<int64_t> default_capture_sizes(int64_t max_num_seqs, int64_t max_num_batched_tokens);
// The sizes an engine captures: `requested` (cudagraph_capture_sizes; empty
// = the defaults) sorted and deduplicated, sizes above max_num_seqs dropped
// (they could never replay). Fails on a size < 1.
Result<std::vector<int64_t>> capture_sizes(const std::vector<int64_t>& requested, int64_t max_num_seqs,
                                           int64_t max_num_batched_tokens);

class DecodeGraphs {
 public:
  // sizes: ascending (capture_sizes()); max_blocks: the block-table width of
  // every graph (blocks of the longest sequence, max_model_len).
  DecodeGraphs(const model::CausalLM& m, KVCache& kv, ModelRunner& runner, std::vector<int64_t> sizes,
               int64_t max_blocks);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Whether a graph can run b: one token per sequence, every sequence sampled
  // in order, at most the largest size, block tables within max_blocks.
  bool fits(const StepBatch& b) const;
  // A uniform decode step of more sequences than the largest size (it runs eagerly).
  bool too_large(const StepBatch& b) const;
  // The logits [B, V] of b (fits(b)): rows 0..B-1 of the replayed graph's
  // output, valid until the next run() or release(). Captures first if needed.
  Tensor run(const StepBatch& b);
  // Drops the graphs, their pool and input buffers (sleep: their memory goes
  // back, and the KV cache they point into is freed).
  void release();
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t captures() const { return captures_; }  // capture rounds (all sizes each)
  int64_t replays() const { return replays_; }
  int64_t padding_rows() const { return padding_rows_; }  // rows replayed for padding, over all replays

 private:
  struct Impl;
  void capture_all();
  uint64_t addresses() const;  // a digest of the weights' and the KV cache's addresses

  const model::CausalLM& m_;
  KVCache& kv_;
  ModelRunner& runner_;
  std::vector<int64_t> sizes_;
  int64_t max_blocks_;
  std::unique_ptr<Impl> impl_;  // the graphs (null until captured)
  uint64_t captured_addresses_ = 0;
  int64_t captures_ = 0, replays_ = 0, padding_rows_ = 0;
};

}  // namespace kestrel::rollout
