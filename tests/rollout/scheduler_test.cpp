// Scheduler policy with hand-driven sequences (no model): token budget and
// chunking, running-first order, newest-first preemption, n-sample forks.
#include <gtest/gtest.h>

#include "rollout/scheduler.h"

using namespace kestrel::rollout;

namespace {

struct Fixture {
  BlockPool pool;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> reqs;
  Fixture(int64_t blocks, SchedulerConfig c, bool caching = false) : pool(blocks, caching), sched(c, pool, nullptr) {}
  Sequence* add(int64_t prompt_len, int64_t n = 1, int32_t first_token = 1) {
    auto r = std::make_unique<Request>();
    r->params.n = n;
    for (int64_t i = 0; i < prompt_len; ++i) r->prompt.push_back(first_token + int32_t(i));
    auto s = std::make_unique<Sequence>();
    s->id = int64_t(reqs.size());
    s->req = r.get();
    s->tokens = r->prompt;
    s->prompt_len = prompt_len;
    s->pending_fork = n > 1;
    Sequence* p = s.get();
    r->seqs.push_back(std::move(s));
    reqs.push_back(std::move(r));
    sched.add(p);
    return p;
  }
};

SchedulerConfig cfg(int64_t budget, int64_t bs = 4) {
  SchedulerConfig c;
  c.block_size = bs;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 8;
  return c;
}

// What the engine does after the forward: sampled sequences get a token.
void sample_all(const SchedulerOutput& o) {
  for (const auto& s : o.seqs)
    if (s.samples) s.seq->tokens.push_back(7);
}

}  // namespace

TEST(Scheduler, ChunkedPrefillUnderTheBudgetAndDecodesFirst) {
  Fixture f(32, cfg(10));
  Sequence* a = f.add(8);
  Sequence* b = f.add(8);
  auto o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].seq, a);
  EXPECT_EQ(o.seqs[0].num_tokens, 8);
  EXPECT_TRUE(o.seqs[0].samples);
  EXPECT_EQ(o.seqs[1].seq, b);
  EXPECT_EQ(o.seqs[1].num_tokens, 2);  // chunk bounded by what is left of the budget
  EXPECT_FALSE(o.seqs[1].samples);
  EXPECT_EQ(a->blocks, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(b->blocks, (std::vector<int32_t>{3}));
  sample_all(o);
  o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].seq, a);  // a's decode first, then b's next chunk
  EXPECT_EQ(o.seqs[0].start, 8);
  EXPECT_EQ(o.seqs[0].num_tokens, 1);
  EXPECT_EQ(o.seqs[1].num_tokens, 6);
  EXPECT_TRUE(o.seqs[1].samples);
  EXPECT_EQ(a->blocks.size(), 3u);  // position 8 opened a third block
  EXPECT_EQ(o.num_tokens, 7);
}

TEST(Scheduler, WithoutChunkingAPromptRunsWholeOrWaits) {
  SchedulerConfig c = cfg(10);
  c.enable_chunked_prefill = false;
  Fixture f(32, c);
  f.add(8);
  Sequence* b = f.add(8);
  auto o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);  // b does not fit in the 2 tokens left
  EXPECT_EQ(f.sched.waiting().front(), b);
  sample_all(o);
  o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[1].seq, b);
  EXPECT_EQ(o.seqs[1].num_tokens, 8);
}

TEST(Scheduler, PreemptsTheNewestRunningSequence) {
  // 6 usable blocks of 4; three sequences of 8 tokens take 2 each.
  Fixture f(7, cfg(64));
  Sequence* a = f.add(8);
  Sequence* b = f.add(8);
  Sequence* c = f.add(8);
  auto o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 3u);
  EXPECT_EQ(f.pool.num_free(), 0);
  sample_all(o);
  // Every decode now needs a third block and none is free: a preempts c
  // (the newest), whose two blocks then serve a and b.
  o = f.sched.schedule();
  EXPECT_EQ(o.num_preempted, 1);
  ASSERT_EQ(o.seqs.size(), 2u);
  EXPECT_EQ(o.seqs[0].seq, a);
  EXPECT_EQ(o.seqs[1].seq, b);
  ASSERT_EQ(f.sched.waiting().size(), 1u);
  EXPECT_EQ(f.sched.waiting()[0], c);  // re-queued at the front, not re-admitted this step
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_TRUE(c->blocks.empty());
  EXPECT_EQ(c->num_tokens(), 9);  // keeps its sampled token: recompute covers prompt + output
  EXPECT_EQ(f.sched.counters().preemptions, 1);
  sample_all(o);
  // Next step: a and b decode within their third blocks; c waits for room.
  o = f.sched.schedule();
  EXPECT_EQ(o.num_preempted, 0);
  EXPECT_EQ(o.seqs.size(), 2u);
  f.sched.finish(a);
  f.sched.finish(b);
  sample_all(o);
  o = f.sched.schedule();  // c comes back and recomputes all 9 tokens
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.seqs[0].seq, c);
  EXPECT_EQ(o.seqs[0].start, 0);
  EXPECT_EQ(o.seqs[0].num_tokens, 9);
  EXPECT_TRUE(o.seqs[0].samples);
}

TEST(Scheduler, ForkSharesFullBlocksAndCopiesThePartialOne) {
  Fixture f(32, cfg(64));
  Sequence* p = f.add(10, 3);  // blocks: 2 full + 1 partial
  auto o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(p->blocks, (std::vector<int32_t>{1, 2, 3}));
  std::vector<std::unique_ptr<Sequence>> kids;
  std::vector<Sequence*> raw;
  for (int k = 1; k < 3; ++k) {
    kids.push_back(std::make_unique<Sequence>());
    kids.back()->req = p->req;
    kids.back()->sample = k;
    kids.back()->tokens = p->tokens;
    kids.back()->prompt_len = p->prompt_len;
    raw.push_back(kids.back().get());
  }
  const auto copies = f.sched.fork(p, raw);
  EXPECT_EQ(copies, (std::vector<std::pair<int32_t, int32_t>>{{3, 4}, {3, 5}}));
  EXPECT_EQ(raw[0]->blocks, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(raw[1]->blocks, (std::vector<int32_t>{1, 2, 5}));
  EXPECT_EQ(f.pool.ref_cnt(1), 3);
  EXPECT_EQ(f.pool.ref_cnt(3), 1);
  EXPECT_EQ(f.sched.running().size(), 3u);
  EXPECT_FALSE(p->pending_fork);
  for (auto* k : raw) f.sched.finish(k);
  f.sched.finish(p);
  EXPECT_EQ(f.pool.num_free(), 31);
  f.pool.check_invariants();
}

TEST(Scheduler, PrefixHitsAreCappedBelowTheLastToken) {
  Fixture f(32, cfg(64), /*caching=*/true);
  Sequence* a = f.add(8);
  auto o = f.sched.schedule();
  sample_all(o);
  f.sched.finish(a);
  // The same 8-token prompt: 2 full cached blocks, but the last token must be
  // computed for its logits, so only 1 block (4 tokens) hits.
  Sequence* b = f.add(8);
  o = f.sched.schedule();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.seqs[0].start, 4);
  EXPECT_EQ(o.seqs[0].num_tokens, 4);
  EXPECT_EQ(b->blocks[0], 1);  // a's first block, revived from the free queue
  EXPECT_EQ(f.sched.counters().prefix_hits, 4);
  EXPECT_EQ(f.sched.counters().prefix_queries, 16);
}
