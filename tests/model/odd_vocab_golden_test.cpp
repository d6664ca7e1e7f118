// The tiny odd-vocabulary model of tests/golden/models/odd_vocab/ (vocab_size
// 1001: no tp size > 1 divides it), used by tests/scripts/
// mpi_logprobs_odd_vocab.sh to run `kestrel logprobs --tp 2` against one
// process. No Python at test time, so Kestrel writes it itself:
//   KESTREL_UPDATE_GOLDEN=1 build/dev/test_model --gtest_filter='OddVocabGolden.*'
// rewrites the folder; otherwise the test checks the committed folder is
// exactly what this generator writes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "common/testing.h"
#include "model/transformer.h"

using namespace kestrel;

namespace {

io::ModelConfig odd_vocab_config() {
  io::ModelConfig c;
  c.arch = io::Arch::Llama;
  c.model_type = "llama";
  c.vocab_size = 1001;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.rope.head_dim = 4;
  c.rope.theta = 10000.0;
  return c;
}

constexpr uint64_t kSeed = 1001;
constexpr double kStd = 0.5;  // large enough that the next-token distributions are far from uniform

}  // namespace

TEST(OddVocabGolden, FolderIsWhatKestrelWrites) {
  const std::string dir = kestrel::testing::source_path("tests/golden/models/odd_vocab");
  auto fresh = model::CausalLM::init_random(odd_vocab_config(), {}, kSeed, kStd);
  if (const char* u = std::getenv("KESTREL_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(fresh->save(dir, DType::F32).is_ok());
  }
  auto loaded = model::CausalLM::load(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message()
                              << " (regenerate with KESTREL_UPDATE_GOLDEN=1, see the file comment)";
  auto& m = *loaded.value();
  EXPECT_EQ(m.config().vocab_size, 1001);
  for (model::Param* p : fresh->params()) {
    const model::Param* q = m.find_param(p->name);
    ASSERT_NE(q, nullptr) << p->name;
    EXPECT_EQ(kestrel::testing::to_double(q->weight), kestrel::testing::to_double(p->weight)) << p->name;
  }
}
