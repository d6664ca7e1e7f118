// tokenizer.json (and tokenizer_config.json) -> Tokenizer::Impl.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

using json = nlohmann::json;

// Model-vocab ids index a table (id_to_model_token) and, downstream, the
// embedding: an id must be a non-negative integer small enough that the table
// stays a table. The largest HF vocabularies are ~262k (Gemma); 2^24 leaves
// room while keeping a hostile id from allocating gigabytes.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// A token id from JSON, range-checked: nlohmann's get<int32_t>() truncates
// (2^40 becomes 0 and aliases token 0) and accepts negatives.
Result<int32_t> token_id(const json& v, const std::string& what, int64_t limit) {
  if (!v.is_number_integer())
    return KS_ERR(what, " has id ", v.dump(), ", which is not an integer (ids are integers in [0, ", limit, "))");
  const bool neg = v.is_number_unsigned() ? false : v.get<int64_t>() < 0;
  const bool big = v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(limit) : v.get<int64_t>() >= limit;
  if (neg || big) return KS_ERR(what, " has id ", v.dump(), ", outside the id range [0, ", limit, ")");
  return static_cast<int32_t>(v.get<int64_t>());
}

bool get_bool(const json& j, const char* key, bool dflt) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? dflt : it->get<bool>();
}
std::string clip_token(const std::string& t) { return t.size() <= 60 ? t : t.substr(0, 60) + "..."; }
std::string type_of(const json& j) { return j.contains("type") ? j["type"].get<std::string>() : std::string("?"); }

Result<std::unique_ptr<Normalizer>> load_normalizer(const json& j) {
  const std::string t = type_of(j);
  if (t == "NFC") return make_nfc_normalizer();
  if (t == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& n : j.at("normalizers")) {
      KS_ASSIGN(auto p, load_normalizer(n));
      parts.push_back(std::move(p));
    }
    return make_sequence_normalizer(std::move(parts));
  }
  return KS_ERR("not supported yet: normalizer ", t);
}

Status load_pre_tokenizer(const json& j, PreTokenizer& pt) {
  const std::string t = type_of(j);
  if (t == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) KS_TRY(load_pre_tokenizer(p, pt));
    return Status::ok();
  }
  if (t == "ByteLevel") return pt.add_byte_level(get_bool(j, "add_prefix_space", true), get_bool(j, "use_regex", true));
  if (t == "Split") {
    const json& pat = j.at("pattern");
    std::unique_ptr<RegexSplitter> sp;
    if (pat.contains("Regex")) {
      KS_ASSIGN(sp, make_regex_splitter(pat["Regex"].get<std::string>()));
    } else if (pat.contains("String")) {
      sp = make_literal_splitter(pat["String"].get<std::string>());
    } else {
      return KS_ERR("pre_tokenizer Split: pattern must hold \"Regex\" or \"String\", got ", pat.dump());
    }
    KS_ASSIGN(auto behavior, parse_split_behavior(j.at("behavior").get<std::string>()));
    return pt.add_split(std::move(sp), behavior, get_bool(j, "invert", false));
  }
  return KS_ERR("not supported yet: pre_tokenizer ", t);
}

Result<std::unique_ptr<Decoder>> load_decoder(const json& j) {
  const std::string t = type_of(j);
  if (t == "ByteLevel") return make_byte_level_decoder();
  if (t == "ByteFallback") return make_byte_fallback_decoder();
  if (t == "Fuse") return make_fuse_decoder();
  if (t == "Strip") {
    const std::string c = j.at("content").get<std::string>();
    size_t len;
    const char32_t cp = c.empty() ? 0 : decode_utf8(c, 0, len);
    // A count of characters; nlohmann's get<size_t>() of a float or a negative number is undefined.
    auto count = [&](const char* k) -> Result<size_t> {
      const json& v = j.at(k);
      if (!v.is_number_unsigned()) return KS_ERR("decoder Strip: \"", k, "\" must be a non-negative integer, got ", v.dump());
      return size_t(v.get<uint64_t>());
    };
    KS_ASSIGN(const size_t start, count("start"));
    KS_ASSIGN(const size_t stop, count("stop"));
    return make_strip_decoder(cp, start, stop);
  }
  if (t == "Replace") {
    const json& pat = j.at("pattern");
    if (!pat.contains("String")) return KS_ERR("not supported yet: decoder Replace with a Regex pattern");
    return make_replace_decoder(pat["String"].get<std::string>(), j.at("content").get<std::string>());
  }
  if (t == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& d : j.at("decoders")) {
      KS_ASSIGN(auto p, load_decoder(d));
      parts.push_back(std::move(p));
    }
    return make_sequence_decoder(std::move(parts));
  }
  return KS_ERR("not supported yet: decoder ", t);
}

