// The asynchronous rollout (rl/async_rollout.h) and its sample store
// (rl/sample_store.h): the bounded-staleness pipeline's schedule, partial
// rollout's rounds (every token's recorded version is the one that generated
// it, every response finishes within max_split rounds, no group trains beyond
// the bound), the store surviving a checkpoint, and, on the real engine, the
// synchronous schedule giving RolloutWorker::generate's batch bit for bit and
// a continued response equal to an uninterrupted one at fixed weights.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "rl/async_rollout.h"
#include "rl/workers/actor_worker.h"
#include "rl/workers/rollout_worker.h"
#include "rollout/tiny_model.h"

namespace kestrel::rl {
namespace {

// A generator standing in for the engine: each response has a target length
// (a long tail: 1 in 5 responses is 8x the others) and its token at response
// position i under policy version v is 1000 * v + i, so the tokens themselves
// say which version generated them and where.
struct FakeEngine {
  int64_t version = 0;  // the policy version generating now
  int64_t calls = 0;
  std::map<uint64_t, int64_t> lengths;  // per (seed, sample)
  int64_t prompt_len = 3;
  int64_t long_len = 32;  // the long tail's length

  int64_t target(uint64_t seed, uint64_t sample) const {
    const uint64_t h = (seed * 0x9E3779B97F4A7C15ull) ^ (sample * 0xBF58476D1CE4E5B9ull);
    return (h % 5 == 0) ? long_len : 4;
  }
  std::vector<WireResponse> operator()(const std::vector<RoundRequest>& reqs, const ResponseSink& sink) {
    ++calls;
    std::vector<WireResponse> out;
    for (size_t k = 0; k < reqs.size(); ++k) {
      const RoundRequest& r = reqs[k];
      const int64_t have = int64_t(r.tokens.size()) - prompt_len;  // response tokens so far
      for (int64_t j = 0; j < r.n; ++j) {
        const uint64_t sample = r.sample_offset + uint64_t(j);
        const int64_t want = target(r.seed, sample);
        WireResponse w;
        w.prompt = int64_t(k);
        w.sample = j;
        const int64_t make = std::min(r.max_tokens, want - have);
        for (int64_t i = 0; i < make; ++i) {
          w.tokens.push_back(int32_t(1000 * version + have + i));
          w.logprobs.push_back(-0.5f);
        }
        w.finished = have + make >= want || !r.may_continue;
        if (sink) sink(w);  // as the engine does, before the round returns
        out.push_back(std::move(w));
      }
    }
    return out;
  }
};

struct Harness {
  FakeEngine eng;
  std::vector<std::vector<int32_t>> prompts;
  int64_t next_prompt = 0;
  std::unique_ptr<AsyncRollout> ar;
  explicit Harness(AsyncRolloutOptions o) {
    for (int i = 0; i < 64; ++i) prompts.push_back({1, 2, int32_t(i)});
    ar = std::make_unique<AsyncRollout>(
        o,
        [this, B = o.batch_prompts] {
          std::vector<int64_t> idx;
          for (int64_t k = 0; k < B; ++k) idx.push_back(next_prompt++ % 64);
          return idx;
        },
        [this](int64_t i) -> const std::vector<int32_t>& { return prompts[size_t(i)]; },
        [this](const std::vector<RoundRequest>& r, const ResponseSink& sink) { return eng(r, sink); },
        [this] { return eng.version; });
  }
  std::vector<StoredGroup> step(int64_t s, std::map<std::string, double>& m) {
    eng.version = s;  // the weights the rollout holds at step s: version s
    return ar->next_groups(s, m);
  }
};

AsyncRolloutOptions options(double t, int64_t split) {
  AsyncRolloutOptions o;
  o.batch_prompts = 4;
  o.n = 3;
  o.response_length = 32;
  o.seed = 7;
  o.staleness_threshold = t;
  o.partial_max_split = split;
  return o;
}

void expect_versions_match_tokens(const std::vector<StoredGroup>& gs) {
  for (const StoredGroup& g : gs)
    for (const StoredSample& s : g.samples) {
      ASSERT_EQ(s.tokens.size(), s.versions.size());
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        EXPECT_EQ(s.tokens[i] / 1000, s.versions[i]) << "stream " << g.stream << " token " << i;
        EXPECT_EQ(s.tokens[i] % 1000, int32_t(i)) << "a continued response skipped or repeated a position";
      }
    }
}

// Two schedules handed over the same groups: stream positions, seeds, and
// every response's tokens and per-token versions.
void expect_same_groups(const std::vector<StoredGroup>& ga, const std::vector<StoredGroup>& gb) {
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t k = 0; k < ga.size(); ++k) {
    EXPECT_EQ(ga[k].stream, gb[k].stream);
    EXPECT_EQ(ga[k].seed, gb[k].seed);
    ASSERT_EQ(ga[k].samples.size(), gb[k].samples.size());
    for (size_t j = 0; j < ga[k].samples.size(); ++j) {
      EXPECT_EQ(ga[k].samples[j].tokens, gb[k].samples[j].tokens);
      EXPECT_EQ(ga[k].samples[j].versions, gb[k].samples[j].versions);
    }
  }
}

