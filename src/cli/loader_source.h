// The data layer's epoch loader as the trainers' BatchSource (train/ cannot
// link data/, so the CLI joins them). Shared by `kestrel sft` and `kestrel train`.
#pragma once
#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "train/sft_trainer.h"

namespace kestrel::cli {

class LoaderSource final : public train::BatchSource {
 public:
  LoaderSource(int64_t n, int64_t batch, bool shuffle, uint64_t seed) : l_(n, batch, shuffle, seed) {}
  std::vector<int64_t> next_batch() override { return l_.next_batch(); }
  int64_t batches_per_epoch() const override { return l_.batches_per_epoch(); }
  int64_t epoch() const override { return l_.epoch(); }
  nlohmann::json state() const override { return l_.state().to_json(); }
  Status restore(const nlohmann::json& s, const std::string& origin) override {
    KS_ASSIGN(auto st, data::LoaderState::from_json(s, origin));
    return l_.restore(st, origin);
  }

 private:
  data::EpochLoader l_;
};

}  // namespace kestrel::cli