// Post-processors reduce to the single-sequence template (what encode() supports).
Status load_post_processor(const json& j, const Tokenizer::Impl& m, std::vector<TemplatePiece>& tpl) {
  const std::string t = type_of(j);
  if (t == "ByteLevel") return Status::ok();  // only trims offsets
  if (t == "Sequence") {
    for (const auto& p : j.at("processors")) KS_TRY(load_post_processor(p, m, tpl));
    return Status::ok();
  }
  if (t == "TemplateProcessing") {
    std::vector<TemplatePiece> out;
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].at("id").get<std::string>() != "A")
          return KS_ERR("post_processor TemplateProcessing: the single template may only hold sequence A");
        out.push_back({true, {}});
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        const json& st = j.at("special_tokens");
        if (!st.contains(name))
          return KS_ERR("post_processor TemplateProcessing: special token \"", name, "\" missing from special_tokens");
        std::vector<int32_t> ids;
        for (const auto& idj : st[name].at("ids")) {
          KS_ASSIGN(const int32_t id, token_id(idj, "special token \"" + clip_token(name) + "\"", m.vocab_size));
          ids.push_back(id);
        }
        out.push_back({false, std::move(ids)});
      } else {
        return KS_ERR("post_processor TemplateProcessing: unknown template item ", item.dump());
      }
    }
    if (!tpl.empty() && out.size() != 1) return KS_ERR("not supported yet: two templating post-processors in a Sequence");
    tpl = std::move(out);
    return Status::ok();
  }
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    KS_ASSIGN(const int32_t cls, token_id(j.at("cls").at(1), "post_processor cls token", m.vocab_size));
    KS_ASSIGN(const int32_t sep, token_id(j.at("sep").at(1), "post_processor sep token", m.vocab_size));
    tpl = {{false, {cls}}, {true, {}}, {false, {sep}}};
    return Status::ok();
  }
  return KS_ERR("not supported yet: post_processor ", t);
}

Status load_model(const json& j, bool byte_level, Tokenizer::Impl& m) {
  const std::string t = j.contains("type") ? j["type"].get<std::string>() : std::string("BPE");
  if (t != "BPE") return KS_ERR("not supported yet: model ", t);
  if (j.contains("dropout") && !j["dropout"].is_null() && j["dropout"].get<double>() != 0.0)
    return KS_ERR("not supported yet: BPE dropout (model.dropout must be null or 0 for inference)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (j.contains(k) && !j[k].is_null() && !j[k].get<std::string>().empty())
      return KS_ERR("not supported yet: BPE ", k, " \"", j[k].get<std::string>(), "\"");
  StrMap<int32_t> vocab;
  int32_t max_id = -1;
  std::unordered_map<int32_t, std::string> owner;  // id -> its token, to refuse two tokens on one id
  for (const auto& [tok, idj] : j.at("vocab").items()) {
    KS_ASSIGN(const int32_t id, token_id(idj, "model.vocab token \"" + clip_token(tok) + "\"", kMaxTokenId));
    auto [it, fresh] = owner.emplace(id, tok);
    if (!fresh)
      return KS_ERR("model.vocab tokens \"", clip_token(it->second), "\" and \"", clip_token(tok), "\" both have id ", id,
                    " (each id names one token)");
    vocab.emplace(tok, id);
    max_id = std::max(max_id, id);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  size_t idx = 0;
  for (const auto& mj : j.at("merges")) {
    if (mj.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        return KS_ERR("model.merges[", idx, "] = \"", s, "\" is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (mj.is_array() && mj.size() == 2) {
      merges.emplace_back(mj[0].get<std::string>(), mj[1].get<std::string>());
    } else {
      return KS_ERR("model.merges[", idx, "] must be \"a b\" or [\"a\", \"b\"], got ", mj.dump());
    }
    ++idx;
  }
  BpeOptions o;
  o.byte_level = byte_level;
  o.ignore_merges = get_bool(j, "ignore_merges", false);
  o.byte_fallback = get_bool(j, "byte_fallback", false);
  o.fuse_unk = get_bool(j, "fuse_unk", false);
  if (j.contains("unk_token") && !j["unk_token"].is_null()) {
    const std::string unk = j["unk_token"].get<std::string>();
    auto it = vocab.find(unk);
    if (it == vocab.end()) return KS_ERR("model.unk_token \"", unk, "\" is not in model.vocab");
    o.unk_id = it->second;
  }
  m.id_to_model_token.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : vocab) m.id_to_model_token[id] = tok;
  m.vocab_size = max_id + 1;
  try {
    m.model = std::make_unique<BpeModel>(std::move(vocab), merges, o);
  } catch (const Error& e) {
    return KS_ERR("model: ", e.what());
  }
  return Status::ok();
}

Status load_added(const json& j, Tokenizer::Impl& m) {
  // Added tokens extend the model vocab densely (HF gives each new one the
  // next id) or reuse a model id: one past the model vocab plus their count
  // bounds them. An id beyond that would index past any embedding sized from
  // the vocabulary.
  const int64_t limit = m.vocab_size + static_cast<int64_t>(j.size());
  for (const auto& a : j) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    KS_ASSIGN(t.id, token_id(a.at("id"), "added token \"" + clip_token(t.content) + "\"", limit));
    t.single_word = get_bool(a, "single_word", false);
    t.lstrip = get_bool(a, "lstrip", false);
    t.rstrip = get_bool(a, "rstrip", false);
    t.special = get_bool(a, "special", false);
    t.normalized = get_bool(a, "normalized", !t.special);
    if (t.content.empty()) continue;
    t.decoded = t.content;
    if (t.normalized && m.normalizer) m.normalizer->normalize(t.content, t.decoded);
    m.added_by_content[t.content] = t.id;
    m.added_by_id[t.id] = static_cast<int32_t>(m.added.size());
    if (t.special) m.special_contents.insert(t.content);
    m.vocab_size = std::max<int64_t>(m.vocab_size, int64_t{t.id} + 1);
    m.added.push_back(std::move(t));
  }
  // Special tokens first, then the others, as HF builds its tries.
  std::vector<std::pair<std::string, int32_t>> raw, norm;
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < m.added.size(); ++i) {
      const AddedToken& t = m.added[i];
      if (t.special != (pass == 0)) continue;
      if (!t.normalized) {
        raw.emplace_back(t.content, static_cast<int32_t>(i));
      } else {
        norm.emplace_back(t.decoded, static_cast<int32_t>(i));
      }
    }
  }
  m.raw_matcher = std::make_unique<AddedTokenMatcher>(&m.added, std::move(raw));
  m.norm_matcher = std::make_unique<AddedTokenMatcher>(&m.added, std::move(norm));
  return Status::ok();
}

