// Pieces of the tokenizer checked against hand-derived values: lossy UTF-8, config errors, and the
// equivalence of the merge-loop variants and of cached vs uncached encoding.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tok_test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/decoder.h"
#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

using nlohmann::json;

TEST(Unicode, Utf8LossyMatchesRustFromUtf8Lossy) {
  // Values from Rust's String::from_utf8_lossy (maximal subparts -> one U+FFFD each).
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("abc"), "abc");
  EXPECT_EQ(utf8_lossy("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(utf8_lossy("\xC3"), R);
  EXPECT_EQ(utf8_lossy("\xE2\x82"), R);                // truncated 3-byte: one replacement
  EXPECT_EQ(utf8_lossy("\xE2\x82x"), R + "x");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), R);            // truncated emoji
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), R + R);            // overlong lead byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), R + R + R);    // surrogate: ED then A0 is out of range
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(utf8_lossy("\x80\xBF"), R + R);
}

TEST(Unicode, ByteToUnicodeIsGpt2Table) {
  const auto& t = byte_to_unicode();
  EXPECT_EQ(t[' '], U'\u0120');   // Ġ
  EXPECT_EQ(t['\n'], U'\u010A');  // Ċ
  EXPECT_EQ(t['A'], U'A');
  EXPECT_EQ(t[0xAD], U'\u0143');  // soft hyphen byte is remapped
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(t[b]), b);
  EXPECT_EQ(unicode_to_byte(U' '), -1);
}

// Writes a variant of a golden tokenizer.json with one key replaced, loads it and returns the status.
Status load_modified(const std::string& name, const std::function<void(json&)>& edit) {
  json j = json::parse(testutil::read_file("tests/golden/tokenizer/" + name + "/tokenizer.json"));
  edit(j);
  const auto path = std::filesystem::temp_directory_path() / ("kestrel_tok_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << j.dump();
  auto r = Tokenizer::from_file(path.string());
  std::filesystem::remove(path);
  return r.is_ok() ? Status::ok() : r.status();
}

TEST(Load, UnsupportedPartsNameThemselves) {
  auto has = [](const Status& s, const std::string& what) {
    return !s.is_ok() && s.message().find(what) != std::string::npos;
  };
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }),
                  "not supported yet: normalizer Lowercase"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }),
                  "not supported yet: pre_tokenizer Whitespace"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["model"]["type"] = "WordPiece"; }), "not supported yet: model WordPiece"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }), "not supported yet: decoder Metaspace"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["model"]["dropout"] = 0.1; }), "not supported yet: BPE dropout"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["model"]["merges"][0] = "abc"; }), "model.merges[0]"));
  EXPECT_TRUE(has(load_modified("gpt2", [](json& j) { j["model"]["merges"].push_back("Ġzzzq Ġqqqz"); }), "missing from model.vocab"));
  EXPECT_TRUE(Tokenizer::from_file("/nonexistent/tokenizer.json").status().message().find("/nonexistent/tokenizer.json") !=
              std::string::npos);
}

TEST(Bpe, HeapAndLinearMergeAndCacheAgree) {
  for (const std::string name : {"gpt2", "llama3", "bytefb"}) {
    auto tok = Tokenizer::from_dir(testutil::golden_dir(name)).value();
    const auto base = tok.encode(testutil::corpus(), false);
    auto& model = *tok.mutable_impl().model;
    model.set_cache_enabled(false);
    model.set_linear_merge_limit(0);  // heap for every word
    EXPECT_EQ(tok.encode(testutil::corpus(), false), base) << name;
    model.set_linear_merge_limit(1 << 20);  // linear for every word
    EXPECT_EQ(tok.encode(testutil::corpus(), false), base) << name;
  }
}

TEST(Bpe, ByteFallbackAndFusedUnk) {
  // bytefb has no <0xF0> token: an emoji is unknown, and consecutive unknowns fuse into one <unk>.
  auto tok = Tokenizer::from_dir(testutil::golden_dir("bytefb")).value();
  const int32_t unk = tok.token_to_id("<unk>");
  ASSERT_GE(unk, 0);
  const auto ids = tok.encode("\xF0\x9F\x98\x80\xF0\x9F\x98\x83", false);
  EXPECT_EQ(ids, std::vector<int32_t>{unk});
  // ‰ (E2 80 B0) has no <0xE2>; ʬ (CA AC) is out of the trained alphabet but has byte tokens.
  const auto fb = tok.encode("\xCA\xAC", false);
  EXPECT_EQ(fb, (std::vector<int32_t>{tok.token_to_id("<0xCA>"), tok.token_to_id("<0xAC>")}));
  EXPECT_EQ(tok.decode(fb), "\xCA\xAC");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{tok.token_to_id("<0xCA>")}), "\xEF\xBF\xBD");
}

// Expected strings from HF: tokenizers.decoders.<...>.decode(tokens).
TEST(Decoder, MatchesHfDecoders) {
  using V = std::vector<std::string>;
  auto run = [](const Decoder& d, V toks) {
    d.decode_chain(toks);
    std::string out;
    for (const auto& t : toks) out += t;
    return out;
  };
  std::vector<std::unique_ptr<Decoder>> llama2;
  llama2.push_back(make_replace_decoder("\u2581", " "));
  llama2.push_back(make_byte_fallback_decoder());
  llama2.push_back(make_fuse_decoder());
  llama2.push_back(make_strip_decoder(U' ', 1, 0));
  auto seq = make_sequence_decoder(std::move(llama2));
  EXPECT_EQ(run(*seq, V{"\u2581Hello", "\u2581wor", "ld", "<0xE2>", "<0x82>", "<0xAC>", "\u2581x", "<0xE2>", "<0x82>", "\u2581"}),
            "Hello world\u20ac x\ufffd\ufffd ");
  EXPECT_EQ(run(*make_strip_decoder(U'a', 2, 3), V{"aaxaaaa", "xa", "aaaaaxa"}), "xaxaaax");
  EXPECT_EQ(run(*make_byte_level_decoder(), V{"\u0120hello", "\u0120", "\u00e2\u0124", "<|im_end|>", "a b", "\u00c3"}),
            " hello \ufffd<|im_end|>a b\ufffd");
}

}  // namespace
}  // namespace kestrel::tokenizer
