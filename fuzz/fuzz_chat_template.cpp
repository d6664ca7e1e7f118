// A chat template (the Jinja subset): lex, parse, render. The input is the
// template, optionally followed by a NUL byte and a JSON array of messages
// (a fixed conversation with a tool call otherwise).
#include <cstring>

#include <nlohmann/json.hpp>

#include "chat/template.h"
#include "core/json_limits.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using oj = nlohmann::ordered_json;
  const std::string in = kestrel::fuzz::as_string(data, size);
  const size_t nul = in.find('\0');
  auto t = kestrel::chat::Template::parse(in.substr(0, nul));
  if (!t) return 0;
  static const oj fixed = oj::parse(R"([{"role":"system","content":"Be brief."},
    {"role":"user","content":"What is 2+2? <|im_end|>"},
    {"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"add","arguments":{"a":2,"b":2}}}]},
    {"role":"tool","content":"4"},{"role":"assistant","content":"4","reasoning_content":"2+2=4"}])");
  oj msgs = fixed;
  if (nul != std::string::npos && kestrel::json_nesting_depth(in.substr(nul + 1)) <= kestrel::kMaxJsonDepth) {
    // (deeper data never reaches a template: the dataset reader refuses it)
    msgs = oj::parse(in.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (msgs.is_discarded()) msgs = fixed;
  }
  kestrel::chat::RenderOptions opt;
  opt.now = std::tm{};
  const oj extra = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"enable_thinking", false},
                    {"tools", oj::parse(R"([{"type":"function","function":{"name":"add","parameters":{}}}])")}};
  // The second render (no generation prompt, no extra variables) only after a
  // first that worked: a template that runs into a limit costs one render.
  if (kestrel::chat::apply_chat_template(t.value(), msgs, true, extra, opt))
    (void)kestrel::chat::apply_chat_template(t.value(), msgs, false, oj::object(), opt);
  return 0;
}