// A partial-rollout batch trained at step `step`: every response finished
// within `max_split` rounds, whole (its target length, a log-prob per token),
// and no group beyond the staleness bound.
void expect_trained_whole(const Harness& h, const std::vector<StoredGroup>& gs, int64_t step, int64_t max_split) {
  for (const StoredGroup& g : gs) {
    EXPECT_LE(g.max_rounds(), max_split) << "a response took more than max_split rounds";
    EXPECT_LE(step - g.first_version(), h.ar->max_staleness()) << "step " << step;
    for (const StoredSample& x : g.samples) {
      EXPECT_TRUE(x.finished);
      EXPECT_EQ(int64_t(x.tokens.size()), h.eng.target(g.seed, uint64_t(&x - g.samples.data())));
      EXPECT_EQ(x.logprobs.size(), x.tokens.size());
    }
  }
}

TEST(AsyncRollout, SynchronousScheduleTrainsEachBatchAtItsOwnVersion) {
  Harness h(options(0, 1));
  for (int64_t s = 0; s < 5; ++s) {
    std::map<std::string, double> m;
    const auto gs = h.step(s, m);
    ASSERT_EQ(gs.size(), 4u);
    for (size_t k = 0; k < gs.size(); ++k) {
      EXPECT_EQ(gs[k].stream, s * 4 + int64_t(k));
      EXPECT_EQ(gs[k].seed, rollout_request_seed(7, s, int64_t(k)));  // the synchronous trainer's seeds
      EXPECT_EQ(gs[k].first_version(), s);
    }
    EXPECT_TRUE(m.empty()) << "the synchronous trainer logs no fully_async/ metrics";
    EXPECT_EQ(h.ar->store().size(), 0);
  }
  EXPECT_EQ(h.eng.calls, 5);
}

TEST(AsyncRollout, StalenessOneIsOneStepOffPolicy) {
  Harness h(options(1.0, 1));
  for (int64_t s = 0; s < 6; ++s) {
    std::map<std::string, double> m;
    const auto gs = h.step(s, m);
    ASSERT_EQ(gs.size(), 4u);
    for (const StoredGroup& g : gs) {
      EXPECT_EQ(g.stream / 4, s);
      EXPECT_EQ(g.first_version(), std::max<int64_t>(0, s - 1)) << "batch " << s;
    }
    expect_versions_match_tokens(gs);
    EXPECT_EQ(h.ar->store().size(), 4) << "one batch generated ahead";
    EXPECT_EQ(m["fully_async/staleness/max"], s == 0 ? 0.0 : 1.0);
    EXPECT_EQ(m["fully_async/count/stale_samples_processed"], double(4 * std::max<int64_t>(0, s)));
    EXPECT_EQ(m["fully_async/count/stale_trajectory_processed"], double(12 * std::max<int64_t>(0, s)));
    EXPECT_EQ(m["fully_async/count/current_param_version"], double(s));
  }
}

