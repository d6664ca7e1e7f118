#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <queue>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

std::string byte_token(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

}  // namespace

// Open-addressing map (left id, right id) -> (rank, merged id): probed for every adjacent pair on
// each merge step, so it is kept flat.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = ~uint64_t{0};
    uint32_t rank = kNoRank;
    int32_t id = -1;
  };
  std::vector<Slot> slots;
  uint64_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t home(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> 20 & mask; }
  // A later duplicate overwrites the earlier rank, as HF's HashMap collect does.
  void put(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t k = key(a, b);
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == k || slots[i].rank == kNoRank) {
        slots[i] = {k, rank, id};
        return;
      }
    }
  }
  const Slot* get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t i = home(k);; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].rank == kNoRank) return nullptr;
    }
  }
};

// Word -> ids, sharded so that threads encoding a batch rarely wait on each other. A full shard is
// cleared rather than evicted piecemeal: hot words come back within a few documents.
struct BpeModel::Cache {
  static constexpr size_t kShards = 64;
  struct Shard {
    std::mutex mu;
    StrMap<std::vector<int32_t>> map;
  };
  Shard shards[kShards];
  size_t per_shard;
  explicit Cache(size_t capacity) : per_shard(std::max<size_t>(1, capacity / kShards)) {}
  Shard& shard(size_t h) { return shards[(h >> 7) % kShards]; }
};

BpeModel::BpeModel(StrMap<int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions opts)
    : opts_(opts), vocab_(std::move(vocab)) {
  merges_ = std::make_unique<MergeTable>(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end())
      KS_FAIL("merge #", r, " (\"", a, "\", \"", b, "\") refers to a token missing from model.vocab");
    if (iab == vocab_.end())
      KS_FAIL("merge #", r, " (\"", a, "\", \"", b, "\") makes \"", a + b, "\", which is missing from model.vocab");
    merges_->put(ia->second, ib->second, static_cast<uint32_t>(r), iab->second);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_token(static_cast<unsigned char>(b)));
    byte_fallback_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (opts_.byte_level) {
    const auto& b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      append_utf8(ch, b2u[b]);
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) {
        byte_init_[b] = {ByteInit::kKnown, {it->second}};
        continue;
      }
      std::vector<int32_t> fb;
      if (opts_.byte_fallback) {
        for (unsigned char u : ch) {
          if (byte_fallback_ids_[u] < 0) { fb.clear(); break; }
          fb.push_back(byte_fallback_ids_[u]);
        }
      }
      byte_init_[b] = fb.empty() ? ByteInit{ByteInit::kUnknown, {}} : ByteInit{ByteInit::kFallback, fb};
    }
    // Whole-word lookups (ignore_merges) see raw bytes: re-key the tokens that map back to bytes.
    for (const auto& [tok, id] : vocab_) {
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < tok.size() && ok;) {
        size_t len;
        const int b = unicode_to_byte(decode_utf8(tok, i, len));
        ok = b >= 0;
        raw.push_back(static_cast<char>(b));
        i += len;
      }
      if (ok) byte_vocab_.emplace(std::move(raw), id);
    }
  }
  if (opts_.cache_capacity > 0) cache_ = std::make_unique<Cache>(opts_.cache_capacity);
}

BpeModel::~BpeModel() = default;

