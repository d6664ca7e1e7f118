// Tensor parallelism on a vocabulary that tp does not divide (1001 over 2
// ranks): the embedding and lm_head are padded to 1024 rows (Megatron's
// make_vocab_size_divisible_by = 128, times tp), the padding never wins, and
// training forward + backward, the rollout's logits, save and load equal one
// process: logprobs, entropies and every reassembled gradient within 1e-5
// relative, the padded rows' gradients exactly zero, HF shapes on export.
#include <unistd.h>

#include <filesystem>

#include "comm/world.h"
#include "model/parallel_setup.h"
#include "model/scoring.h"
#include "parallel/setup.h"
#include "rollout/model_runner.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

constexpr int64_t kVocab = 1001;

io::ModelConfig odd_config(bool tied) {
  io::ModelConfig c;
  c.arch = tied ? io::Arch::Qwen3 : io::Arch::Llama;
  c.model_type = tied ? "qwen3" : "llama";
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.qk_norm = tied;
  c.rope.head_dim = 8;
  c.rope.theta = 10000.0;
  return c;
}

// 23 tokens (odd: sequence parallelism pads), ids across the whole vocabulary.
std::vector<std::vector<int32_t>> sequences() {
  std::vector<std::vector<int32_t>> seqs;
  const int lens[] = {9, 6, 8};
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> q;
    for (int j = 0; j < lens[s]; ++j) q.push_back(int32_t((s * 331 + j * 97 + j * j * 13) % kVocab));
    seqs.push_back(q);
  }
  seqs[0][3] = int32_t(kVocab - 1);  // the last real id, on the last rank
  return seqs;
}

struct Scores {
  Tensor lp, ent;
};

// Forward, token scores, backward of -mean(logprob) - 0.01 * mean(entropy).
Scores train_pass(model::CausalLM& m, const model::PackedBatch& b) {
  const int64_t T = b.num_tokens;
  model::Activations acts;
  Tensor logits = m.forward(b, acts);
  EXPECT_EQ(logits.size(1), m.local_vocab());
  Scores s{Tensor::empty({T}, DType::F32), Tensor::empty({T}, DType::F32)};
  Tensor lse = Tensor::empty({T}, DType::F32);
  model::logprob_entropy_fwd(m, logits, b.targets, s.lp, &s.ent, lse);
  Tensor dlp = Tensor::zeros({T}, DType::F32), dent = Tensor::zeros({T}, DType::F32);
  for (int64_t t = 0; t < T; ++t) {
    if (b.targets.data<int32_t>()[t] < 0) continue;
    dlp.set(t, -1.0f / float(T));
    dent.set(t, -0.01f / float(T));
  }
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  model::logprob_entropy_bwd(m, logits, b.targets, lse, dlp, &dent, &s.ent, dlogits);
  m.backward(b, acts, dlogits);
  return s;
}

Tensor rollout_logits(const model::CausalLM& m, const std::vector<int32_t>& prompt) {
  const auto& c = m.config();
  rollout::KVCache kv({c.num_hidden_layers, 4, 16, m.heads().n_kv_heads, c.head_dim, m.dtype()});
  kv.allocate();
  rollout::ModelRunner runner(m, kv);
  rollout::StepBatch sb;
  sb.input_ids = prompt;
  for (size_t p = 0; p < prompt.size(); ++p) {
    sb.positions.push_back(int32_t(p));
    sb.slot_mapping.push_back(int32_t(16 + p));  // block 1 (0 is the null block)
  }
  sb.cu_q = {0, int32_t(prompt.size())};
  sb.seq_lens = {int32_t(prompt.size())};
  sb.block_tables = {1};
  sb.max_blocks = 1;
  sb.sample_rows = {int32_t(prompt.size()) - 1};
  return runner.execute(sb);  // [1, V]
}

