// The arith task generator and its built-in tokenizer.
#include <regex>

#include "data/arith.h"
#include "data_test_util.h"

namespace kestrel::data {
namespace {

using testutil::arith_chat_tokenizer;
using testutil::arith_files;

TEST(Arith, SameSeedSameProblemAndSplitsDiffer) {
  ArithOptions o;
  const ArithProblem a = arith_problem(o, ArithSplit::Train, 7), b = arith_problem(o, ArithSplit::Train, 7);
  EXPECT_EQ(a.question, b.question);
  EXPECT_EQ(a.solution, b.solution);
  EXPECT_NE(arith_problem(o, ArithSplit::Test, 7).question, a.question);
  o.seed = 99;
  EXPECT_NE(arith_problem(o, ArithSplit::Train, 7).question, a.question);
}

// Every worked step is correct arithmetic and the answer line matches.
TEST(Arith, SolutionsAreCorrectAndEndInAnswer) {
  ArithOptions o;
  o.min_steps = 1;
  o.max_steps = 4;
  const std::regex step(R"((\d+) ([-+*]) (\d+) = (\d+))");
  int seen_ops[3] = {0, 0, 0};
  for (uint64_t i = 0; i < 300; ++i) {
    const ArithProblem p = arith_problem(o, ArithSplit::Train, i);
    ASSERT_GE(p.steps, 1);
    ASSERT_LE(p.steps, 4);
    const std::string tail = "#### " + std::to_string(p.answer);
    ASSERT_EQ(p.solution.substr(p.solution.size() - tail.size()), tail) << p.solution;
    int64_t last = -1;
    for (auto it = std::sregex_iterator(p.solution.begin(), p.solution.end(), step); it != std::sregex_iterator(); ++it) {
      const int64_t a = std::stoll((*it)[1]), b = std::stoll((*it)[3]), c = std::stoll((*it)[4]);
      const char op = (*it)[2].str()[0];
      const int64_t want = op == '+' ? a + b : op == '-' ? a - b : a * b;
      ASSERT_EQ(c, want) << p.solution;
      ++seen_ops[op == '+' ? 0 : op == '-' ? 1 : 2];
      if (op != '*') last = c;
    }
    EXPECT_EQ(last, p.answer) << p.solution;
    EXPECT_GE(p.answer, 0);
  }
  for (int k = 0; k < 3; ++k) EXPECT_GT(seen_ops[k], 0) << "operation " << k << " never drawn";
}

TEST(Arith, RlAndSftRowsFollowVerlSchema) {
  const ArithProblem p = arith_problem(ArithOptions{}, ArithSplit::Test, 3);
  const auto row = arith_rl_row(p, ArithSplit::Test, 3);
  EXPECT_EQ(row["data_source"], "arith");
  EXPECT_EQ(row["prompt"][0]["role"], "user");
  EXPECT_EQ(row["prompt"][0]["content"], arith_user_prompt(p));
  EXPECT_EQ(row["reward_model"]["ground_truth"], std::to_string(p.answer));
  EXPECT_EQ(row["extra_info"]["split"], "test");
  EXPECT_EQ(row["extra_info"]["index"], 3);
  const auto sft = arith_sft_row(p);
  EXPECT_EQ(sft["response"], p.solution);
}

TEST(BpeTrainer, MergesMostFrequentPairsWithDeterministicTies) {
  // Pieces (Qwen2 regex): "aab" x3, " aab" x1... -> first merge "a a" (4), then "aa b".
  const BpeModel m = train_byte_level_bpe({"aab aab aab aab"}, 10, 2);
  ASSERT_GE(m.merges.size(), 2u);
  EXPECT_EQ(m.merges[0], std::make_pair(std::string("a"), std::string("a")));
  EXPECT_EQ(m.merges[1], std::make_pair(std::string("aa"), std::string("b")));
  EXPECT_EQ(m.vocab.size(), 256 + m.merges.size());
  EXPECT_EQ(m.vocab[0], "!");  // GPT-2 byte order starts at '!'
  const BpeModel again = train_byte_level_bpe({"aab aab aab aab"}, 10, 2);
  EXPECT_EQ(again.merges, m.merges);
}

TEST(ArithTokenizer, LoadsWithSpecialsAndSmallVocab) {
  const auto& f = arith_files();
  const auto& ct = arith_chat_tokenizer();
  const auto& tok = ct.tokenizer();
  EXPECT_LE(f.vocab_size, 512);
  EXPECT_GT(f.vocab_size, 300);  // the corpus has enough text for real merges
  EXPECT_EQ(tok.vocab_size(), f.vocab_size);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), f.vocab_size - 3);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), f.vocab_size - 2);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), f.vocab_size - 1);
  ASSERT_TRUE(ct.eos_id().has_value());
  EXPECT_EQ(*ct.eos_id(), f.eos_id);
  EXPECT_EQ(ct.eos_token(), "<|im_end|>");
  // The generator is deterministic: the same files every time.
  EXPECT_EQ(arith_tokenizer().tokenizer_json, f.tokenizer_json);
}

TEST(ArithTokenizer, DigitsAreSingleTokensAndTextRoundTrips) {
  const auto& tok = arith_chat_tokenizer().tokenizer();
  const auto ids = tok.encode("12 + 305 = 317", false);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(tok.decode(std::vector<int32_t>{id}));
  const std::vector<std::string> want = {"1", "2", " +", " ", "3", "0", "5", " =", " ", "3", "1", "7"};
  EXPECT_EQ(pieces, want);
  const ArithProblem p = arith_problem(ArithOptions{}, ArithSplit::Train, 11);
  const std::string text = arith_user_prompt(p) + "\n" + p.solution;
  const auto t = tok.encode(text, false);
  EXPECT_EQ(tok.decode(t), text);
  EXPECT_LT(t.size(), text.size() / 2) << "merges should compress the task's text";
}

TEST(ArithTokenizer, ChatTemplateIsChatML) {
  const auto& ct = arith_chat_tokenizer();
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "Hi"}}, {{"role", "assistant"}, {"content", "Yo"}}});
  EXPECT_EQ(ct.render(msgs, false).value(), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo<|im_end|>\n");
  msgs.erase(1);
  EXPECT_EQ(ct.render(msgs, true).value(), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto ids = ct.encode("<|im_start|>user\n");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], ct.tokenizer().token_to_id("<|im_start|>"));
}

}  // namespace
}  // namespace kestrel::data
