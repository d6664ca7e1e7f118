#include "data/chat_tokenizer.h"

#include <filesystem>

#include "core/files.h"

namespace kestrel::data {

namespace {

std::optional<std::string> token_text(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Result<ChatTokenizer> ChatTokenizer::from_dir(const std::string& dir) {
  ChatTokenizer ct;
  ct.dir_ = dir;
  KS_ASSIGN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_dir(dir));
  ct.tok_ = std::make_shared<tokenizer::Tokenizer>(std::move(tok));
  std::string source;
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(cfg_path)) {
    KS_ASSIGN(std::string text, read_file(cfg_path));
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      return KS_ERR(cfg_path, ": not valid JSON: ", e.what());
    }
    ct.bos_text_ = token_text(cfg, "bos_token").value_or("");
    ct.eos_text_ = token_text(cfg, "eos_token").value_or("");
    if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
      if (it->is_string()) {
        source = it->get<std::string>();
      } else if (it->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const auto& e : *it)
          if (e.value("name", "") == "default") source = e.value("template", "");
        if (source.empty())
          return KS_ERR(cfg_path, ": chat_template is a list without a \"default\" entry (add one, or make it a string)");
      } else {
        return KS_ERR(cfg_path, ": chat_template must be a string or a list of {name, template}");
      }
    }
  }
  const std::string jinja = dir + "/chat_template.jinja";
  if (source.empty() && std::filesystem::exists(jinja)) {
    KS_ASSIGN(source, read_file(jinja));
  }
  if (!source.empty()) {
    auto t = chat::Template::parse(source);
    if (!t) return t.status().with_context(cfg_path + ": chat_template");
    ct.tmpl_ = std::move(t).value();
  }
  return ct;
}

Result<std::string> ChatTokenizer::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                          const nlohmann::ordered_json& extra) const {
  if (!tmpl_)
    return KS_ERR(dir_, ": the tokenizer has no chat template (tokenizer_config.json: chat_template); "
                  "add one or give prompts as plain text");
  nlohmann::ordered_json vars = extra;
  if (!vars.contains("bos_token")) vars["bos_token"] = bos_text_;
  if (!vars.contains("eos_token")) vars["eos_token"] = eos_text_;
  auto r = chat::apply_chat_template(*tmpl_, messages, add_generation_prompt, vars);
  if (!r) return r.status().with_context(dir_ + ": chat template");  // which template, for the sandbox limits
  return r;
}

Result<Truncation> parse_truncation(const std::string& s, const std::string& origin) {
  if (s == "error") return Truncation::Error;
  if (s == "left") return Truncation::Left;
  if (s == "right") return Truncation::Right;
  if (s == "middle") return Truncation::Middle;
  return KS_ERR(origin, ": truncation '", s, "' is not one of error, left, right, middle");
}

const char* truncation_name(Truncation t) {
  switch (t) {
    case Truncation::Error: return "error";
    case Truncation::Left: return "left";
    case Truncation::Right: return "right";
    case Truncation::Middle: return "middle";
  }
  return "?";
}

void truncate_ids(std::vector<int32_t>& ids, int64_t max_len, Truncation t, std::vector<uint8_t>* mask) {
  const int64_t n = int64_t(ids.size());
  if (n <= max_len || t == Truncation::Error) return;
  auto cut = [&](auto& v) {
    using V = std::decay_t<decltype(v)>;
    V out;
    if (t == Truncation::Left) {
      out.assign(v.end() - max_len, v.end());
    } else if (t == Truncation::Right) {
      out.assign(v.begin(), v.begin() + max_len);
    } else {
      const int64_t left = max_len / 2, right = max_len - left;
      out.assign(v.begin(), v.begin() + left);
      out.insert(out.end(), v.end() - right, v.end());
    }
    v = std::move(out);
  };
  cut(ids);
  if (mask) cut(*mask);
}

}  // namespace kestrel::data
