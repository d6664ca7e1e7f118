// verl-schema JSONL datasets: rendering, tokenization, truncation, malformed rows.
#include "data/dataset.h"
#include "data_test_util.h"

namespace kestrel::data {
namespace {

using oj = nlohmann::ordered_json;
using testutil::arith_chat_tokenizer;
using testutil::scratch_dir;
using testutil::write_text;

std::vector<int32_t> expected_prompt(const std::string& user) {
  const auto& ct = arith_chat_tokenizer();
  return ct.encode(ct.render(oj::array({{{"role", "user"}, {"content", user}}}), true).value());
}

TEST(RlDataset, ReadsListAndStringPromptsAndNumericTruth) {
  const std::string d = scratch_dir("rl_ok"), f = d + "/train.jsonl";
  write_text(f,
             R"({"data_source": "arith", "prompt": [{"role": "user", "content": "What is 2 + 3?"}], "ability": "math", "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": 0}})"
             "\n\n"
             R"({"data_source": "openai/gsm8k", "prompt": "What is 4 * 2?", "reward_model": {"ground_truth": 8}})"
             "\n");
  LoadStats st;
  auto rows = load_rl_dataset({f}, arith_chat_tokenizer(), RlDatasetOptions{}, &st).value();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].data_source, "arith");
  EXPECT_EQ(rows[0].ground_truth, "5");
  EXPECT_EQ(rows[0].ability, "math");
  EXPECT_EQ(rows[0].extra_info["index"], 0);
  EXPECT_EQ(rows[0].origin, f + ":1");
  EXPECT_EQ(rows[0].prompt_ids, expected_prompt("What is 2 + 3?"));
  EXPECT_EQ(rows[1].ground_truth, "8");
  EXPECT_EQ(rows[1].origin, f + ":3");
  EXPECT_EQ(rows[1].prompt_ids, expected_prompt("What is 4 * 2?"));
  EXPECT_EQ(st.rows, 2);
  EXPECT_EQ(st.kept, 2);
}

// searchR1's preprocess writes ground_truth as {"target": [...]}: kept as its
// JSON text, which the searchR1 scorer parses; null stays an error.
TEST(RlDataset, StructuredTruthIsKeptAsJsonText) {
  const std::string d = scratch_dir("rl_struct"), f = d + "/train.jsonl";
  write_text(f,
             R"({"data_source": "searchR1_nq", "prompt": "Who?", "reward_model": {"ground_truth": {"target": ["Ada", "Ada Lovelace"]}}})"
             "\n"
             R"({"data_source": "searchR1_nq", "prompt": "Who?", "reward_model": {"ground_truth": null}})"
             "\n");
  RlDatasetOptions o;
  auto bad = load_rl_dataset({f}, arith_chat_tokenizer(), o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find(f + ":2"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("is null"), std::string::npos) << bad.status().message();
  o.skip_malformed = true;
  auto rows = load_rl_dataset({f}, arith_chat_tokenizer(), o).value();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(oj::parse(rows[0].ground_truth), oj::parse(R"({"target": ["Ada", "Ada Lovelace"]})"));
}

TEST(RlDataset, MalformedRowNamesFileLineAndFieldOrIsSkipped) {
  const std::string d = scratch_dir("rl_bad"), f = d + "/train.jsonl";
  write_text(f,
             R"({"data_source": "arith", "prompt": "a", "reward_model": {"ground_truth": "1"}})" "\n"
             R"({"data_source": "arith", "prompt": "b", "reward_model": {}})" "\n"
             R"({"data_source": "arith", "prompt": "c", "reward_model": {"ground_truth": "3"})" "\n"
             R"({"data_source": "arith", "prompt": [{"role": "user"}], "reward_model": {"ground_truth": "4"}})" "\n"
             R"({"data_source": "arith", "prompt": "e", "reward_model": {"ground_truth": "5"}})" "\n");
  auto r = load_rl_dataset({f}, arith_chat_tokenizer(), RlDatasetOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find(f + ":2: field 'reward_model.ground_truth' is missing"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("data.skip_malformed"), std::string::npos);

  RlDatasetOptions o;
  o.skip_malformed = true;
  LoadStats st;
  auto rows = load_rl_dataset({f}, arith_chat_tokenizer(), o, &st).value();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].ground_truth, "5");
  EXPECT_EQ(st.skipped_malformed, 3);
  ASSERT_EQ(st.first_skipped.size(), 3u);
  EXPECT_NE(st.first_skipped[1].find(f + ":3: not valid JSON"), std::string::npos) << st.first_skipped[1];
  EXPECT_NE(st.first_skipped[2].find(f + ":4: field 'prompt[0].content'"), std::string::npos) << st.first_skipped[2];
}

TEST(RlDataset, MissingFilesFailClearly) {
  auto r = load_rl_dataset({"/nonexistent/train.parquet"}, arith_chat_tokenizer(), RlDatasetOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("/nonexistent/train.parquet: no such file"), std::string::npos);
  auto m = load_rl_dataset({"/nonexistent/train.jsonl"}, arith_chat_tokenizer(), RlDatasetOptions{});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("no such file"), std::string::npos);
}

