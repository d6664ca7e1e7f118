#include "rl/workers/log_probs.h"

#include "rl/distributed.h"
#include "train/engine.h"
#include "train/micro_batch.h"

namespace kestrel::rl {

Tensor routing_record_tensor(const model::CausalLM& model, int64_t T) {
  const int64_t L = model.num_moe_layers(), k = model.config().moe.top_k;
  // On the model's device: its MoE layers write it there (-1: rows no layer routed).
  Tensor t = Tensor::empty({T, L, k}, DType::I32, MemCategory::Activations, model.device());
  t.fill_(-1.f);
  return t;
}

void unpack_micro_batch_routing(const RolloutBatch& b, const std::vector<std::vector<int64_t>>& seqs,
                                bool share_prompts, const std::vector<Tensor>& recorded, comm::ProcessGroup& pp,
                                std::vector<std::vector<int32_t>>& records) {
  KS_CHECK(seqs.size() == recorded.size(), "unpack_micro_batch_routing: ", recorded.size(), " records for ",
           seqs.size(), " micro-batches");
  records.resize(size_t(b.size()));
  for (size_t g = 0; g < recorded.size(); ++g) {
    const Tensor& r = recorded[g];  // i32 [T, L, k]
    std::vector<int32_t> host = r.to_host<int32_t>();
    // Each stage wrote its own layers' columns over -1s: the max is every layer's record.
    if (pp.size() > 1) pp.all_reduce(host.data(), int64_t(host.size()), DType::I32, comm::ReduceOp::Max);
    unpack_routing(b, seqs[g], share_prompts, host, r.size(1), r.size(2), records);
  }
}

void score_log_probs(const model::CausalLM& model, const RolloutBatch& b, const LogProbOptions& opt,
                     comm::ProcessGroup& dp, std::vector<double>& out, std::vector<std::vector<int32_t>>* record) {
  const std::vector<int64_t> all = dp_share(b, dp, opt.balance_batch);
  const int64_t count = opt.micro_batch_size;
  const int64_t budget = count > 0 ? 0 : opt.max_token_len;
  const bool moe = model.num_moe_layers() > 0;
  const bool replay = moe && opt.router_replay == RouterReplay::R3;
  if (!moe) record = nullptr;
  out.assign(size_t(b.layout.num_tokens()), 0.0);
  std::vector<std::vector<int64_t>> groups = split_mini_batch(b, all, budget, count, opt.share_prompts);
  if (moe) train::align_micro_batch_count(groups, model.ep(), "scoring");
  std::vector<train::MicroBatch> micro;
  for (auto& grp : groups) {
    PackedSequences packed = pack_rollout_sequences(b, grp, opt.share_prompts, replay);
    micro.push_back({std::move(packed.batch), std::move(grp), std::move(packed.rows)});
  }
  std::vector<Tensor> recorded;
  if (record) {
    recorded.reserve(micro.size());  // the batches point into it: no reallocation below
    for (train::MicroBatch& mb : micro) {
      recorded.push_back(routing_record_tensor(model, mb.batch.num_tokens));
      mb.batch.record_routing = &recorded.back();
    }
  }
  train::score_micro_batches(model, micro, [&](size_t g, const Tensor& logprob) {  // f32 [T]
    const std::vector<float> lp = logprob.to_host<float>();  // [T]
    const std::vector<int64_t>& rows = micro[g].rows;
    size_t k = 0;
    for (int64_t i : micro[g].seqs)
      for (int64_t t = b.layout.begin(i); t < b.layout.end(i); ++t) out[size_t(t)] = double(lp[rows[k++]]);
  });
  all_gather_token_values(dp, b, all, out);
  if (!record) return;
  std::vector<std::vector<int64_t>> seqs;
  for (const train::MicroBatch& mb : micro) seqs.push_back(mb.seqs);
  record->assign(size_t(b.size()), {});
  unpack_micro_batch_routing(b, seqs, opt.share_prompts, recorded, model.pp(), *record);
  all_gather_sequence_ints(dp, b, all, *record);
}

}  // namespace kestrel::rl
