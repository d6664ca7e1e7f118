// The paged KV cache's block bookkeeping (vLLM v1's BlockPool): fixed-size
// blocks with reference counts, a free queue in eviction (LRU) order, a null
// block that is never handed out, and automatic prefix caching by chained
// block hashes. Pure logic: the K/V arrays themselves live in KVCache.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace kestrel::rollout {

// 128-bit XXH3 digest of (parent digest, the block's token ids, extra keys).
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const BlockHash& o) const { return !(*this == o); }
};
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

// Hash of one full block. `parent` is null for a sequence's first block (the
// chain then starts from a fixed per-process seed, so equal prompts hash
// equal across engines in one process and across runs). `extra_key` carries
// what else decides the block's K/V besides its tokens: the weight version.
BlockHash hash_block_tokens(const BlockHash* parent, const int32_t* tokens, int64_t n, uint64_t extra_key);

// The chain of hashes for every full block of `tokens` (block i covers
// tokens [i*block_size, (i+1)*block_size)), extended from `hashes` in place.
void extend_block_hashes(const std::vector<int32_t>& tokens, int64_t block_size, uint64_t extra_key,
                         std::vector<BlockHash>& hashes);

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  // num_blocks includes the null block, so num_blocks - 1 are usable.
  BlockPool(int64_t num_blocks, bool enable_caching);

  int64_t num_blocks() const { return int64_t(blocks_.size()); }
  // Blocks that can be handed out now: free ones, cached-but-unreferenced included.
  int64_t num_free() const { return num_free_; }
  bool caching() const { return caching_; }

  // Pops n blocks from the head of the free queue (LRU first), evicting the
  // hash of a popped cached block; each gets ref_cnt 1. Fails (KS_CHECK) when
  // fewer than n are free: callers check num_free() first.
  std::vector<int32_t> allocate(int64_t n);
  // Drops one reference from each block. Blocks reaching 0 rejoin the free
  // queue in reverse list order (a sequence's tail hashes more tokens, so it
  // is less likely to be reused and is evicted first); hashed blocks go to
  // the tail (revivable until evicted), unhashed ones to the head (reused
  // first, nothing to lose).
  void free(const std::vector<int32_t>& ids);
  // Adds one reference to each block (prefix-cache hits, forks); a block at
  // ref_cnt 0 leaves the free queue (revived).
  void touch(const std::vector<int32_t>& ids);

  // Cached block for a hash, or nullopt.
  std::optional<int32_t> lookup(const BlockHash& h) const;
  // Registers a full block under its hash. When another block already holds
  // that hash (two sequences computed the same tokens), the map keeps the
  // first and this block stays unhashed. Returns whether it was registered.
  bool cache_block(int32_t id, const BlockHash& h);

  // Drops every hash (after a weight update the cached K/V is stale). Only
  // possible when no block is referenced; returns false otherwise.
  bool reset_prefix_cache();

  int32_t ref_cnt(int32_t id) const { return blocks_.at(size_t(id)).ref_cnt; }
  bool is_cached(int32_t id) const { return blocks_.at(size_t(id)).hashed; }
  // The free queue from head (next evicted) to tail: for tests and debugging.
  std::vector<int32_t> free_queue() const;
  int64_t num_cached_blocks() const { return int64_t(map_.size()); }
  // Checks the internal invariants (free count, list links, map consistency).
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref_cnt = 0;
    bool hashed = false;
    bool in_free = false;
    BlockHash hash;
    int32_t prev = -1, next = -1;  // intrusive doubly linked free queue
  };
  void unlink(int32_t id);
  void push_back(int32_t id);
  void push_front(int32_t id);
  void evict_hash(int32_t id);

  std::vector<Block> blocks_;
  int32_t head_ = -1, tail_ = -1;
  int64_t num_free_ = 0;
  bool caching_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> map_;
};

}  // namespace kestrel::rollout
