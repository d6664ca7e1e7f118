#include "train/micro_batch.h"

#include "core/status.h"

namespace kestrel::train {

std::vector<std::vector<int64_t>> split_micro_batches(const std::vector<int64_t>& lengths, int64_t max_tokens,
                                                      int64_t max_seqs) {
  KS_CHECK(max_tokens > 0 || max_seqs > 0, "split_micro_batches: needs a token budget or a sequence count");
  std::vector<std::vector<int64_t>> out;
  int64_t tokens = 0;
  for (int64_t i = 0; i < int64_t(lengths.size()); ++i) {
    const bool full = out.empty() ||
                      (max_tokens > 0 ? tokens + lengths[size_t(i)] > max_tokens
                                      : int64_t(out.back().size()) >= max_seqs);
    if (full) {
      out.emplace_back();
      tokens = 0;
    }
    out.back().push_back(i);
    tokens += lengths[size_t(i)];
  }
  return out;
}

std::vector<float> sft_token_weights(const std::vector<const std::vector<uint8_t>*>& masks, float scale) {
  std::vector<float> w;
  for (const auto* m : masks) {
    for (size_t t = 0; t < m->size(); ++t) w.push_back(t + 1 < m->size() && (*m)[t + 1] ? scale : 0.f);
  }
  return w;
}

}  // namespace kestrel::train
