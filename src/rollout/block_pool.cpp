#include "rollout/block_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/status.h"

namespace kestrel::rollout {

namespace {
// The chain's root: a fixed constant (vLLM's NONE_HASH with PYTHONHASHSEED set),
// so hashes are reproducible across runs and engines.
constexpr BlockHash kRootHash{0x6b657374726f6c31ull, 0x726f6c6c6f757421ull};
constexpr uint64_t kHashSeed = 0x4b455354'52454c00ull;
}  // namespace

BlockHash hash_block_tokens(const BlockHash* parent, const int32_t* tokens, int64_t n, uint64_t extra_key) {
  // Input bytes: parent (16) | extra key (8) | token ids (4 each), in host
  // (little-endian) byte order; one contiguous buffer, one XXH3 call.
  const BlockHash p = parent ? *parent : kRootHash;
  constexpr size_t kHead = 24;
  uint8_t stack_buf[kHead + 4 * 64];
  std::vector<uint8_t> heap_buf;
  const size_t bytes = kHead + size_t(n) * sizeof(int32_t);
  uint8_t* buf = stack_buf;
  if (bytes > sizeof stack_buf) {
    heap_buf.resize(bytes);
    buf = heap_buf.data();
  }
  std::memcpy(buf, &p.lo, 8);
  std::memcpy(buf + 8, &p.hi, 8);
  std::memcpy(buf + 16, &extra_key, 8);
  if (n > 0) std::memcpy(buf + kHead, tokens, size_t(n) * sizeof(int32_t));
  const XXH128_hash_t h = XXH3_128bits_withSeed(buf, bytes, kHashSeed);
  return BlockHash{h.low64, h.high64};
}

void extend_block_hashes(const std::vector<int32_t>& tokens, int64_t block_size, uint64_t extra_key,
                         std::vector<BlockHash>& hashes) {
  const int64_t full = int64_t(tokens.size()) / block_size;
  for (int64_t b = int64_t(hashes.size()); b < full; ++b) {
    const BlockHash* parent = b > 0 ? &hashes[size_t(b - 1)] : nullptr;
    hashes.push_back(hash_block_tokens(parent, tokens.data() + b * block_size, block_size, extra_key));
  }
}

BlockPool::BlockPool(int64_t num_blocks, bool enable_caching) : caching_(enable_caching) {
  KS_CHECK(num_blocks >= 2, "the KV cache needs at least 2 blocks (one is the null block), got ", num_blocks);
  KS_CHECK(num_blocks < (int64_t(1) << 31), "too many KV blocks: ", num_blocks);
  blocks_.resize(size_t(num_blocks));
  // Initially ordered by id; block 0 is the null block and never enters the queue.
  for (int32_t i = 1; i < int32_t(num_blocks); ++i) push_back(i);
  blocks_[0].ref_cnt = 1;  // pinned: never freed, never counted
}

void BlockPool::unlink(int32_t id) {
  Block& b = blocks_[size_t(id)];
  KS_DCHECK(b.in_free, "block ", id, " is not in the free queue");
  if (b.prev >= 0) blocks_[size_t(b.prev)].next = b.next; else head_ = b.next;
  if (b.next >= 0) blocks_[size_t(b.next)].prev = b.prev; else tail_ = b.prev;
  b.prev = b.next = -1;
  b.in_free = false;
  --num_free_;
}

void BlockPool::push_back(int32_t id) {
  Block& b = blocks_[size_t(id)];
  b.prev = tail_;
  b.next = -1;
  if (tail_ >= 0) blocks_[size_t(tail_)].next = id; else head_ = id;
  tail_ = id;
  b.in_free = true;
  ++num_free_;
}

void BlockPool::push_front(int32_t id) {
  Block& b = blocks_[size_t(id)];
  b.next = head_;
  b.prev = -1;
  if (head_ >= 0) blocks_[size_t(head_)].prev = id; else tail_ = id;
  head_ = id;
  b.in_free = true;
  ++num_free_;
}

void BlockPool::evict_hash(int32_t id) {
  Block& b = blocks_[size_t(id)];
  if (!b.hashed) return;
  auto it = map_.find(b.hash);
  if (it != map_.end() && it->second == id) map_.erase(it);
  b.hashed = false;
  b.hash = BlockHash{};
}

std::vector<int32_t> BlockPool::allocate(int64_t n) {
  KS_CHECK(n >= 0 && n <= num_free_, "BlockPool::allocate(", n, ") with ", num_free_, " free blocks");
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = head_;
    unlink(id);
    evict_hash(id);  // lazy eviction: the LRU cached block loses its hash only now
    blocks_[size_t(id)].ref_cnt = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::free(const std::vector<int32_t>& ids) {
  std::vector<int32_t> unhashed;
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const int32_t id = *it;
    if (id == kNullBlock) continue;
    Block& b = blocks_.at(size_t(id));
    KS_CHECK(b.ref_cnt > 0, "double free of KV block ", id);
    if (--b.ref_cnt == 0) {
      if (b.hashed) push_back(id);
      else unhashed.push_back(id);
    }
  }
  // Head order = the same reverse order: the request's tail block is reused first.
  for (auto it = unhashed.rbegin(); it != unhashed.rend(); ++it) push_front(*it);
}

void BlockPool::touch(const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id == kNullBlock) continue;
    Block& b = blocks_.at(size_t(id));
    if (b.ref_cnt == 0) unlink(id);
    ++b.ref_cnt;
  }
}

std::optional<int32_t> BlockPool::lookup(const BlockHash& h) const {
  if (!caching_) return std::nullopt;
  auto it = map_.find(h);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

bool BlockPool::cache_block(int32_t id, const BlockHash& h) {
  if (!caching_ || id == kNullBlock) return false;
  Block& b = blocks_.at(size_t(id));
  if (b.hashed) return b.hash == h;
  if (map_.count(h)) return false;
  b.hashed = true;
  b.hash = h;
  map_.emplace(h, id);
  return true;
}

bool BlockPool::reset_prefix_cache() {
  if (num_free_ != num_blocks() - 1) return false;
  for (auto& b : blocks_) {
    b.hashed = false;
    b.hash = BlockHash{};
  }
  map_.clear();
  return true;
}

std::vector<int32_t> BlockPool::free_queue() const {
  std::vector<int32_t> q;
  for (int32_t id = head_; id >= 0; id = blocks_[size_t(id)].next) q.push_back(id);
  return q;
}

void BlockPool::check_invariants() const {
  int64_t n = 0;
  int32_t prev = -1;
  for (int32_t id = head_; id >= 0; id = blocks_[size_t(id)].next) {
    const Block& b = blocks_[size_t(id)];
    KS_CHECK(b.in_free && b.ref_cnt == 0 && b.prev == prev, "free queue corrupt at block ", id);
    prev = id;
    ++n;
  }
  KS_CHECK(prev == tail_ && n == num_free_, "free queue count ", n, " vs ", num_free_);
  for (size_t i = 1; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    KS_CHECK(b.ref_cnt >= 0 && (b.ref_cnt == 0) == b.in_free, "block ", i, " ref ", b.ref_cnt, " in_free ", b.in_free);
    if (b.hashed) {
      auto it = map_.find(b.hash);
      KS_CHECK(it != map_.end() && it->second == int32_t(i), "hashed block ", i, " missing from the map");
    }
  }
  for (const auto& [h, id] : map_) KS_CHECK(blocks_[size_t(id)].hashed && blocks_[size_t(id)].hash == h, "map entry");
}

}  // namespace kestrel::rollout
