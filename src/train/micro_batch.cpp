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

void split_to_count(std::vector<std::vector<int64_t>>& groups, size_t count) {
  size_t seqs = 0;
  for (const auto& g : groups) seqs += g.size();
  KS_CHECK(seqs >= count, "split_to_count: ", seqs, " sequences cannot fill ", count, " micro-batches");
  while (groups.size() < count) {
    size_t big = 0;
    for (size_t i = 1; i < groups.size(); ++i)
      if (groups[i].size() > groups[big].size()) big = i;
    std::vector<int64_t>& g = groups[big];
    const size_t keep = (g.size() + 1) / 2;
    std::vector<int64_t> tail(g.begin() + std::ptrdiff_t(keep), g.end());
    g.resize(keep);
    groups.insert(groups.begin() + std::ptrdiff_t(big) + 1, std::move(tail));
  }
}

void align_micro_batch_count(std::vector<std::vector<int64_t>>& groups, comm::ProcessGroup& ep, const char* what) {
  if (ep.size() == 1) return;
  int64_t counts[2] = {int64_t(groups.size()), 0};
  for (const auto& g : groups) counts[1] += int64_t(g.size());
  int64_t most = counts[0];
  ep.all_reduce(&most, 1, DType::I64, comm::ReduceOp::Max);
  // Every rank learns whether every rank can reach the count, so all fail together instead of hanging.
  int32_t short_of = counts[1] < most ? 1 : 0;
  ep.all_reduce(&short_of, 1, DType::I32, comm::ReduceOp::Max);
  if (short_of)
    KS_FAIL("not supported yet: expert parallelism (expert_model_parallel_size ", ep.size(), ") where a rank of "
            "the ep group holds fewer ", what, " sequences than the group's largest micro-batch count, ", most,
            " (this rank: ", counts[1], " sequences in ", counts[0], " micro-batches; the ranks of an ep group run the same number of micro-batches; give each data-parallel "
            "rank at least that many sequences, e.g. a larger batch or a smaller max_token_len_per_gpu)");
  split_to_count(groups, size_t(most));
}

std::vector<float> sft_token_weights(const std::vector<const std::vector<uint8_t>*>& masks, float scale) {
  std::vector<float> w;
  for (const auto* m : masks) {
    for (size_t t = 0; t < m->size(); ++t) w.push_back(t + 1 < m->size() && (*m)[t + 1] ? scale : 0.f);
  }
  return w;
}

}  // namespace kestrel::train
