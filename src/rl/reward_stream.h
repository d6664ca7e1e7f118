// Rewards scored in the background (verl's reward_model.launch_reward_fn_async,
// and MindSpeed's reward stage taking samples as they become ready): each
// response is handed over the moment its generation finishes and scored on a
// worker thread, so a reward program runs alongside the rollout and the
// old/ref log-prob passes instead of after them. The trainer then takes the
// scores of its batch, waiting only for those not done yet.
//
// Scores are the synchronous ones bit for bit: a response is scored by the
// same function, alone (chunk of one) for the per-response managers (naive,
// dapo, remote), or with its whole batch in one call for the batch-wise ones
// (batch, prime: their result depends on the batch, so they are never
// streamed; the batch is scored in the background while the log-probs run).
// Failure counts follow their response: a step's reward/failures/* count the
// failures of the responses it trains.
//
// Results are kept by (stream position, sample) until taken; a checkpoint
// does not save them (a resumed run scores those responses again when it
// trains them, with the same result). Thread safety: submit/take/forget from
// one thread (the trainer's); the score function runs on the worker thread
// only while something is queued, and must be safe against concurrent use by
// its owner (RewardWorker locks).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "rl/reward_manager.h"

namespace kestrel::rl {

class RewardStream {
 public:
  using Key = std::pair<int64_t, int64_t>;  // (stream position of the group, sample index)
  using ScoreFn = std::function<RewardBatchResult(const std::vector<RewardRequest>&)>;

  // `workers` threads score queued chunks concurrently (reward_model.num_workers;
  // the score function must then be thread-safe).
  explicit RewardStream(ScoreFn score, int64_t workers = 1);
  ~RewardStream();  // waits for what is being scored, drops the rest
  RewardStream(const RewardStream&) = delete;
  RewardStream& operator=(const RewardStream&) = delete;

  // Queues requests scored together in one call (a chunk), tagged `tag` (the
  // trainer's step when submitted, for forget_unless). A key already submitted is an error.
  void submit(std::vector<Key> keys, std::vector<RewardRequest> reqs, int64_t tag = 0);
  bool submitted(const Key& k) const;
  // The results of `keys` (each submitted before), in that order, waiting for
  // those still queued or being scored; failures are those of these keys'
  // chunks. The keys are forgotten. Rethrows what the score function threw.
  RewardBatchResult take(const std::vector<Key>& keys);
  // Forgets the finished results whose (key, tag) fails `keep` (groups dropped
  // as too stale, never trained); pending ones are kept.
  void forget_unless(const std::function<bool(const Key&, int64_t tag)>& keep);

 private:
  struct Chunk {
    std::vector<Key> keys;
    std::vector<RewardRequest> reqs;
    int64_t tag = 0;
  };
  struct Scored {
    double score = 0;
    nlohmann::ordered_json extra;
    RewardFailureCounts failures;  // its chunk's, on the chunk's first key
    int64_t tag = 0;
  };
  void work();

  ScoreFn score_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> queue_;
  std::map<Key, int> pending_;       // queued or being scored
  std::map<Key, Scored> results_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::vector<std::thread> workers_;  // last: they start after every member above exists
};

}  // namespace kestrel::rl
