#include "data/builtin_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "data/arith.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/unicode.h"

namespace kestrel::data {

const char* const kChatMLTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

namespace {

constexpr const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

std::string byte_token(unsigned char b) {
  std::string s;
  tokenizer::append_utf8(s, tokenizer::byte_to_unicode()[b]);
  return s;
}

// Removes special-token strings so they never feed merges.
std::vector<std::string> split_specials(const std::string& text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t best = std::string::npos, len = 0;
    for (const char* sp : kSpecials) {
      const size_t p = text.find(sp, i);
      if (p < best) { best = p; len = std::char_traits<char>::length(sp); }
    }
    if (best == std::string::npos) { out.push_back(text.substr(i)); break; }
    if (best > i) out.push_back(text.substr(i, best - i));
    i = best + len;
  }
  return out;
}

}  // namespace

BpeModel train_byte_level_bpe(const std::vector<std::string>& texts, int64_t max_merges, int64_t min_frequency) {
  auto splitter = tokenizer::make_regex_splitter(std::string(tokenizer::kQwen2Pattern)).value();
  // Distinct pre-tokenized pieces and their counts; std::map keeps the order deterministic.
  std::map<std::string, int64_t> pieces;
  for (const auto& text : texts) {
    for (const auto& part : split_specials(text)) {
      splitter->for_each_match(part, [&](size_t b, size_t e) { ++pieces[part.substr(b, e - b)]; });
    }
  }
  BpeModel m;
  // Byte tokens in GPT-2's order: by the code point each byte maps to.
  std::vector<int> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = b;
  std::sort(bytes.begin(), bytes.end(), [](int a, int b) {
    return tokenizer::byte_to_unicode()[a] < tokenizer::byte_to_unicode()[b];
  });
  std::vector<int> byte_id(256);
  std::map<std::string, int> ids;
  for (int i = 0; i < 256; ++i) {
    byte_id[bytes[i]] = i;
    m.vocab.push_back(byte_token((unsigned char)bytes[i]));
    ids.emplace(m.vocab.back(), i);
  }
  struct Word {
    std::vector<int> sym;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : pieces) {
    Word w{{}, count};
    for (unsigned char c : piece) w.sym.push_back(byte_id[c]);
    words.push_back(std::move(w));
  }
  for (int64_t it = 0; it < max_merges; ++it) {
    std::map<std::pair<int, int>, int64_t> pairs;
    for (const auto& w : words)
      for (size_t i = 0; i + 1 < w.sym.size(); ++i) pairs[{w.sym[i], w.sym[i + 1]}] += w.count;
    const std::pair<int, int>* best = nullptr;
    int64_t best_n = 0;
    std::string best_str;
    for (const auto& [pr, n] : pairs) {
      if (n < best_n || n < min_frequency) continue;
      std::string s = m.vocab[size_t(pr.first)] + " " + m.vocab[size_t(pr.second)];
      if (n > best_n || s < best_str) { best = &pr; best_n = n; best_str = std::move(s); }
    }
    if (!best) break;
    const auto [a, b] = *best;
    m.merges.emplace_back(m.vocab[size_t(a)], m.vocab[size_t(b)]);
    // Two different pairs can spell the same string ("ab c", "a bc"): one id, as HF's trainer does.
    std::string merged = m.vocab[size_t(a)] + m.vocab[size_t(b)];
    auto [pos, fresh] = ids.emplace(merged, int(m.vocab.size()));
    if (fresh) m.vocab.push_back(std::move(merged));
    const int id = pos->second;
    for (auto& w : words) {
      std::vector<int> out;
      out.reserve(w.sym.size());
      for (size_t i = 0; i < w.sym.size(); ++i) {
        if (i + 1 < w.sym.size() && w.sym[i] == a && w.sym[i + 1] == b) { out.push_back(id); ++i; }
        else out.push_back(w.sym[i]);
      }
      w.sym = std::move(out);
    }
  }
  return m;
}

TokenizerFiles make_tokenizer_files(const BpeModel& bpe) {
  using oj = nlohmann::ordered_json;
  TokenizerFiles f;
  const int32_t first_special = int32_t(bpe.vocab.size());
  oj added = oj::array();
  oj decoder_map = oj::object();
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", first_special + i}, {"content", kSpecials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
    decoder_map[std::to_string(first_special + i)] = {{"content", kSpecials[i]}, {"lstrip", false},
                                                      {"normalized", false}, {"rstrip", false},
                                                      {"single_word", false}, {"special", true}};
  }
  oj byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  oj vocab = oj::object();
  for (size_t i = 0; i < bpe.vocab.size(); ++i) vocab[bpe.vocab[i]] = int32_t(i);
  oj merges = oj::array();
  for (const auto& [a, b] : bpe.merges) merges.push_back(oj::array({a, b}));
  oj tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = added;
  tj["normalizer"] = nullptr;
  tj["pre_tokenizer"] = {{"type", "Sequence"},
                         {"pretokenizers",
                          oj::array({{{"type", "Split"},
                                      {"pattern", {{"Regex", std::string(tokenizer::kQwen2Pattern)}}},
                                      {"behavior", "Isolated"},
                                      {"invert", false}},
                                     byte_level})}};
  tj["post_processor"] = byte_level;
  tj["decoder"] = byte_level;
  tj["model"] = {{"type", "BPE"},          {"dropout", nullptr},      {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false},      {"byte_fallback", false},  {"ignore_merges", false},
                 {"vocab", vocab},         {"merges", merges}};
  f.tokenizer_json = tj.dump(2) + "\n";

  oj cfg;
  cfg["add_bos_token"] = false;
  cfg["add_prefix_space"] = false;
  cfg["added_tokens_decoder"] = decoder_map;
  cfg["additional_special_tokens"] = oj::array({"<|im_start|>", "<|im_end|>"});
  cfg["bos_token"] = nullptr;
  cfg["chat_template"] = kChatMLTemplate;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = "<|im_end|>";
  cfg["errors"] = "replace";
  cfg["model_max_length"] = 2048;
  cfg["pad_token"] = "<|endoftext|>";
  cfg["split_special_tokens"] = false;
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  cfg["unk_token"] = nullptr;
  f.tokenizer_config_json = cfg.dump(2) + "\n";
  f.vocab_size = first_special + 3;
  f.pad_id = first_special;
  f.eos_id = first_special + 2;
  return f;
}

TokenizerFiles arith_tokenizer(int64_t max_vocab) {
  KS_CHECK(max_vocab >= 259, "arith tokenizer: max_vocab must cover 256 bytes and 3 special tokens");
  // A fixed corpus: the tokenizer must not change with a dataset's seed or difficulty.
  ArithOptions opt;
  opt.seed = 20240601;
  opt.min_steps = 1;
  opt.max_steps = 3;
  std::vector<std::string> texts;
  for (uint64_t i = 0; i < 3000; ++i) {
    const ArithProblem p = arith_problem(opt, ArithSplit::Train, i);
    texts.push_back("<|im_start|>user\n" + arith_user_prompt(p) + "<|im_end|>\n<|im_start|>assistant\n" +
                    p.solution + "<|im_end|>\n");
  }
  return make_tokenizer_files(train_byte_level_bpe(texts, max_vocab - 256 - 3));
}

Status write_tokenizer_files(const std::string& dir, const TokenizerFiles& files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KS_ERR(dir, ": cannot create the folder: ", ec.message());
  KS_TRY(write_file_atomic(dir + "/tokenizer.json", files.tokenizer_json));
  return write_file_atomic(dir + "/tokenizer_config.json", files.tokenizer_config_json);
}

}  // namespace kestrel::data