TEST(AsyncRollout, FractionalStalenessGeneratesPartOfTheNextBatchAhead) {
  Harness h(options(0.5, 1));  // (1 + 0.5) * 4 = 6 prompts with version 0, then 4 more per version
  EXPECT_EQ(h.ar->pipeline_target(0), 6);
  EXPECT_EQ(h.ar->pipeline_target(1), 10);
  EXPECT_EQ(h.ar->max_staleness(), 1);
  for (int64_t s = 0; s < 5; ++s) {
    std::map<std::string, double> m;
    const auto gs = h.step(s, m);
    for (size_t k = 0; k < gs.size(); ++k) {
      // Stream positions [4s, 4s + 2) were generated a version early (s >= 1), the rest at s.
      const int64_t want = (s >= 1 && k < 2) ? s - 1 : s;
      EXPECT_EQ(gs[k].first_version(), want) << "step " << s << " prompt " << k;
    }
    EXPECT_EQ(h.ar->store().size(), 2);
  }
}

TEST(AsyncRollout, PipelineGeneratesNothingPastTheLastStep) {
  AsyncRolloutOptions o = options(2.0, 1);
  o.total_steps = 3;
  Harness h(o);
  std::map<std::string, double> m;
  for (int64_t s = 0; s < 3; ++s) h.step(s, m);
  EXPECT_EQ(h.ar->store().next_stream(), 12);
  EXPECT_EQ(h.ar->store().size(), 0);
}

TEST(AsyncRollout, PartialRolloutRoundsKeepVersionsAndFinishWithinMaxSplit) {
  Harness h(options(0, 4));  // rounds of 8 tokens; long responses need 4
  EXPECT_EQ(h.ar->max_staleness(), 3);
  int64_t partial_seen = 0;
  for (int64_t s = 0; s < 12; ++s) {
    std::map<std::string, double> m;
    const auto gs = h.step(s, m);
    ASSERT_EQ(gs.size(), 4u);
    expect_versions_match_tokens(gs);
    expect_trained_whole(h, gs, s, 4);
    // A step whose store already holds B finished groups and nothing unfinished generates nothing.
    EXPECT_TRUE(m["fully_async/rollout_rounds"] >= 1.0 || h.ar->store().num_unfinished() == 0);
    partial_seen += int64_t(m["fully_async/partial/total_partial_num"]);
    EXPECT_EQ(m["fully_async/count/dropped_stale_samples"], 0.0);
  }
  EXPECT_GT(partial_seen, 0) << "the long tail never spanned rounds: the test does not test partial rollout";
  // Every group drawn so far is trained or still in the store, once.
  EXPECT_EQ(h.ar->store().next_stream(), 12 * 4 + h.ar->store().size());
}

TEST(AsyncRollout, RoundsThatFinishEverythingEqualThePipeline) {
  // Responses of at most 8 tokens and rounds of 8 (max_split 4 of 32): the rounds loop, its drawing and its
  // take give the pipeline's (max_split 1) groups, seeds, tokens and versions, one round a step.
  Harness whole(options(0, 1)), rounds(options(0, 4));
  whole.eng.long_len = rounds.eng.long_len = 8;
  for (int64_t s = 0; s < 4; ++s) {
    std::map<std::string, double> ma, mb;
    const auto ga = whole.step(s, ma), gb = rounds.step(s, mb);
    expect_same_groups(ga, gb);
    for (const StoredGroup& g : gb)
      for (const StoredSample& x : g.samples) EXPECT_EQ(x.rounds, 1);
    EXPECT_EQ(mb["fully_async/rollout_rounds"], 1.0);
    EXPECT_EQ(mb["fully_async/partial/total_partial_num"], 0.0);
    EXPECT_EQ(rounds.ar->store().size(), 0) << "nothing carried when everything finished";
  }
}

