// A request (one prompt, n samples) and its sequences (one per sample), the
// state the scheduler moves between its queues.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rollout/block_pool.h"
#include "rollout/engine.h"

namespace kestrel::rollout {

enum class SeqStatus { Waiting, Running, Swapped, Finished };

struct Request;

struct Sequence {
  int64_t id = 0;
  Request* req = nullptr;
  int64_t sample = 0;             // index within the request: part of the RNG key
  std::vector<int32_t> tokens;    // prompt + generated
  int64_t prompt_len = 0;
  // Tokens whose K/V is in the cache (or scheduled to be written this step).
  // A decoding sequence has num_computed == tokens.size() - 1: the last
  // sampled token's K/V is computed by the step that samples the next one.
  int64_t num_computed = 0;
  std::vector<int32_t> blocks;    // block table: block i holds positions [i*bs, (i+1)*bs)
  std::vector<BlockHash> hashes;  // of every full block of tokens; kept across preemption
  uint64_t hash_key = 0;          // weight version the sequence started under (extra hash key)
  int64_t num_registered = 0;     // leading blocks already offered to the prefix cache
  std::vector<int32_t> swap_blocks;  // host blocks while swapped out
  SeqStatus status = SeqStatus::Waiting;
  bool admitted_once = false;     // prefix-cache statistics count first admissions only
  // Sample 0 of an n > 1 request before its prompt is computed: samples
  // 1..n-1 are forked from it once the prompt's K/V exists.
  bool pending_fork = false;

  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::string finish_reason;
  // EngineConfig::record_routing: [num_tokens, n_moe_layers, k] flattened,
  // gathered from the routing cache when the sequence finishes.
  std::vector<int32_t> routed_experts;

  int64_t num_generated() const { return int64_t(tokens.size()) - prompt_len; }
  int64_t num_tokens() const { return int64_t(tokens.size()); }
};

struct Request {
  std::string id;
  int64_t order = 0;  // addition order: run_to_completion returns outputs in it
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<std::unique_ptr<Sequence>> seqs;  // by sample index; fewer than n before the fork
  int64_t num_finished = 0;
  int64_t num_cached_prompt_tokens = 0;
  // Longest stop string in bytes (bounds the detokenized tail that is searched).
  size_t max_stop_len = 0;
};

}  // namespace kestrel::rollout