// HF's merge_word: known characters flush a pending unk; byte-fallback tokens do not (they are
// pushed before it, exactly as HF does); unknown characters start or extend (fuse_unk) an unk.
void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& syms) const {
  syms.clear();
  int32_t pending_unk = -1;  // unk id while one is pending
  auto known = [&](int32_t id) {
    if (pending_unk >= 0) { syms.push_back(pending_unk); pending_unk = -1; }
    syms.push_back(id);
  };
  auto unknown = [&] {
    if (opts_.unk_id < 0) return;  // no unk token: the character is dropped
    if (pending_unk >= 0 && !opts_.fuse_unk) syms.push_back(pending_unk);
    pending_unk = opts_.unk_id;
  };
  if (opts_.byte_level) {
    for (unsigned char b : word) {
      const ByteInit& init = byte_init_[b];
      if (init.kind == ByteInit::kKnown) known(init.ids[0]);
      else if (init.kind == ByteInit::kUnknown) unknown();
      else syms.insert(syms.end(), init.ids.begin(), init.ids.end());
    }
  } else {
    for (size_t i = 0; i < word.size();) {
      size_t len;
      decode_utf8(word, i, len);
      const std::string_view ch = word.substr(i, len);
      i += len;
      auto it = vocab_.find(ch);
      if (it != vocab_.end()) { known(it->second); continue; }
      if (opts_.byte_fallback) {
        bool all = true;
        for (unsigned char u : ch) all = all && byte_fallback_ids_[u] >= 0;
        if (all) {
          for (unsigned char u : ch) syms.push_back(byte_fallback_ids_[u]);
          continue;
        }
      }
      unknown();
    }
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
}

// Small words: rescan the pair ranks each step (a flat uint32 scan, no heap traffic).
void BpeModel::merge_linear(std::vector<int32_t>& syms) const {
  if (syms.size() < 2) return;
  thread_local std::vector<uint32_t> rank;  // [n-1] rank of merging (syms[i], syms[i+1])
  thread_local std::vector<int32_t> merged;  // [n-1] the id that merge makes
  size_t n = syms.size();
  rank.resize(n - 1);
  merged.resize(n - 1);
  auto look = [&](size_t i) {
    const auto* m = merges_->get(syms[i], syms[i + 1]);
    rank[i] = m ? m->rank : kNoRank;
    merged[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) look(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == kNoRank) break;
    syms[best] = merged[best];
    syms.erase(syms.begin() + static_cast<ptrdiff_t>(best) + 1);
    rank.erase(rank.begin() + static_cast<ptrdiff_t>(best));
    merged.erase(merged.begin() + static_cast<ptrdiff_t>(best));
    --n;
    if (best > 0) look(best - 1);
    if (best + 1 < n) look(best);
  }
}

// Long words (digit runs, repeated characters): HF's priority queue over a linked list of symbols.
void BpeModel::merge_heap(std::vector<int32_t>& syms) const {
  const size_t n = syms.size();
  if (n < 2) return;
  struct Sym { int32_t id; int32_t prev, next; bool alive; };
  std::vector<Sym> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = {syms[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  struct Cand { uint32_t rank; int32_t pos; int32_t id; };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> q(worse);
  for (size_t i = 0; i + 1 < n; ++i)
    if (auto* m = merges_->get(s[i].id, s[i + 1].id)) q.push({m->rank, int32_t(i), m->id});
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& left = s[c.pos];
    if (!left.alive || left.next < 0) continue;
    const Sym& right = s[left.next];
    const auto* m = merges_->get(left.id, right.id);
    if (!m || m->id != c.id) continue;  // stale: a neighbour merged since this was queued
    const int32_t gone = left.next;
    left.id = c.id;
    left.next = right.next;
    s[gone].alive = false;
    if (left.next >= 0) s[left.next].prev = c.pos;
    if (left.prev >= 0)
      if (auto* p = merges_->get(s[left.prev].id, left.id)) q.push({p->rank, left.prev, p->id});
    if (left.next >= 0)
      if (auto* p = merges_->get(left.id, s[left.next].id)) q.push({p->rank, c.pos, p->id});
  }
  syms.clear();
  for (int32_t i = 0; i >= 0; i = s[i].next) syms.push_back(s[i].id);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (opts_.ignore_merges) {
    const auto& v = opts_.byte_level ? byte_vocab_ : vocab_;
    auto it = v.find(word);
    if (it != v.end()) { out.push_back(it->second); return; }
  }
  const bool use_cache = cache_ && cache_enabled_ && word.size() <= 256;
  size_t h = 0;
  if (use_cache) {
    h = std::hash<std::string_view>{}(word);
    auto& sh = cache_->shard(h);
    std::lock_guard<std::mutex> lk(sh.mu);
    auto it = sh.map.find(word);
    if (it != sh.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  initial_symbols(word, syms);
  if (syms.size() <= linear_limit_) merge_linear(syms);
  else merge_heap(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (use_cache) {
    auto& sh = cache_->shard(h);
    std::lock_guard<std::mutex> lk(sh.mu);
    if (sh.map.size() >= cache_->per_shard) sh.map.clear();
    sh.map.emplace(std::string(word), syms);
  }
}

}  // namespace kestrel::tokenizer