// verl's fully-async trainer runs partial rollout under a staleness
// threshold: both bounds hold at once, the store never holds more than the
// pipeline's floor((1 + t) * B) groups before a step's rounds, and after the
// first step each batch is handed over before the step's rounds run (what
// lets disaggregated rollout ranks generate while the trainer trains).
TEST(AsyncRollout, PartialRolloutUnderStalenessKeepsBothBounds) {
  for (const double t : {0.5, 1.0, 2.0}) {
    Harness h(options(t, 4));
    EXPECT_EQ(h.ar->max_staleness(), int64_t(std::ceil(t)) + 3);
    int64_t partial_seen = 0, stale_seen = 0, ready_steps = 0;
    for (int64_t s = 0; s < 12; ++s) {
      if (s > 0 && h.ar->ready(s)) ++ready_steps;
      std::map<std::string, double> m;
      const auto gs = h.step(s, m);
      ASSERT_EQ(gs.size(), 4u);
      expect_versions_match_tokens(gs);
      expect_trained_whole(h, gs, s, 4);
      for (const StoredGroup& g : gs) stale_seen = std::max(stale_seen, s - g.first_version());
      partial_seen += int64_t(m["fully_async/partial/total_partial_num"]);
      EXPECT_LE(m["fully_async/staleness/max"], double(h.ar->max_staleness()));
      EXPECT_EQ(h.ar->store().next_stream(), (s + 1) * 4 + h.ar->store().size() +
                int64_t(m["fully_async/count/dropped_stale_samples"])) << "a group lost or trained twice";
    }
    EXPECT_GT(partial_seen, 0) << "t=" << t << ": no response spanned rounds";
    EXPECT_GE(stale_seen, 1) << "t=" << t << ": nothing trained off-policy";
    EXPECT_EQ(ready_steps, 11) << "t=" << t << ": a batch waited for its step's rounds";
  }
}

// When every response fits one round, partial rollout under staleness t is
// the pipeline with staleness t: the same groups, tokens and versions.
TEST(AsyncRollout, PartialRolloutUnderStalenessWithShortResponsesIsThePipeline) {
  for (const double t : {1.0, 2.0}) {
    Harness whole(options(t, 1)), rounds(options(t, 4));
    whole.eng.long_len = rounds.eng.long_len = 8;
    for (int64_t s = 0; s < 6; ++s) {
      std::map<std::string, double> ma, mb;
      const auto ga = whole.step(s, ma), gb = rounds.step(s, mb);
      SCOPED_TRACE("t=" + std::to_string(t) + " step " + std::to_string(s));
      expect_same_groups(ga, gb);
      EXPECT_EQ(ma["fully_async/staleness/max"], mb["fully_async/staleness/max"]);
      EXPECT_EQ(whole.ar->store().next_stream(), rounds.ar->store().next_stream());
    }
  }
}

// Streaming rewards score a response the moment it finishes: the callback
// must see every response that trains, exactly once, with its whole text
// (a partial response's earlier rounds included), and none still unfinished.
TEST(AsyncRollout, FinishedCallbackSeesEachTrainedResponseOnceAndWhole) {
  for (const auto& [t, split] : std::vector<std::pair<double, int64_t>>{{0, 1}, {1, 1}, {0, 4}, {1, 4}}) {
    Harness h(options(t, split));
    std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> seen;
    h.ar->set_on_finished([&](const StoredGroup& g, int64_t k, const std::vector<int32_t>& response) {
      EXPECT_TRUE(seen.emplace(std::make_pair(g.stream, k), response).second)
          << "sample " << k << " of stream " << g.stream << " reported twice";
    });
    std::map<std::string, double> m;
    int64_t trained = 0;
    for (int64_t s = 0; s < 5; ++s)
      for (const StoredGroup& g : h.step(s, m))
        for (size_t k = 0; k < g.samples.size(); ++k) {
          ++trained;
          const auto it = seen.find({g.stream, int64_t(k)});
          ASSERT_NE(it, seen.end()) << "t=" << t << " split=" << split << ": stream " << g.stream << " sample " << k
                                    << " trained without being reported";
          EXPECT_EQ(it->second, g.samples[k].tokens) << "stream " << g.stream << " sample " << k;
        }
    EXPECT_EQ(trained, 5 * 4 * 3);
    for (const StoredGroup& g : h.ar->store().groups())  // waiting in the store: reported only when finished
      for (size_t k = 0; k < g.samples.size(); ++k)
        EXPECT_EQ(seen.count({g.stream, int64_t(k)}) > 0, g.samples[k].finished) << "stream " << g.stream;
  }
}

