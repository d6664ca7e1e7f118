// Token ids from tokenizer.json are range-checked (issue 20): a negative id
// wrote out of bounds and crashed in free(); 2^40 was truncated to 0 and
// aliased token 0; added tokens with ids -5 or 100000 were emitted as they are.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace kestrel::tokenizer {
namespace {

using json = nlohmann::json;

json base() {
  return json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
                         "added_tokens": [{"id": 3, "content": "<s>", "special": true}]})");
}

std::string load_error(const json& j) {
  auto r = Tokenizer::from_json_text(j.dump(), "m/tokenizer.json");
  return r.is_ok() ? "loaded" : r.status().message();
}

TEST(TokenIds, ValidFileLoads) {
  auto r = Tokenizer::from_json_text(base().dump(), "m/tokenizer.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r.value().vocab_size(), 4);
  EXPECT_EQ(r.value().encode("ab<s>", false), (std::vector<int32_t>{2, 3}));
}

TEST(TokenIds, VocabIdsOutOfRangeAreRefused) {
  for (const json& bad : {json(-1), json(int64_t(1) << 40), json(1.5), json("7"), json(uint64_t(1) << 63)}) {
    json j = base();
    j["model"]["vocab"]["zz"] = bad;
    const std::string e = load_error(j);
    EXPECT_NE(e.find("m/tokenizer.json: model.vocab token \"zz\" has id " + bad.dump()), std::string::npos) << e;
    EXPECT_NE(e.find("[0, 16777216)"), std::string::npos) << e;
  }
  json j = base();
  j["model"]["vocab"]["zz"] = 1;  // two tokens on one id
  EXPECT_NE(load_error(j).find("both have id 1"), std::string::npos) << load_error(j);
}

TEST(TokenIds, AddedTokenIdsOutsideTheVocabularyAreRefused) {
  for (int64_t bad : {int64_t(-5), int64_t(100000)}) {
    json j = base();
    j["added_tokens"][0]["id"] = bad;
    const std::string e = load_error(j);
    EXPECT_NE(e.find("m/tokenizer.json: added_tokens: added token \"<s>\" has id " + std::to_string(bad) +
                     ", outside the id range [0, 4)"), std::string::npos) << e;
  }
}

TEST(TokenIds, PostProcessorIdsAreChecked) {
  json j = base();
  j["post_processor"] = json::parse(R"({"type": "RobertaProcessing", "cls": ["<s>", -1], "sep": ["<s>", 3]})");
  EXPECT_NE(load_error(j).find("post_processor cls token has id -1"), std::string::npos) << load_error(j);
}

TEST(TokenIds, DeepJsonIsRefused) {
  const std::string e = Tokenizer::from_json_text("{\"model\": " + std::string(100000, '[') + "}", "m/tokenizer.json")
                            .status().message();
  EXPECT_NE(e.find("m/tokenizer.json: JSON nested deeper than 256 levels"), std::string::npos) << e;
}

// fuzz_tokenizer_load found "start": 4.4e102 reaching nlohmann's get<size_t>(), undefined
// behaviour (UBSan); the Strip decoder's counts are checked like ids.
TEST(TokenIds, StripDecoderCountsMustBeNonNegativeIntegers) {
  for (const json& bad : {json(4.44e102), json(-1), json(1.5), json("1")}) {
    json j = base();
    j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", bad}};
    EXPECT_NE(load_error(j).find("decoder Strip: \"stop\" must be a non-negative integer, got " + bad.dump()),
              std::string::npos) << load_error(j);
  }
  json j = base();
  j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}};
  EXPECT_EQ(load_error(j), "loaded");
}

}  // namespace
}  // namespace kestrel::tokenizer
