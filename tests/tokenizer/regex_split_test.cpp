// Pre-tokenizer regexes: the hand-written matchers against HF's own splits (onig) and against the
// ICU fallback on the whole corpus; the ICU fallback itself for patterns HF users write.
#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/regex_split.h"

namespace kestrel::tokenizer {
namespace {

using nlohmann::json;

std::vector<std::string> split_isolated(const RegexSplitter& sp, std::string_view s) {
  PreTokenizer pt;
  struct Fwd final : RegexSplitter {
    const RegexSplitter* inner;
    void for_each_match(std::string_view t, FunctionRef<void(size_t, size_t)> f) const override { inner->for_each_match(t, f); }
    bool is_fast() const override { return inner->is_fast(); }
  };
  auto fwd = std::make_unique<Fwd>();
  fwd->inner = &sp;
  EXPECT_TRUE(pt.add_split(std::move(fwd), SplitBehavior::Isolated, false).is_ok());
  std::vector<std::string> out;
  pt.run(s, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::string pattern_of(const std::string& name) {
  if (name == "gpt2") return std::string(kGpt2Pattern);
  if (name == "qwen2") return std::string(kQwen2Pattern);
  return std::string(kLlama3Pattern);
}

// Splits produced by HF tokenizers' Split(Regex(...), "isolated") (pre_tokenize_str).
const char* kHfSplits = R"json(
{"gpt2": [["a'\u017fx it'S 'LL 'Re don't", ["a", "'", "\u017fx", " it", "'", "S", " '", "LL", " '", "Re", " don", "'t"]], ["a\u000bb\u0085c\u00a0d  \n\n  x", ["a", "\u000b", "b", "\u0085", "c", "\u00a0", "d", "  \n\n ", " x"]], ["  x  \r\n\ty 12345 3.14!!  ?\n", [" ", " x", "  \r\n", "\t", "y", " 12345", " 3", ".", "14", "!!", " ", " ?", "\n"]], ["\ud83d\ude00abc \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\uddef\ud83c\uddf5 ", ["\ud83d\ude00", "abc", " \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", " \ud83c\uddef\ud83c\uddf5", " "]], ["   ", ["   "]], ["x   ", ["x", "   "]]], "qwen2": [["a'\u017fx it'S 'LL 'Re don't", ["a", "'\u017f", "x", " it", "'S", " '", "LL", " '", "Re", " don", "'t"]], ["a\u000bb\u0085c\u00a0d  \n\n  x", ["a", "\u000bb", "\u0085c", "\u00a0d", "  \n\n", " ", " x"]], ["  x  \r\n\ty 12345 3.14!!  ?\n", [" ", " x", "  \r\n", "\ty", " ", "1", "2", "3", "4", "5", " ", "3", ".", "1", "4", "!!", " ", " ?\n"]], ["\ud83d\ude00abc \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\uddef\ud83c\uddf5 ", ["\ud83d\ude00abc", " \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", " \ud83c\uddef\ud83c\uddf5", " "]], ["   ", ["   "]], ["x   ", ["x", "   "]]], "llama3": [["a'\u017fx it'S 'LL 'Re don't", ["a", "'\u017f", "x", " it", "'S", " '", "LL", " '", "Re", " don", "'t"]], ["a\u000bb\u0085c\u00a0d  \n\n  x", ["a", "\u000bb", "\u0085c", "\u00a0d", "  \n\n", " ", " x"]], ["  x  \r\n\ty 12345 3.14!!  ?\n", [" ", " x", "  \r\n", "\ty", " ", "123", "45", " ", "3", ".", "14", "!!", " ", " ?\n"]], ["\ud83d\ude00abc \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\uddef\ud83c\uddf5 ", ["\ud83d\ude00abc", " \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67", " \ud83c\uddef\ud83c\uddf5", " "]], ["   ", ["   "]], ["x   ", ["x", "   "]]]}
)json";

TEST(RegexSplit, FastMatchersReproduceHfSplits) {
  const json cases = json::parse(kHfSplits);
  for (const auto& [name, list] : cases.items()) {
    auto fast = make_regex_splitter(pattern_of(name)).value();
    auto icu = make_regex_splitter(pattern_of(name), false).value();
    ASSERT_TRUE(fast->is_fast());
    ASSERT_FALSE(icu->is_fast());
    for (const auto& c : list) {
      const std::string text = c[0];
      const auto want = c[1].get<std::vector<std::string>>();
      EXPECT_EQ(split_isolated(*fast, text), want) << name << " fast on " << json(text).dump();
      EXPECT_EQ(split_isolated(*icu, text), want) << name << " ICU on " << json(text).dump();
    }
  }
}

TEST(RegexSplit, FastMatchersEqualIcuOnCorpus) {
  std::vector<std::string> texts = testutil::corpus_lines();
  texts.push_back(testutil::corpus());
  // Inputs that stress the backtracking corners.
  texts.insert(texts.end(), {"'", "''", "'S", "'ſ", "'LL'", "a 'll", " \n \n ", "\r\n\r\n  ", " ", "  ", "1 2  3   ",
                             "x\t\t", "!!\r\n\r\nx", " !?\n\n", "٣٤٥ⅫⅦ½", "\xff\xfe bad utf8 \xc3", "a\u0301\u0302b"});
  for (const std::string name : {"gpt2", "qwen2", "llama3"}) {
    auto fast = make_regex_splitter(pattern_of(name)).value();
    auto icu = make_regex_splitter(pattern_of(name), false).value();
    for (const auto& t : texts) {
      if (t.find('\xff') != std::string::npos) {
        // Invalid UTF-8: only require that the fast matcher tiles the input.
        std::string joined;
        for (const auto& p : split_isolated(*fast, t)) joined += p;
        EXPECT_EQ(joined, t);
        continue;
      }
      ASSERT_EQ(split_isolated(*fast, t), split_isolated(*icu, t)) << name << " on " << json(t).dump();
    }
  }
}

TEST(RegexSplit, OnigWhiteSpaceRewrite) {
  EXPECT_EQ(onig_to_icu_pattern(R"(\s+(?!\S)|[^\s\p{L}])"), R"(\p{White_Space}+(?!\P{White_Space})|[^\p{White_Space}\p{L}])");
  EXPECT_EQ(onig_to_icu_pattern(R"(\\s)"), R"(\\s)");  // an escaped backslash followed by s
}

TEST(RegexSplit, BadPatternIsAClearError) {
  auto r = make_regex_splitter("(unclosed");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not supported yet: pre-tokenizer regex `(unclosed`"), std::string::npos);
}

std::vector<std::string> run(const PreTokenizer& pt, std::string_view s) {
  std::vector<std::string> out;
  pt.run(s, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// Expected values from HF: pre_tokenizers.Split(pattern, behavior, invert).pre_tokenize_str(text).
TEST(PreTokenizer, SplitBehaviors) {
  auto make = [](const char* pat, SplitBehavior b, bool invert) {
    PreTokenizer pt;
    EXPECT_TRUE(pt.add_split(make_literal_splitter(pat), b, invert).is_ok());
    return pt;
  };
  const std::string s = "the-final--countdown-";
  using V = std::vector<std::string>;
  EXPECT_EQ(run(make("-", SplitBehavior::Removed, false), s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(run(make("-", SplitBehavior::Isolated, false), s), (V{"the", "-", "final", "-", "-", "countdown", "-"}));
  EXPECT_EQ(run(make("-", SplitBehavior::MergedWithPrevious, false), s), (V{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(run(make("-", SplitBehavior::MergedWithNext, false), s), (V{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(run(make("-", SplitBehavior::Contiguous, false), s), (V{"the", "-", "final", "--", "countdown", "-"}));
  EXPECT_EQ(run(make("-", SplitBehavior::Removed, true), s), (V{"-", "-", "-", "-"}));
}

TEST(PreTokenizer, ByteLevelPrefixSpace) {
  PreTokenizer pt;
  ASSERT_TRUE(pt.add_byte_level(true, true).is_ok());
  using V = std::vector<std::string>;
  EXPECT_EQ(run(pt, "Hello world"), (V{" Hello", " world"}));
  EXPECT_EQ(run(pt, " Hello"), (V{" Hello"}));
  EXPECT_FALSE(pt.add_byte_level(false, false).is_ok());
  EXPECT_FALSE(pt.add_split(make_literal_splitter("-"), SplitBehavior::Isolated, false).is_ok());
}

}  // namespace
}  // namespace kestrel::tokenizer
