// The background reward stream (rl/reward_stream.h): scores come back by key
// in the order asked, equal to scoring the same requests in one synchronous
// call; take() waits for what is still being scored; a chunk's failures
// follow its responses; an error on the worker thread reaches the caller.
#include "rl/reward_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace kestrel::rl {
namespace {

RewardRequest req(const std::string& text) {
  RewardRequest r;
  r.data_source = "test";
  r.solution_str = text;
  r.response_length = int64_t(text.size());
  return r;
}

// Score: the text's length / 10; "crash" fails (scores 0, one crash counted).
RewardBatchResult score_lengths(const std::vector<RewardRequest>& q) {
  RewardBatchResult r;
  for (const RewardRequest& x : q) {
    const bool crash = x.solution_str == "crash";
    r.scores.push_back(crash ? 0.0 : double(x.solution_str.size()) / 10.0);
    nlohmann::ordered_json e;
    e["len"] = x.solution_str.size();
    r.extra.push_back(e);
    if (crash) ++r.failures.crash;
  }
  return r;
}

TEST(RewardStream, ScoresEqualOneSynchronousCallInTheOrderAsked) {
  RewardStream s(score_lengths);
  const std::vector<std::string> texts = {"a", "bbb", "crash", "dddd", "ee"};
  std::vector<RewardStream::Key> keys;
  for (size_t i = 0; i < texts.size(); ++i) {
    keys.push_back({int64_t(i / 2), int64_t(i % 2)});
    s.submit({keys.back()}, {req(texts[i])});  // one chunk each, as responses finish
  }
  std::vector<RewardRequest> all;
  for (const auto& t : texts) all.push_back(req(t));
  const RewardBatchResult want = score_lengths(all);
  // Asked in another order than submitted: the results follow the keys asked.
  const std::vector<RewardStream::Key> ask = {keys[4], keys[0], keys[2], keys[1], keys[3]};
  const RewardBatchResult got = s.take(ask);
  ASSERT_EQ(got.scores.size(), 5u);
  const size_t order[] = {4, 0, 2, 1, 3};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got.scores[i], want.scores[order[i]]);
    EXPECT_EQ(got.extra[i], want.extra[order[i]]);
  }
  EXPECT_EQ(got.failures.crash, 1);
  EXPECT_FALSE(s.submitted(keys[0])) << "taken keys are forgotten";
}

TEST(RewardStream, AChunkIsOneCallAndItsFailuresCountOnce) {
  std::atomic<int> calls{0};
  RewardStream s([&](const std::vector<RewardRequest>& q) {
    ++calls;
    RewardBatchResult r = score_lengths(q);
    r.failures.restarts = 1;  // a per-call count: must be counted once per chunk
    return r;
  });
  s.submit({{0, 0}, {0, 1}, {1, 0}}, {req("x"), req("crash"), req("yy")});
  const RewardBatchResult r = s.take({{0, 0}, {0, 1}, {1, 0}});
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(r.failures.crash, 1);
  EXPECT_EQ(r.failures.restarts, 1);
  EXPECT_EQ(r.scores, (std::vector<double>{0.1, 0.0, 0.2}));
}

TEST(RewardStream, TakeWaitsForAResponseStillBeingScored) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<bool> started{false};
  RewardStream s([&](const std::vector<RewardRequest>& q) {
    started = true;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });
    return score_lengths(q);
  });
  s.submit({{3, 1}}, {req("abcdef")});
  std::thread releaser([&] {
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
    }
    cv.notify_all();
  });
  const auto t0 = std::chrono::steady_clock::now();
  const RewardBatchResult r = s.take({{3, 1}});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  releaser.join();
  EXPECT_EQ(r.scores, (std::vector<double>{0.6}));
  EXPECT_GT(waited, 0.03) << "take() returned before the scorer was released";
}

TEST(RewardStream, AnErrorOnTheWorkerReachesTheCaller) {
  RewardStream s([](const std::vector<RewardRequest>& q) -> RewardBatchResult {
    if (q[0].solution_str == "bad") throw std::runtime_error("scorer broke on 'bad'");
    return score_lengths(q);
  });
  s.submit({{0, 0}}, {req("bad")});
  try {
    s.take({{0, 0}});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("scorer broke"), std::string::npos);
  }
}

TEST(RewardStream, MisuseIsRefusedAndDroppedGroupsAreForgotten) {
  RewardStream s(score_lengths);
  s.submit({{1, 0}}, {req("a")});
  EXPECT_THROW(s.submit({{1, 0}}, {req("a")}), std::exception) << "a key submitted twice";
  EXPECT_THROW(s.take({{9, 0}}), std::exception) << "a key never submitted";
  s.submit({{2, 0}}, {req("bb")});
  s.take({});  // nothing asked: returns at once
  // Chunks are scored in the order queued: once group 2's is taken, group 1's is done too.
  const RewardBatchResult r2 = s.take({{2, 0}});
  EXPECT_EQ(r2.scores, (std::vector<double>{0.2}));
  EXPECT_TRUE(s.submitted({1, 0}));
  s.forget_unless([](const RewardStream::Key&, int64_t tag) { return tag == 7; });  // kept: tag 7 only
  EXPECT_FALSE(s.submitted({1, 0})) << "submitted with tag 0";
  s.submit({{1, 0}}, {req("a")}, /*tag=*/7);  // forgotten: may be submitted again
  EXPECT_EQ(s.take({{1, 0}}).scores, (std::vector<double>{0.1}));
}

// reward_model.num_workers: that many threads score queued chunks at once.
// The score function holds each chunk until `workers` chunks are inside it
// together (or 20 s pass, then it marks its scores), so the scores come
// back unmarked only if the workers ran concurrently.
TEST(RewardStream, WorkersScoreChunksAtOnce) {
  for (const int64_t workers : {2, 3}) {
    std::mutex mu;
    std::condition_variable cv;
    int64_t inside = 0;
    auto rendezvous = [&](const std::vector<RewardRequest>& q) {
      std::unique_lock<std::mutex> lock(mu);
      ++inside;
      cv.notify_all();
      const bool met = cv.wait_for(lock, std::chrono::seconds(20), [&] { return inside >= workers; });
      lock.unlock();
      RewardBatchResult r = score_lengths(q);
      if (!met)
        for (double& x : r.scores) x = -1;
      return r;
    };
    RewardStream s(rendezvous, workers);
    std::vector<RewardStream::Key> keys;
    for (int64_t i = 0; i < workers; ++i) {
      keys.push_back({i, 0});
      s.submit({keys.back()}, {req(std::string(size_t(i + 1), 'x'))});
    }
    const RewardBatchResult got = s.take(keys);
    ASSERT_EQ(got.scores.size(), size_t(workers));
    for (int64_t i = 0; i < workers; ++i) EXPECT_DOUBLE_EQ(got.scores[size_t(i)], double(i + 1) / 10.0) << workers;
  }
}

}  // namespace
}  // namespace kestrel::rl
