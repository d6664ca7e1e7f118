// Epoch-aware batch order over a dataset of n rows: a Philox-seeded shuffle
// per epoch (a pure function of (seed, epoch), so a resumed run sees the same
// order), batches of `batch_size` row indices, drop_last as verl's train
// dataloader. The position (epoch, index into the epoch, seed) is the whole
// state: checkpoints save it and restore() continues exactly there.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::data {

struct LoaderState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t index = 0;  // rows of this epoch already handed out
  int64_t dataset_size = 0;
  int64_t batch_size = 0;
  bool shuffle = true;
  nlohmann::json to_json() const;
  static Result<LoaderState> from_json(const nlohmann::json& j, const std::string& origin);
};

class EpochLoader {
 public:
  // batch_size <= n; drop_last: an epoch ends when fewer than batch_size rows remain.
  EpochLoader(int64_t dataset_size, int64_t batch_size, bool shuffle, uint64_t seed, bool drop_last = true);

  int64_t batches_per_epoch() const;
  // The next batch's row indices; crosses into the next epoch when this one is spent.
  std::vector<int64_t> next_batch();
  int64_t epoch() const { return state_.epoch; }

  LoaderState state() const { return state_; }
  // Continues from a saved position; the dataset size, batch size, shuffle and
  // seed must match the saved ones (else the order would silently change).
  Status restore(const LoaderState& s, const std::string& origin);

  // The row order of an epoch: identity without shuffle, else a Fisher-Yates
  // permutation drawn from Philox(seed, stream = epoch).
  std::vector<int64_t> epoch_order(int64_t epoch) const;

 private:
  LoaderState state_;
  bool drop_last_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace kestrel::data