TEST(AsyncRollout, StoreSurvivesACheckpointMidRun) {
  // Uninterrupted, and stopped after step 2 with the store and the source's
  // position saved, then resumed in a new AsyncRollout: the same groups.
  for (const auto& [t, split] : std::vector<std::pair<double, int64_t>>{{1.0, 1}, {0.5, 1}, {0.0, 4}}) {
    Harness full(options(t, split));
    std::vector<std::vector<StoredGroup>> want;
    std::map<std::string, double> m;
    for (int64_t s = 0; s < 6; ++s) want.push_back(full.step(s, m));

    Harness first(options(t, split));
    for (int64_t s = 0; s < 3; ++s) first.step(s, m);
    const std::string saved = first.ar->store().to_json().dump();
    Harness resumed(options(t, split));
    resumed.next_prompt = first.next_prompt;  // the data loader's state
    auto st = SampleStore::from_json(nlohmann::json::parse(saved), "test");
    ASSERT_TRUE(bool(st)) << st.status().message();
    resumed.ar->store() = std::move(st).value();
    for (int64_t s = 3; s < 6; ++s) {
      const auto got = resumed.step(s, m);
      ASSERT_EQ(got.size(), want[size_t(s)].size());
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].stream, want[size_t(s)][k].stream) << "t=" << t << " split=" << split;
        for (size_t j = 0; j < got[k].samples.size(); ++j) {
          EXPECT_EQ(got[k].samples[j].tokens, want[size_t(s)][k].samples[j].tokens);
          EXPECT_EQ(got[k].samples[j].versions, want[size_t(s)][k].samples[j].versions);
        }
      }
    }
  }
}

TEST(AsyncRollout, ABadStoreFileIsRefusedNamingIt) {
  auto bad = SampleStore::from_json(nlohmann::json::parse(R"({"format":"other"})"), "ckpt/sample_store.json");
  ASSERT_FALSE(bool(bad));
  EXPECT_NE(bad.status().message().find("ckpt/sample_store.json"), std::string::npos);
  SampleStore st;
  StoredGroup g;
  g.samples.resize(1);
  g.samples[0].tokens = {1, 2};
  g.samples[0].versions = {0};  // one version for two tokens
  st.add(g);
  auto j = nlohmann::json::parse(st.to_json().dump());
  auto r = SampleStore::from_json(j, "x.json");
  ASSERT_FALSE(bool(r));
  EXPECT_NE(r.status().message().find("2 tokens but 1 versions"), std::string::npos) << r.status().message();
}

// ---- On the engine (a tiny random model, weights fixed) ----

std::vector<std::vector<int32_t>> engine_prompts() {
  std::vector<std::vector<int32_t>> p(6);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 9 + 5 * i; ++j) p[size_t(i)].push_back(int32_t((i * 31 + j * 7) % 120 + 3));
  return p;
}

RolloutOptions engine_options(double temperature) {
  RolloutOptions r;
  r.n = 3;
  r.response_length = 12;
  r.temperature = temperature;
  r.seed = 11;
  r.engine.kv_cache_bytes = int64_t(16) << 20;
  r.engine.max_model_len = 96;
  return r;
}