void run(bool tied, bool sp) {
  comm::World& world = *comm::World::current();
  const int n = world.size();
  const io::ModelConfig cfg = odd_config(tied);
  const model::PackedBatch b = model::pack_sequences(sequences());

  auto ref = model::CausalLM::init_random(cfg, {}, 17, 0.1);
  ref->enable_grads();
  EXPECT_EQ(ref->padded_vocab(), kVocab);  // one process: no padding
  const Scores rs = train_pass(*ref, b);

  // The grid accepts the odd vocabulary: the model pads it.
  auto grid = parallel::make_process_grid(world, parallel::dims_for(n, sp), model::model_facts(cfg));
  ASSERT_TRUE(grid.is_ok()) << grid.status().message();
  model::ModelOptions o;
  o.parallel = model::model_parallel_for(*grid.value());
  auto m = model::CausalLM::init_random(cfg, o, 17, 0.1);
  m->enable_grads();
  const int64_t padded = parallel::padded_vocab_size(kVocab, 128, n);
  EXPECT_EQ(m->padded_vocab(), padded);
  EXPECT_EQ(m->local_vocab(), padded / n);
  const Scores ts = train_pass(*m, b);
  EXPECT_CLOSE(ts.lp, rs.lp, "logprobs");
  EXPECT_CLOSE(ts.ent, rs.ent, "entropies");

  int checked = 0;
  for (model::Param* p : m->params()) {
    Tensor full = m->full_tensor(*p);
    EXPECT_EQ(full.shape(), p->full_shape) << p->name;  // HF shape: [1001, D] for the vocabulary tensors
    EXPECT_CLOSE(full, ref->find_param(p->name)->weight, "weight of " + p->name);
    EXPECT_CLOSE(parallel::gather_tensor(m->tp(), p->grad, p->shard, p->full_shape), ref->find_param(p->name)->grad,
                 "grad of " + p->name);
    if (p->shard.kind == parallel::ShardKind::Vocab) {
      // This rank's padding rows (global ids >= 1001): zero weights and zero grads.
      const int64_t real = std::clamp<int64_t>(kVocab - m->vocab_start(), 0, m->local_vocab());
      EXPECT_EQ(p->weight.size(0), m->local_vocab());
      for (int64_t i = real * cfg.hidden_size; i < p->weight.numel(); ++i) {
        ASSERT_EQ(p->weight.get(i), 0.0f) << p->name << " element " << i;
        ASSERT_EQ(p->grad.get(i), 0.0f) << p->name << " grad element " << i;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 10);

  // The rollout: [1, 1001] logits on every rank, padding columns dropped.
  const std::vector<int32_t> prompt = {3, 999, 1000, 42, 7};
  const Tensor rl = rollout_logits(*ref, prompt), tl = rollout_logits(*m, prompt);
  ASSERT_EQ(tl.size(1), kVocab);
  EXPECT_CLOSE(tl, rl, "rollout logits");

  // Save (collective; rank 0 writes) gives the HF shapes; loading pads again.
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("kestrel_vocab_pad_" + std::to_string(tied) + std::to_string(sp)))
                              .string();
  ASSERT_TRUE(m->save(dir, DType::F32).is_ok());
  world.group()->barrier();
  auto back = model::CausalLM::load(dir, {});
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(back.value()->embedding().weight.size(0), kVocab);
  auto tp_back = model::CausalLM::load(dir, o);
  ASSERT_TRUE(tp_back.is_ok()) << tp_back.status().message();
  for (model::Param* p : m->params()) {
    EXPECT_CLOSE(back.value()->find_param(p->name)->weight, ref->find_param(p->name)->weight, "saved " + p->name);
    EXPECT_CLOSE(tp_back.value()->find_param(p->name)->weight, p->weight, "reloaded shard of " + p->name);
  }
  world.group()->barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(VocabPaddingTp, TiedQk) { run(true, false); }
TEST(VocabPaddingTp, TiedQkSp) { run(true, true); }
TEST(VocabPaddingTp, Untied) { run(false, false); }
TEST(VocabPaddingTp, UntiedSp) { run(false, true); }
