// Exact id equality with HF tokenizers on the committed goldens (make_tokenizer_golden.py).
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::tokenizer {
namespace {

using nlohmann::json;
using testutil::corpus_lines;

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto r = Tokenizer::from_dir(testutil::golden_dir(GetParam()));
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    tok_ = std::make_unique<Tokenizer>(std::move(r).value());
    golden_ = json::parse(testutil::read_file("tests/golden/tokenizer/" + GetParam() + "/golden.json"));
  }
  std::unique_ptr<Tokenizer> tok_;
  json golden_;
};

TEST_P(Golden, EveryLineMatchesAndRoundTrips) {
  const auto lines = corpus_lines();
  ASSERT_EQ(lines.size(), golden_["lines"].size());
  const auto& decoded = golden_["decoded_lines"];
  int bad = 0;
  for (size_t i = 0; i < lines.size() && bad < 5; ++i) {
    const auto want = golden_["lines"][i].get<std::vector<int32_t>>();
    const auto got = tok_->encode(lines[i], true);
    if (got != want) {
      ++bad;
      ADD_FAILURE() << GetParam() << " line " << i << " ids differ: " << json(lines[i]).dump() << "\n got  "
                    << json(got).dump() << "\n want " << json(want).dump();
    }
    // decode(encode(x)) == x, except where HF's own decode differs (NFC, removed splits, unk, skipped specials)
    const std::string want_text = decoded.contains(std::to_string(i)) ? decoded[std::to_string(i)].get<std::string>() : lines[i];
    EXPECT_EQ(tok_->decode(got, true), want_text) << GetParam() << " line " << i;
  }
}

TEST_P(Golden, WholeCorpusAsOneString) {
  const auto want = golden_["whole"].get<std::vector<int32_t>>();
  const auto got = tok_->encode(testutil::corpus(), false);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
}

TEST_P(Golden, SpecialTokenTexts) {
  for (const auto& c : golden_["special_texts"]) {
    const std::string text = c["text"];
    const bool add = c["add_special_tokens"];
    const auto got = tok_->encode(text, add);
    EXPECT_EQ(got, c["ids"].get<std::vector<int32_t>>()) << GetParam() << " " << json(text).dump() << " add=" << add;
    EXPECT_EQ(tok_->decode(got, false), c["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(tok_->decode(got, true), c["decoded_skip_special"].get<std::string>()) << json(text).dump();
  }
}

TEST_P(Golden, BatchMatchesSingleAndVocabSize) {
  const auto lines = corpus_lines();
  const auto batch = tok_->encode_batch(lines, true, 2);
  ASSERT_EQ(batch.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(batch[i], golden_["lines"][i].get<std::vector<int32_t>>()) << i;
  EXPECT_EQ(tok_->vocab_size(), golden_["vocab_size"].get<int64_t>());
  for (int32_t id = 0; id < tok_->vocab_size(); id += 97) {
    const std::string t = tok_->id_to_token(id);
    if (!t.empty()) {
      EXPECT_EQ(tok_->token_to_id(t), id);
    }
  }
  EXPECT_EQ(tok_->token_to_id("definitely not a token \x01"), -1);
  EXPECT_EQ(tok_->id_to_token(-5), "");
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Golden, ::testing::Values("gpt2", "qwen2", "llama3", "bytefb"));

TEST(GoldenConfig, BosEosFromConfigAndTemplate) {
  auto llama = Tokenizer::from_dir(testutil::golden_dir("llama3")).value();
  EXPECT_EQ(llama.bos_id(), llama.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(llama.eos_id(), llama.token_to_id("<|eot_id|>"));
  EXPECT_TRUE(llama.is_special(*llama.bos_id()));
  auto qwen = Tokenizer::from_dir(testutil::golden_dir("qwen2")).value();
  EXPECT_FALSE(qwen.bos_id().has_value());
  EXPECT_EQ(qwen.eos_id(), qwen.token_to_id("<|im_end|>"));
  EXPECT_FALSE(qwen.is_special(qwen.token_to_id("<tool_call>")));
  // from_file alone knows Llama-3's BOS from its TemplateProcessing
  auto llama_file = Tokenizer::from_file(testutil::golden_dir("llama3") + "/tokenizer.json").value();
  EXPECT_EQ(llama_file.bos_id(), llama.bos_id());
  EXPECT_FALSE(llama_file.eos_id().has_value());
}

}  // namespace
}  // namespace kestrel::tokenizer
