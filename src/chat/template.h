// Chat templates: renders the Jinja subset used by Hugging Face
// tokenizer_config.json chat templates, byte-for-byte as transformers'
// apply_chat_template(..., tokenize=False) does (jinja2 sandbox with
// trim_blocks, lstrip_blocks, and transformers' tojson / raise_exception /
// strftime_now globals). Constructs outside the subset fail with
// "chat template line L, col C: not supported yet: <construct>".
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::chat {

struct RenderOptions {
  // The clock strftime_now() reads; unset = the local time now (as transformers does).
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses the whole template up front, so syntax errors and unsupported
  // filters/tests/tags surface here rather than at the first render.
  static Result<Template> parse(std::string source);

  // Renders with `context` as the template's variables. Object key order matters
  // for `tojson` output: pass nlohmann::ordered_json to keep the caller's order
  // (nlohmann::json sorts keys).
  Result<std::string> render(const nlohmann::ordered_json& context, const RenderOptions& opt = {}) const;
  Result<std::string> render(const nlohmann::json& context, const RenderOptions& opt = {}) const;

  const std::string& source() const;

  struct Impl;  // opaque: the parsed syntax tree

 private:
  std::shared_ptr<const Impl> impl_;
};

// transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt=...,
// **extra): message keys whose value is null are dropped, the reasoning fields
// (reasoning_content / thinking / reasoning) are aliased to each other, `tools`
// and `documents` default to None, and every other key of `extra` (bos_token,
// eos_token, enable_thinking, ...) becomes a template variable.
Result<std::string> apply_chat_template(const Template& tmpl, const nlohmann::ordered_json& messages,
                                        bool add_generation_prompt,
                                        const nlohmann::ordered_json& extra = nlohmann::ordered_json::object(),
                                        const RenderOptions& opt = {});
Result<std::string> apply_chat_template(const Template& tmpl, const nlohmann::json& messages,
                                        bool add_generation_prompt, const nlohmann::json& extra,
                                        const RenderOptions& opt = {});

}  // namespace kestrel::chat
