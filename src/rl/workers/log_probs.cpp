#include "rl/workers/log_probs.h"

#include "rl/distributed.h"
#include "train/engine.h"

namespace kestrel::rl {

void score_log_probs(const model::CausalLM& model, const RolloutBatch& b, const LogProbOptions& opt,
                     comm::ProcessGroup& dp, std::vector<double>& out) {
  const std::vector<int64_t> all = dp_share(b, dp, opt.balance_batch);
  const int64_t count = opt.micro_batch_size;
  const int64_t budget = count > 0 ? 0 : opt.max_token_len;
  out.assign(size_t(b.layout.num_tokens()), 0.0);
  std::vector<train::MicroBatch> micro;
  for (auto& grp : split_mini_batch(b, all, budget, count, opt.share_prompts)) {
    PackedSequences packed = pack_rollout_sequences(b, grp, opt.share_prompts);
    micro.push_back({std::move(packed.batch), std::move(grp), std::move(packed.rows)});
  }
  train::score_micro_batches(model, micro, [&](size_t g, const Tensor& logprob) {  // f32 [T]
    const std::vector<float> lp = logprob.to_host<float>();  // [T]
    const std::vector<int64_t>& rows = micro[g].rows;
    size_t k = 0;
    for (int64_t i : micro[g].seqs)
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(lp[rows[k++]]);
  });
  all_gather_token_values(dp, b, all, out);
}

}  // namespace kestrel::rl