Status load_json(const json& j, Tokenizer::Impl& m) {
  for (const char* k : {"truncation", "padding"})
    if (j.contains(k) && !j[k].is_null())
      return KS_ERR("not supported yet: \"", k, "\" in tokenizer.json (set it to null; callers truncate and pad)");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    auto r = load_normalizer(j["normalizer"]);
    if (!r) return r.status().with_context("normalizer");
    m.normalizer = std::move(r).value();
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    KS_TRY(load_pre_tokenizer(j["pre_tokenizer"], m.pre_tokenizer).with_context("pre_tokenizer"));
  if (!j.contains("model")) return KS_ERR("no \"model\" key");
  KS_TRY(load_model(j["model"], m.pre_tokenizer.has_byte_level(), m));
  KS_TRY(load_added(j.contains("added_tokens") ? j["added_tokens"] : json::array(), m).with_context("added_tokens"));
  if (j.contains("post_processor") && !j["post_processor"].is_null())
    KS_TRY(load_post_processor(j["post_processor"], m, m.single_template).with_context("post_processor"));
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    auto r = load_decoder(j["decoder"]);
    if (!r) return r.status().with_context("decoder");
    m.decoder = std::move(r).value();
  }
  // A template that starts with a fixed token names the BOS (Llama-3's <|begin_of_text|>).
  if (!m.single_template.empty() && !m.single_template[0].is_sequence && m.single_template[0].ids.size() == 1)
    m.bos = m.single_template[0].ids[0];
  return Status::ok();
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return KS_ERR(path, ": cannot open (does the file exist and is it readable?)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// tokenizer_config.json writes a token as a string or as {"content": ...} (an AddedToken).
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  KS_ASSIGN(std::string text, read_text(path));
  return from_json_text(text, path);
}

Result<Tokenizer> Tokenizer::from_json_text(const std::string& text, const std::string& path) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    return KS_ERR(path, ": JSON nested deeper than ", kMaxJsonDepth, " levels (a tokenizer.json nests fewer than 10)");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return KS_ERR(path, ": not valid JSON: ", e.what());
  }
  auto m = std::make_unique<Impl>();
  m->source = path;
  try {
    KS_TRY(load_json(j, *m).with_context(path));
  } catch (const json::exception& e) {
    return KS_ERR(path, ": unexpected tokenizer.json layout: ", e.what());
  }
  return Tokenizer(std::move(m));
}

Result<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  const std::filesystem::path d(dir);
  KS_ASSIGN(Tokenizer tok, from_file((d / "tokenizer.json").string()));
  const auto cfg_path = (d / "tokenizer_config.json").string();
  if (!std::filesystem::exists(cfg_path)) return tok;
  KS_ASSIGN(std::string text, read_text(cfg_path));
  if (json_nesting_depth(text) > kMaxJsonDepth)
    return KS_ERR(cfg_path, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
  json cfg;
  try {
    cfg = json::parse(text);
  } catch (const json::exception& e) {
    return KS_ERR(cfg_path, ": not valid JSON: ", e.what());
  }
  for (auto [key, slot] : {std::pair{"bos_token", &tok.impl_->bos}, std::pair{"eos_token", &tok.impl_->eos}}) {
    if (!cfg.contains(key)) continue;
    const auto name = config_token(cfg, key);
    if (!name) {
      if (std::string(key) == "bos_token") *slot = std::nullopt;  // explicit null: the model has no BOS
      continue;
    }
    const int32_t id = tok.token_to_id(*name);
    if (id < 0) return KS_ERR(cfg_path, ": ", key, " \"", *name, "\" is not a token of tokenizer.json");
    *slot = id;
  }
  return tok;
}

}  // namespace kestrel::tokenizer
