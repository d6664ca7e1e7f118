#include "rollout/scheduler.h"

#include <algorithm>

#include "core/status.h"

namespace kestrel::rollout {

Scheduler::Scheduler(const SchedulerConfig& cfg, BlockPool& pool, SwapSpace* swap)
    : cfg_(cfg), pool_(pool), swap_(swap) {
  KS_CHECK(cfg.block_size > 0 && cfg.max_num_batched_tokens > 0 && cfg.max_num_seqs > 0, "bad scheduler config");
  KS_CHECK(!cfg.swap_mode || swap != nullptr, "swap preemption needs a swap space");
}

void Scheduler::add(Sequence* s) {
  s->status = SeqStatus::Waiting;
  waiting_.push_back(s);
}

int64_t Scheduler::group_size(const Sequence* s) const {
  return s->pending_fork ? std::max<int64_t>(1, s->req->params.n) : 1;
}

void Scheduler::register_full_blocks(Sequence* s, int64_t upto_tokens) {
  if (!pool_.caching()) return;
  const int64_t full = std::min<int64_t>(upto_tokens, s->num_tokens()) / cfg_.block_size;
  if (full <= s->num_registered) return;
  extend_block_hashes(s->tokens, cfg_.block_size, s->hash_key, s->hashes);
  for (int64_t b = s->num_registered; b < full; ++b) pool_.cache_block(s->blocks[size_t(b)], s->hashes[size_t(b)]);
  s->num_registered = full;
}

std::vector<int32_t> Scheduler::prefix_hits(Sequence* s) {
  std::vector<int32_t> hits;
  if (!pool_.caching() || s->num_computed != 0 || !s->blocks.empty()) return hits;
  extend_block_hashes(s->tokens, cfg_.block_size, s->hash_key, s->hashes);
  // At most num_tokens - 1 tokens hit: the last one must be computed for its logits.
  const int64_t max_blocks = (s->num_tokens() - 1) / cfg_.block_size;
  for (int64_t b = 0; b < max_blocks; ++b) {
    auto id = pool_.lookup(s->hashes[size_t(b)]);
    if (!id) break;
    hits.push_back(*id);
  }
  return hits;
}

bool Scheduler::allocate_slots(Sequence* s, int64_t n, const std::vector<int32_t>& hits) {
  const int64_t computed = s->num_computed + int64_t(hits.size()) * cfg_.block_size;
  const int64_t need = blocks_for(computed + n) - int64_t(s->blocks.size()) - int64_t(hits.size());
  int64_t evictable_hits = 0;
  for (int32_t id : hits) evictable_hits += pool_.ref_cnt(id) == 0;
  if (need > pool_.num_free() - evictable_hits) return false;
  pool_.touch(hits);
  s->blocks.insert(s->blocks.end(), hits.begin(), hits.end());
  if (!hits.empty()) s->num_registered = int64_t(hits.size());
  if (need > 0) {
    auto fresh = pool_.allocate(need);
    s->blocks.insert(s->blocks.end(), fresh.begin(), fresh.end());
  }
  // Registered now, before the forward: a later sequence of this same step
  // can hit them, since every layer writes its K/V before its attention reads.
  register_full_blocks(s, computed + n);
  return true;
}

void Scheduler::preempt_recompute(Sequence* s) {
  pool_.free(s->blocks);
  s->blocks.clear();
  s->num_computed = 0;
  s->num_registered = 0;
  s->status = SeqStatus::Waiting;
}

void Scheduler::preempt(Sequence* v, SchedulerOutput& out) {
  ++counters_.preemptions;
  ++out.num_preempted;
  // Swap only sequences whose whole context is computed (decoding): a
  // partial prefill is cheaper to recompute than to move.
  const bool decoding = v->num_computed >= v->num_tokens() - 1 && v->num_computed >= v->prompt_len;
  if (cfg_.swap_mode && decoding && !v->blocks.empty()) {
    auto host = swap_->reserve(int64_t(v->blocks.size()));
    if (!host.empty()) {
      for (size_t i = 0; i < host.size(); ++i) out.swap_out.emplace_back(v->blocks[i], host[i]);
      counters_.swapped_out_blocks += int64_t(host.size());
      // Freed now; the copies run before this step's forward writes anything.
      pool_.free(v->blocks);
      v->blocks.clear();
      v->num_registered = 0;
      v->swap_blocks = std::move(host);
      v->status = SeqStatus::Swapped;
      swapped_.push_front(v);  // victims come newest first: the oldest ends up in front
      return;
    }
  }
  preempt_recompute(v);
  waiting_.push_front(v);
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = cfg_.max_num_batched_tokens;
  auto emit = [&](Sequence* s, int64_t n) {
    out.seqs.push_back({s, s->num_computed, n, s->num_computed + n == s->num_tokens()});
    s->num_computed += n;
    out.num_tokens += n;
    budget -= n;
  };

  // Phase 1: running sequences in admission order; preempt from the back.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int64_t n = std::min(s->num_tokens() - s->num_computed, budget);
    KS_CHECK(n > 0, "running sequence ", s->id, " has nothing to compute");
    bool self_preempted = false;
    while (!allocate_slots(s, n, {})) {
      Sequence* victim = running_.back();
      running_.pop_back();
      preempt(victim, out);
      if (victim == s) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;
    emit(s, n);
    ++i;
  }
  const bool preempted = out.num_preempted > 0;
  int64_t seats = 0;
  for (Sequence* s : running_) seats += group_size(s);

  // Phase 2: swapped sequences come back first (never in a step that preempted).
  while (!preempted && !swapped_.empty() && budget > 0) {
    Sequence* s = swapped_.front();
    if (seats + 1 > cfg_.max_num_seqs && !running_.empty()) break;
    const int64_t n = s->num_tokens() - s->num_computed;  // 1: swapped sequences were decoding
    const int64_t need = blocks_for(s->num_computed + n);
    if (need > pool_.num_free() || n > budget) break;
    auto dev = pool_.allocate(int64_t(s->swap_blocks.size()));
    for (size_t i = 0; i < dev.size(); ++i) out.swap_in.emplace_back(s->swap_blocks[i], dev[i]);
    counters_.swapped_in_blocks += int64_t(dev.size());
    // The host blocks are free for reuse after this step's copies; nothing
    // swaps out in a step that swaps in.
    swap_->release(s->swap_blocks);
    s->swap_blocks.clear();
    s->blocks = std::move(dev);
    s->num_registered = 0;
    swapped_.pop_front();
    KS_CHECK(allocate_slots(s, n, {}), "swap-in of sequence ", s->id, " lost its blocks");
    s->status = SeqStatus::Running;
    running_.push_back(s);
    ++seats;
    emit(s, n);
  }

  // Phase 3: waiting sequences (new, or preempted for recompute), FCFS.
  while (!preempted && swapped_.empty() && !waiting_.empty() && budget > 0) {
    Sequence* s = waiting_.front();
    const int64_t g = group_size(s);
    if (seats + g > cfg_.max_num_seqs && !running_.empty()) break;
    const auto hits = prefix_hits(s);
    const int64_t cached = int64_t(hits.size()) * cfg_.block_size;
    const int64_t remaining = s->num_tokens() - s->num_computed - cached;
    // Without chunked prefill a prompt runs whole or waits; one that can never
    // fit the budget (a long recompute after preemption) is chunked anyway.
    if (!cfg_.enable_chunked_prefill && remaining > budget && remaining <= cfg_.max_num_batched_tokens) break;
    const int64_t n = std::min(remaining, budget);
    if (!allocate_slots(s, n, hits)) break;
    waiting_.pop_front();
    s->num_computed += cached;
    if (!s->admitted_once) {
      s->admitted_once = true;
      if (s->sample == 0) {
        counters_.prefix_queries += s->prompt_len;
        counters_.prefix_hits += std::min(cached, s->prompt_len);
        s->req->num_cached_prompt_tokens = std::min(cached, s->prompt_len);
      }
    }
    s->status = SeqStatus::Running;
    running_.push_back(s);
    seats += g;
    emit(s, n);
  }
  KS_DCHECK(out.num_tokens <= cfg_.max_num_batched_tokens, "scheduled over budget");
  return out;
}

std::vector<std::pair<int32_t, int32_t>> Scheduler::fork(Sequence* parent, const std::vector<Sequence*>& children) {
  std::vector<std::pair<int32_t, int32_t>> copies;
  const int64_t bs = cfg_.block_size;
  const int64_t full = parent->prompt_len / bs, partial = parent->prompt_len % bs;
  KS_CHECK(parent->num_computed >= parent->prompt_len && int64_t(parent->blocks.size()) >= full + (partial > 0),
           "fork before the prompt of sequence ", parent->id, " is computed");
  for (Sequence* c : children) {
    if (partial > 0 && pool_.num_free() < 1) {  // no room for its own tail block: recompute later
      c->status = SeqStatus::Waiting;
      waiting_.push_front(c);
      continue;
    }
    c->blocks.assign(parent->blocks.begin(), parent->blocks.begin() + full);
    pool_.touch(c->blocks);
    if (partial > 0) {
      const int32_t own = pool_.allocate(1)[0];
      copies.emplace_back(parent->blocks[size_t(full)], own);
      c->blocks.push_back(own);
    }
    c->num_computed = c->prompt_len;
    c->hashes.assign(parent->hashes.begin(), parent->hashes.begin() + std::min<int64_t>(full, int64_t(parent->hashes.size())));
    c->num_registered = std::min(parent->num_registered, full);
    c->admitted_once = true;
    c->status = SeqStatus::Running;
    running_.push_back(c);
  }
  parent->pending_fork = false;
  return copies;
}

void Scheduler::finish(Sequence* s) {
  pool_.free(s->blocks);
  s->blocks.clear();
  if (!s->swap_blocks.empty()) swap_->release(s->swap_blocks);
  s->swap_blocks.clear();
  // Usually running; a forked child that found no block finishes from waiting.
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
  swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), s), swapped_.end());
  s->status = SeqStatus::Finished;
}

void Scheduler::preempt_all() {
  std::deque<Sequence*> order;
  for (Sequence* s : running_) {
    preempt_recompute(s);
    order.push_back(s);
  }
  running_.clear();
  for (Sequence* s : swapped_) {
    swap_->release(s->swap_blocks);
    s->swap_blocks.clear();
    s->num_computed = 0;
    s->num_registered = 0;
    s->status = SeqStatus::Waiting;
    order.push_back(s);
  }
  swapped_.clear();
  for (Sequence* s : waiting_) order.push_back(s);
  waiting_ = std::move(order);
}

}  // namespace kestrel::rollout
