// Prompt sharing (model::pack_prefix_groups, ops::attention_fwd's prefix_of)
// on MoE and MLA models: a GRPO group packed as one prompt plus its responses
// scores every response token as the plain packing of full sequences does,
// and gives the same gradients. MLA's decompressed attention takes prefix_of
// as GQA does; the routers see the same tokens (each token's routing depends
// on its own hidden state only).
#include <gtest/gtest.h>

#include "common/testing.h"
#include "model/transformer.h"
#include "ops/loss.h"

using namespace kestrel;

namespace {

struct Scored {
  std::vector<double> logprobs;  // of the response tokens, in order
  std::vector<double> grads;
};

// log p of each continuation token (rows `rows` of the batch), and the
// gradients of their sum.
Scored score(model::CausalLM& m, const model::PackedBatch& b, const std::vector<int64_t>& rows) {
  m.zero_grads();
  model::Activations acts;
  Tensor logits = m.forward(b, acts).to(DType::F32, MemCategory::Activations);
  const int64_t T = b.num_tokens, V = logits.size(1);
  Tensor lp = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  ops::logprob_entropy_fwd(logits, b.targets, lp, nullptr, lse);
  // d(sum of the chosen rows' log p) / d logits = onehot(target) - softmax, on those rows.
  std::vector<float> w(size_t(T), 0.f);
  for (int64_t r : rows) w[size_t(r)] = 1.f;
  Tensor dl = Tensor::empty({T, V}, DType::F32, MemCategory::Activations);
  ops::logprob_entropy_bwd(logits, b.targets, lse, Tensor::from_vector(w, {T}), nullptr, dl);
  m.backward(b, acts, dl);
  Scored s;
  const std::vector<double> all = kestrel::testing::to_double(lp);
  for (int64_t r : rows) s.logprobs.push_back(all[size_t(r)]);
  for (model::Param* p : m.params())
    for (double g : kestrel::testing::to_double(p->grad)) s.grads.push_back(g);
  return s;
}

}  // namespace

TEST(MoePrefix, SharedPromptsScoreAndTrainAsFullSequences) {
  for (const char* c : {"qwen3_moe", "deepseek_v3", "deepseek_v2"}) {
    SCOPED_TRACE(c);
    auto m = model::CausalLM::load(kestrel::testing::source_path("tests/golden/models/") + c).value();
    m->enable_grads();
    const std::vector<int32_t> prompt = {5, 17, 42, 8, 63, 21};
    const std::vector<std::vector<int32_t>> responses = {{9, 33, 2, 71}, {12, 4}, {80, 80, 15, 6, 44}};
    // Plain: every sample packs the whole prompt; response token j of sample i
    // is predicted by row (start of i) + P - 1 + j.
    std::vector<std::vector<int32_t>> full;
    std::vector<int64_t> plain_rows;
    int64_t start = 0;
    for (const auto& r : responses) {
      std::vector<int32_t> s = prompt;
      s.insert(s.end(), r.begin(), r.end());
      for (size_t j = 0; j < r.size(); ++j) plain_rows.push_back(start + int64_t(prompt.size()) - 1 + int64_t(j));
      start += int64_t(s.size());
      full.push_back(std::move(s));
    }
    // Shared: the prompt minus its last token once, then each sample continues
    // it with the last prompt token and its response (rl::pack_rollout_sequences' layout).
    model::PrefixGroup g;
    g.prefix.assign(prompt.begin(), prompt.end() - 1);
    std::vector<int64_t> shared_rows;
    start = int64_t(g.prefix.size());
    for (const auto& r : responses) {
      std::vector<int32_t> cont = {prompt.back()};
      cont.insert(cont.end(), r.begin(), r.end());
      for (size_t j = 0; j < r.size(); ++j) shared_rows.push_back(start + int64_t(j));
      start += int64_t(cont.size());
      g.continuations.push_back(std::move(cont));
    }
    const Scored plain = score(*m, model::pack_sequences(full), plain_rows);
    const Scored shared = score(*m, model::pack_prefix_groups({g}), shared_rows);
    EXPECT_TRUE(kestrel::testing::all_close(shared.logprobs, plain.logprobs, {1e-5, 1e-5}, "logprobs"));
    EXPECT_LE(kestrel::testing::rel_to_scale(shared.grads, plain.grads), 1e-5);
  }
}
