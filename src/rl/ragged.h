// Responses of different lengths, packed: token values of response i live at
// [offsets[i], offsets[i+1]) of a flat array. No padding anywhere, the same
// layout the model consumes.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"

namespace kestrel::rl {

struct Ragged {
  std::vector<int64_t> offsets{0};  // [N+1]
  int64_t num_seqs() const { return int64_t(offsets.size()) - 1; }
  int64_t num_tokens() const { return offsets.back(); }
  int64_t begin(int64_t i) const { return offsets[size_t(i)]; }
  int64_t end(int64_t i) const { return offsets[size_t(i) + 1]; }
  int64_t length(int64_t i) const { return end(i) - begin(i); }
  static Ragged from_lengths(const std::vector<int64_t>& lens) {
    Ragged r;
    for (auto l : lens) {
      KS_CHECK(l >= 0, "negative response length");
      r.offsets.push_back(r.offsets.back() + l);
    }
    return r;
  }
};

}  // namespace kestrel::rl
