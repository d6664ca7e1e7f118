#include "data/loader.h"

#include <algorithm>
#include <numeric>

#include "core/rng.h"

namespace kestrel::data {

nlohmann::json LoaderState::to_json() const {
  return {{"seed", seed}, {"epoch", epoch}, {"index", index}, {"dataset_size", dataset_size},
          {"batch_size", batch_size}, {"shuffle", shuffle}};
}

Result<LoaderState> LoaderState::from_json(const nlohmann::json& j, const std::string& origin) {
  LoaderState s;
  try {
    // Integers only: get<int64_t>() of a float out of range is undefined behaviour, not an exception.
    for (const char* k : {"seed", "epoch", "index", "dataset_size", "batch_size"})
      if (!j.at(k).is_number_integer())
        return KS_ERR(origin, ": data-loader state key '", k, "' must be an integer, got ", j.at(k).dump());
    s.seed = j.at("seed").get<uint64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.index = j.at("index").get<int64_t>();
    s.dataset_size = j.at("dataset_size").get<int64_t>();
    s.batch_size = j.at("batch_size").get<int64_t>();
    s.shuffle = j.at("shuffle").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return KS_ERR(origin, ": data-loader state is incomplete: ", e.what());
  }
  return s;
}

EpochLoader::EpochLoader(int64_t n, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last)
    : drop_last_(drop_last) {
  if (n <= 0)
    KS_FAIL("data loader: no rows to train on (the files are empty, or every row was filtered out or skipped: see "
            "the 'rows kept' line above; check data.train_files, data.filter_overlong_prompts, data.skip_malformed)");
  if (batch_size <= 0) KS_FAIL("data loader: batch size must be >= 1, got ", batch_size, " (data.train_batch_size)");
  if (drop_last && batch_size > n)
    KS_FAIL("data loader: batch size ", batch_size, " is larger than the dataset (", n,
            " rows); lower data.train_batch_size or add data");
  state_.seed = seed;
  state_.dataset_size = n;
  state_.batch_size = batch_size;
  state_.shuffle = shuffle;
}

int64_t EpochLoader::batches_per_epoch() const {
  const int64_t n = state_.dataset_size, b = state_.batch_size;
  return drop_last_ ? n / b : (n + b - 1) / b;
}

std::vector<int64_t> EpochLoader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(size_t(state_.dataset_size));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (!state_.shuffle) return order;
  const Philox rng{state_.seed, uint64_t(epoch)};
  for (int64_t i = int64_t(order.size()) - 1; i > 0; --i) {
    const double u = rng.uniform_double(uint64_t(i));
    const int64_t j = std::min<int64_t>(i, int64_t(u * double(i + 1)));
    std::swap(order[size_t(i)], order[size_t(j)]);
  }
  return order;
}

std::vector<int64_t> EpochLoader::next_batch() {
  const int64_t n = state_.dataset_size, b = state_.batch_size;
  const int64_t left = n - state_.index;
  if (left <= 0 || (drop_last_ && left < b)) {
    ++state_.epoch;
    state_.index = 0;
  }
  if (cached_epoch_ != state_.epoch) {
    order_ = epoch_order(state_.epoch);
    cached_epoch_ = state_.epoch;
  }
  const int64_t end = std::min(n, state_.index + b);
  std::vector<int64_t> out(order_.begin() + state_.index, order_.begin() + end);
  state_.index = end;
  return out;
}

Status EpochLoader::restore(const LoaderState& s, const std::string& origin) {
  if (s.dataset_size != state_.dataset_size || s.batch_size != state_.batch_size || s.shuffle != state_.shuffle ||
      s.seed != state_.seed)
    return KS_ERR(origin, ": the checkpoint's data loader (", s.dataset_size, " rows, batch ", s.batch_size,
                  ", shuffle ", s.shuffle, ", seed ", s.seed, ") does not match this run's (", state_.dataset_size,
                  " rows, batch ", state_.batch_size, ", shuffle ", state_.shuffle, ", seed ", state_.seed,
                  "); resume with the same data and batch settings, or start fresh (trainer.resume_mode=disable)");
  if (s.index < 0 || s.index > s.dataset_size || s.epoch < 0)
    return KS_ERR(origin, ": data-loader position (epoch ", s.epoch, ", index ", s.index, ") is out of range");
  state_ = s;
  return Status::ok();
}

}  // namespace kestrel::data