TEST(RlDataset, OverlongPromptsErrorFilterOrTruncate) {
  const std::string d = scratch_dir("rl_long"), f = d + "/train.jsonl";
  write_text(f, R"({"data_source": "arith", "prompt": "1 2 3 4 5 6 7 8 9", "reward_model": {"ground_truth": "1"}})" "\n"
                R"({"data_source": "arith", "prompt": "1", "reward_model": {"ground_truth": "1"}})" "\n");
  const auto full = expected_prompt("1 2 3 4 5 6 7 8 9");
  const int64_t short_len = int64_t(expected_prompt("1").size());
  RlDatasetOptions o;
  o.max_prompt_length = short_len;
  try {
    (void)load_rl_dataset({f}, arith_chat_tokenizer(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(f + ":1: prompt is " + std::to_string(full.size()) + " tokens"), std::string::npos)
        << e.what();
  }
  o.filter_overlong_prompts = true;
  LoadStats st;
  EXPECT_EQ(load_rl_dataset({f}, arith_chat_tokenizer(), o, &st).value().size(), 1u);
  EXPECT_EQ(st.filtered_overlong, 1);
  o.filter_overlong_prompts = false;
  for (Truncation t : {Truncation::Left, Truncation::Right, Truncation::Middle}) {
    o.truncation = t;
    auto rows = load_rl_dataset({f}, arith_chat_tokenizer(), o).value();
    auto want = full;
    truncate_ids(want, short_len, t);
    EXPECT_EQ(rows[0].prompt_ids, want) << truncation_name(t);
    EXPECT_EQ(int64_t(rows[0].prompt_ids.size()), short_len);
  }
}

TEST(Truncation, VerlSemantics) {
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  std::vector<uint8_t> mask = {0, 0, 0, 1, 1, 1, 1};
  auto l = ids, r = ids, m = ids;
  truncate_ids(l, 4, Truncation::Left);
  truncate_ids(r, 4, Truncation::Right, &mask);
  truncate_ids(m, 5, Truncation::Middle);
  EXPECT_EQ(l, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(r, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(m, (std::vector<int32_t>{1, 2, 5, 6, 7}));  // first 5/2 = 2, last 3
  EXPECT_FALSE(parse_truncation("both", "data.truncation").is_ok());
}

TEST(SftDataset, PromptResponseTrainsResponseAndEos) {
  const auto& ct = arith_chat_tokenizer();
  SftDatasetOptions o;
  auto s = tokenize_sft_row(oj::parse(R"({"prompt": "What is 2 + 3?", "response": "2 + 3 = 5\n#### 5"})"), ct, o).value();
  const auto head = expected_prompt("What is 2 + 3?");
  const auto tail = ct.encode("2 + 3 = 5\n#### 5<|im_end|>");
  ASSERT_EQ(s.ids.size(), head.size() + tail.size());
  EXPECT_TRUE(std::equal(head.begin(), head.end(), s.ids.begin()));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), s.ids.begin() + int64_t(head.size())));
  EXPECT_EQ(s.prompt_length, int64_t(head.size()));
  EXPECT_EQ(s.num_loss_tokens(), int64_t(tail.size()));
  EXPECT_EQ(s.ids.back(), *ct.eos_id());
}

TEST(SftDataset, MessagesTrainEveryAssistantTurn) {
  const auto& ct = arith_chat_tokenizer();
  auto s = tokenize_sft_row(oj::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                               {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})"),
                            ct, SftDatasetOptions{})
               .value();
  std::string trained, all;
  for (size_t i = 0; i < s.ids.size(); ++i) {
    const std::string piece = ct.tokenizer().decode(std::vector<int32_t>{s.ids[i]});
    all += piece;
    if (s.loss_mask[i]) trained += piece;
  }
  EXPECT_EQ(all, "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                 "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\nd<|im_end|>\n");
  EXPECT_EQ(trained, "b<|im_end|>\nd<|im_end|>\n");
  auto bad = tokenize_sft_row(oj::parse(R"({"messages": [{"role": "user", "content": "a"}]})"), ct, SftDatasetOptions{});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("no assistant message"), std::string::npos);
}

TEST(SftDataset, MaxLengthTruncatesOrErrors) {
  const std::string d = scratch_dir("sft_long"), f = d + "/sft.jsonl";
  write_text(f, R"({"prompt": "What is 2 + 3?", "response": "2 + 3 = 5\n#### 5"})" "\n");
  SftDatasetOptions o;
  o.max_length = 10;
  try {
    (void)load_sft_dataset({f}, arith_chat_tokenizer(), o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(f + ":1: sample is"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.max_length=10"), std::string::npos) << e.what();
  }
  o.truncation = Truncation::Left;
  LoadStats st;
  auto rows = load_sft_dataset({f}, arith_chat_tokenizer(), o, &st).value();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].ids.size(), 10u);
  EXPECT_EQ(rows[0].loss_mask.size(), 10u);
  EXPECT_EQ(st.truncated, 1);
}

}  // namespace
}  // namespace kestrel::data
