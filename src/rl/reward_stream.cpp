#include "rl/reward_stream.h"

#include <iterator>

#include "core/status.h"

namespace kestrel::rl {

RewardStream::RewardStream(ScoreFn score, int64_t workers) : score_(std::move(score)) {
  KS_CHECK(score_ != nullptr, "reward stream: no score function");
  KS_CHECK(workers >= 1, "reward stream: ", workers, " workers");
  for (int64_t k = 0; k < workers; ++k) workers_.emplace_back([this] { work(); });
}

RewardStream::~RewardStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void RewardStream::submit(std::vector<Key> keys, std::vector<RewardRequest> reqs, int64_t tag) {
  KS_CHECK(keys.size() == reqs.size(), "reward stream: ", keys.size(), " keys for ", reqs.size(), " requests");
  if (keys.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Key& k : keys) {
      KS_CHECK(!results_.count(k) && !pending_.count(k), "reward stream: sample ", k.second, " of stream position ",
               k.first, " submitted twice");
      pending_[k] = 1;
    }
    queue_.push_back({std::move(keys), std::move(reqs), tag});
  }
  cv_.notify_all();
}

bool RewardStream::submitted(const Key& k) const {
  std::lock_guard<std::mutex> lock(mu_);
  return results_.count(k) > 0 || pending_.count(k) > 0;
}

void RewardStream::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Chunk c = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    RewardBatchResult r;
    std::exception_ptr err;
    try {
      r = score_(c.reqs);
      KS_CHECK(r.scores.size() == c.reqs.size(), "reward stream: ", r.scores.size(), " scores for ", c.reqs.size(),
               " requests");
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    for (size_t i = 0; i < c.keys.size(); ++i) {
      pending_.erase(c.keys[i]);
      Scored& s = results_[c.keys[i]];
      s.tag = c.tag;
      if (err) continue;
      s.score = r.scores[i];
      if (i < r.extra.size()) s.extra = std::move(r.extra[i]);
      if (i == 0) s.failures = r.failures;
    }
    if (err && !error_) error_ = err;
    cv_.notify_all();
  }
}

RewardBatchResult RewardStream::take(const std::vector<Key>& keys) {
  std::unique_lock<std::mutex> lock(mu_);
  for (const Key& k : keys)
    KS_CHECK(results_.count(k) || pending_.count(k), "reward stream: sample ", k.second, " of stream position ",
             k.first, " was never submitted");
  cv_.wait(lock, [&] {
    if (error_) return true;
    for (const Key& k : keys)
      if (pending_.count(k)) return false;
    return true;
  });
  if (error_) std::rethrow_exception(error_);
  RewardBatchResult out;
  for (const Key& k : keys) {
    auto it = results_.find(k);
    out.scores.push_back(it->second.score);
    out.extra.push_back(std::move(it->second.extra));
    out.failures.add(it->second.failures);
    results_.erase(it);
  }
  return out;
}

void RewardStream::forget_unless(const std::function<bool(const Key&, int64_t)>& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = results_.begin(); it != results_.end();)
    it = keep(it->first, it->second.tag) ? std::next(it) : results_.erase(it);
}

}  // namespace kestrel::rl