TEST(AsyncRolloutEngine, SynchronousScheduleGivesTheWorkersBatchBitForBit) {
  auto m = rollout::testing::tiny_model(false, DType::F32, 3);
  RlParallel par;
  RolloutWorker worker(*m, [] { return int64_t(0); }, engine_options(1.0), par);
  const auto prompts = engine_prompts();
  int64_t next = 0;
  AsyncRolloutOptions o;
  o.batch_prompts = 3;
  o.n = 3;
  o.response_length = 12;
  o.seed = 11;
  AsyncRollout ar(
      o,
      [&] {
        std::vector<int64_t> idx;
        for (int k = 0; k < 3; ++k) idx.push_back(next++ % 6);
        return idx;
      },
      [&](int64_t i) -> const std::vector<int32_t>& { return prompts[size_t(i)]; },
      [&](const std::vector<RoundRequest>& r, const ResponseSink& sink) { return worker.generate_round(r, sink); }, [] { return int64_t(0); });
  for (int64_t s = 0; s < 2; ++s) {
    std::map<std::string, double> mm;
    worker.sync();  // an empty prefix cache for both (cached prompt KV is not bit-identical to recomputed)
    const auto gs = ar.next_groups(s, mm);
    RolloutBatch got = assemble_batch(gs, [&](int64_t i) -> const std::vector<int32_t>& { return prompts[size_t(i)]; },
                                      0, 0);
    std::vector<std::vector<int32_t>> ps;
    for (const StoredGroup& g : gs) ps.push_back(prompts[size_t(g.prompt)]);
    worker.sync();
    RolloutBatch want = worker.generate(ps, s);
    EXPECT_EQ(got.prompts, want.prompts);
    EXPECT_EQ(got.responses, want.responses);
    EXPECT_EQ(got.group, want.group);
    ASSERT_EQ(got.rollout_logp.size(), want.rollout_logp.size());
    ASSERT_FALSE(got.rollout_logp.empty());
    for (size_t t = 0; t < got.rollout_logp.size(); ++t) EXPECT_EQ(got.rollout_logp[t], want.rollout_logp[t]);
    EXPECT_EQ(got.weight_version, want.weight_version);
  }
}

TEST(AsyncRolloutEngine, AContinuedResponseGoesOnWhereItStopped) {
  // Greedy (and seeded sampling) at fixed weights: max_split 4 (rounds of 3
  // tokens, each continued response re-prefilled) gives max_split 1's tokens.
  for (double temperature : {0.0, 1.0}) {
    auto m = rollout::testing::tiny_model(false, DType::F32, 5);
    RlParallel par;
    RolloutWorker worker(*m, [] { return int64_t(0); }, engine_options(temperature), par);
    const auto prompts = engine_prompts();
    auto run = [&](int64_t split) {
      int64_t next = 0;
      AsyncRolloutOptions o;
      o.batch_prompts = 6;
      o.n = 3;
      o.response_length = 12;
      o.seed = 11;
      o.partial_max_split = split;
      AsyncRollout ar(
          o,
          [&] {
            std::vector<int64_t> idx;
            for (int k = 0; k < 6; ++k) idx.push_back(next++ % 6);
            return idx;
          },
          [&](int64_t i) -> const std::vector<int32_t>& { return prompts[size_t(i)]; },
          [&](const std::vector<RoundRequest>& r, const ResponseSink& sink) { return worker.generate_round(r, sink); }, [] { return int64_t(0); });
      std::map<std::string, double> mm;
      auto gs = ar.next_groups(0, mm);
      return std::make_pair(gs, mm);
    };
    const auto [whole, m1] = run(1);
    const auto [split, m4] = run(4);
    EXPECT_GT(m4.at("fully_async/partial/total_partial_num"), 0.0) << "no response spanned rounds";
    ASSERT_EQ(whole.size(), split.size());
    for (size_t k = 0; k < whole.size(); ++k)
      for (size_t j = 0; j < whole[k].samples.size(); ++j) {
        const StoredSample &a = whole[k].samples[j], &b = split[k].samples[j];
        EXPECT_EQ(a.tokens, b.tokens) << "temperature " << temperature << " prompt " << k << " sample " << j;
        ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
        // The re-prefilled context's log-probs agree up to summation order (prefill vs decode GEMMs).
        for (size_t t = 0; t < a.logprobs.size(); ++t) EXPECT_NEAR(a.logprobs[t], b.logprobs[t], 1e-4);
      }
  }
}

}  // namespace
}  // namespace kestrel::rl
