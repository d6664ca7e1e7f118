#include "rl/distributed.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/status.h"
#include "parallel/balance.h"

namespace kestrel::rl {

std::pair<int64_t, int64_t> share_range(int64_t n, int part, int parts) {
  KS_CHECK(parts >= 1 && part >= 0 && part < parts, "share_range: part ", part, " of ", parts);
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = int64_t(part) * base + std::min<int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

namespace {

// Variable-length all-gather of int32 words: every rank gets all ranks' words
// in rank order, and each rank's count.
std::vector<int32_t> all_gather_words(comm::ProcessGroup& g, const std::vector<int32_t>& mine,
                                      std::vector<int64_t>& counts) {
  const int n = g.size();
  int64_t my = int64_t(mine.size());
  counts.assign(size_t(n), 0);
  g.all_gather(&my, counts.data(), 1, DType::I64);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int32_t> out(static_cast<size_t>(total));
  // all-gather-v as an all-to-all-v that sends the same words to every rank.
  std::vector<int32_t> send;
  send.reserve(size_t(my) * size_t(n));
  for (int r = 0; r < n; ++r) send.insert(send.end(), mine.begin(), mine.end());
  g.all_to_allv(send.data(), std::vector<int64_t>(size_t(n), my), out.data(), counts, DType::I32);
  return out;
}

// Element-wise sum (or max) over the group of each rank's doubles, combined in
// rank order so every rank gets bit-identical results (the doubles travel as
// raw 8-byte patterns: there is no f64 dtype in the comm layer).
void combine_doubles(comm::ProcessGroup& g, std::vector<double>& v, bool max) {
  const size_t n = v.size(), R = size_t(g.size());
  std::vector<double> all(n * R);
  g.all_gather(v.data(), all.data(), int64_t(n), DType::I64);
  for (size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (size_t r = 1; r < R; ++r) acc = max ? std::max(acc, all[r * n + i]) : acc + all[r * n + i];
    v[i] = acc;
  }
}

}  // namespace

std::vector<int32_t> encode_responses(const std::vector<WireResponse>& rs) {
  // [prompt, sample, n_tokens, flags, n_routed, tokens..., logprob bits..., routed...] per response;
  // flags: bit 0 log-probs present, bit 1 finished.
  std::vector<int32_t> words;
  for (const WireResponse& r : rs) {
    words.push_back(int32_t(r.prompt));
    words.push_back(int32_t(r.sample));
    words.push_back(int32_t(r.tokens.size()));
    const bool lp = !r.logprobs.empty();
    KS_CHECK(!lp || r.logprobs.size() == r.tokens.size(), "response of prompt ", r.prompt, ": ", r.logprobs.size(),
             " logprobs for ", r.tokens.size(), " tokens");
    words.push_back((lp ? 1 : 0) | (r.finished ? 2 : 0));
    KS_CHECK(r.routed_experts.size() < size_t(INT32_MAX), "response of prompt ", r.prompt, ": ",
             r.routed_experts.size(), " routing entries do not fit a message");
    words.push_back(int32_t(r.routed_experts.size()));
    words.insert(words.end(), r.tokens.begin(), r.tokens.end());
    for (float f : r.logprobs) {
      int32_t w;
      std::memcpy(&w, &f, 4);
      words.push_back(w);
    }
    words.insert(words.end(), r.routed_experts.begin(), r.routed_experts.end());
  }
  return words;
}

std::vector<WireResponse> decode_responses(const std::vector<int32_t>& all) {
  std::vector<WireResponse> out;
  size_t i = 0;
  while (i < all.size()) {
    KS_CHECK(i + 5 <= all.size(), "decode_responses: truncated record");
    WireResponse r;
    r.prompt = all[i];
    r.sample = all[i + 1];
    const size_t len = size_t(all[i + 2]);
    const bool lp = (all[i + 3] & 1) != 0;
    r.finished = (all[i + 3] & 2) != 0;
    const size_t routed = size_t(all[i + 4]);
    i += 5;
    KS_CHECK(i + len * (lp ? 2 : 1) + routed <= all.size(), "decode_responses: truncated record");
    r.tokens.assign(all.begin() + int64_t(i), all.begin() + int64_t(i + len));
    i += len;
    if (lp) {
      r.logprobs.resize(len);
      std::memcpy(r.logprobs.data(), all.data() + i, len * 4);
      i += len;
    }
    r.routed_experts.assign(all.begin() + int64_t(i), all.begin() + int64_t(i + routed));
    i += routed;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<WireResponse> all_gather_responses(comm::ProcessGroup& world, const std::vector<WireResponse>& mine,
                                               bool leader) {
  std::vector<int64_t> counts;
  const std::vector<int32_t> all =
      all_gather_words(world, leader ? encode_responses(mine) : std::vector<int32_t>{}, counts);
  std::vector<WireResponse> out = decode_responses(all);
  std::sort(out.begin(), out.end(), [](const WireResponse& a, const WireResponse& b) {
    return a.prompt != b.prompt ? a.prompt < b.prompt : a.sample < b.sample;
  });
  return out;
}

std::vector<int64_t> dp_share(const RolloutBatch& b, comm::ProcessGroup& dp, bool balance) {
  if (dp.size() == 1) {
    std::vector<int64_t> all(static_cast<size_t>(b.size()), 0);
    for (int64_t i = 0; i < b.size(); ++i) all[size_t(i)] = i;
    return all;
  }
  if (balance) {
    std::vector<int64_t> lens;
    for (int64_t i = 0; i < b.size(); ++i)
      lens.push_back(int64_t(b.prompts[size_t(i)].size() + b.responses[size_t(i)].size()));
    return parallel::seqlen_balanced_partitions(lens, dp.size(), true)[size_t(dp.rank())];
  }
  KS_CHECK(b.group.size() == size_t(b.size()), "dp_share: the rollout batch has no prompt groups");
  const int64_t groups = b.size() == 0 ? 0 : b.group.back() + 1;
  const auto [g0, g1] = share_range(groups, dp.rank(), dp.size());
  std::vector<int64_t> out;
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.group[size_t(i)] >= g0 && b.group[size_t(i)] < g1) out.push_back(i);
  return out;
}

void all_gather_token_values(comm::ProcessGroup& dp, const RolloutBatch& b, const std::vector<int64_t>& mine,
                             std::vector<double>& values) {
  if (dp.size() == 1) return;
  KS_CHECK(int64_t(values.size()) == b.layout.num_tokens(), "all_gather_token_values: ", values.size(),
           " values for ", b.layout.num_tokens(), " tokens");
  // The shares are disjoint and the other ranks' tokens are zero here: a sum
  // is the gather (x + 0 is exact).
  std::vector<double> local(values.size(), 0.0);
  for (int64_t i : mine)
    for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) local[size_t(t)] = values[size_t(t)];
  combine_doubles(dp, local, false);
  values = std::move(local);
}

void all_gather_sequence_ints(comm::ProcessGroup& dp, const RolloutBatch& b, const std::vector<int64_t>& mine,
                              std::vector<std::vector<int32_t>>& records) {
  if (dp.size() == 1) return;
  records.resize(size_t(b.size()));
  // [sequence, n, values...] per sequence of this rank's share.
  std::vector<int32_t> words;
  for (int64_t i : mine) {
    const std::vector<int32_t>& r = records[size_t(i)];
    KS_CHECK(r.size() < size_t(INT32_MAX), "all_gather_sequence_ints: sequence ", i, " holds ", r.size(),
             " values, more than a message carries");
    words.push_back(int32_t(i));
    words.push_back(int32_t(r.size()));
    words.insert(words.end(), r.begin(), r.end());
  }
  std::vector<int64_t> counts;
  const std::vector<int32_t> all = all_gather_words(dp, words, counts);
  for (size_t at = 0; at < all.size();) {
    KS_CHECK(at + 2 <= all.size(), "all_gather_sequence_ints: truncated record");
    const int64_t i = all[at], n = all[at + 1];
    KS_CHECK(i >= 0 && i < b.size() && at + 2 + size_t(n) <= all.size(),
             "all_gather_sequence_ints: bad record of sequence ", i);
    records[size_t(i)].assign(all.begin() + int64_t(at + 2), all.begin() + int64_t(at + 2 + size_t(n)));
    at += 2 + size_t(n);
  }
}

void all_reduce_totals(comm::ProcessGroup& dp, LossTotals& t) {
  if (dp.size() == 1) return;
  std::vector<double> sums = {t.loss, t.pg_loss, t.kl_loss, t.clipfrac_tokens, t.clipfrac_lower_tokens,
                              t.ppo_kl_tokens, t.entropy_tokens, t.tokens, t.rollout_diff_sum, t.rollout_diff_tokens};
  // The rollout-correction sums follow, in key order (the same keys on every rank).
  for (const auto& [k, v] : t.corr) sums.push_back(v);
  sums.push_back(t.corr_batches);
  combine_doubles(dp, sums, false);
  size_t j = 10;
  for (auto& [k, v] : t.corr) v = sums[j++];
  t.corr_batches = sums[j];
  std::vector<double> mxv = {t.rollout_diff_max};
  combine_doubles(dp, mxv, true);
  const double mx = mxv[0];
  t.loss = sums[0], t.pg_loss = sums[1], t.kl_loss = sums[2], t.clipfrac_tokens = sums[3];
  t.clipfrac_lower_tokens = sums[4], t.ppo_kl_tokens = sums[5], t.entropy_tokens = sums[6], t.tokens = sums[7];
  t.rollout_diff_sum = sums[8], t.rollout_diff_tokens = sums[9], t.rollout_diff_max = mx;
}

void broadcast_from_last_stage(comm::ProcessGroup& pp, std::vector<double>& v) {
  if (pp.size() > 1) pp.broadcast(v.data(), int64_t(v.size()), DType::I64, pp.size() - 1);  // raw 8-byte patterns
}

void broadcast_from_last_stage(comm::ProcessGroup& pp, LossTotals& t) {
  if (pp.size() == 1) return;
  std::vector<double> v = {t.loss, t.pg_loss, t.kl_loss, t.clipfrac_tokens, t.clipfrac_lower_tokens,
                           t.ppo_kl_tokens, t.entropy_tokens, t.tokens, t.rollout_diff_sum, t.rollout_diff_tokens,
                           t.rollout_diff_max};
  for (const auto& [k, x] : t.corr) v.push_back(x);
  v.push_back(t.corr_batches);
  broadcast_from_last_stage(pp, v);
  size_t j = 11;
  for (auto& [k, x] : t.corr) x = v[j++];
  t.corr_batches = v[j];
  t.loss = v[0], t.pg_loss = v[1], t.kl_loss = v[2], t.clipfrac_tokens = v[3], t.clipfrac_lower_tokens = v[4];
  t.ppo_kl_tokens = v[5], t.entropy_tokens = v[6], t.tokens = v[7], t.rollout_diff_sum = v[8];
  t.rollout_diff_tokens = v[9], t.rollout_diff_max = v[10];
}

void sum_doubles(comm::ProcessGroup& g, std::vector<double>& v) {
  if (g.size() > 1) combine_doubles(g, v, false);
}

void broadcast_doubles(comm::ProcessGroup& world, std::vector<double>& v) {
  if (world.size() == 1) return;
  int64_t n = int64_t(v.size());
  world.broadcast(&n, 1, DType::I64, 0);
  v.resize(size_t(n));
  world.broadcast(v.data(), n, DType::I64, 0);  // raw 8-byte patterns
}

}  // namespace kestrel::rl
