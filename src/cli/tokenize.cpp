// kestrel tokenize: text or chats to token ids with an HF tokenizer folder.
//   {"text": "..."}           -> {"input_ids": [...]}
//   --chat {"messages": [...]} -> {"input_ids": [...]} via the chat template
// (--add-generation-prompt appends the assistant header, as for generation).
// The output is written atomically; a bad line fails with file:line.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/files.h"
#include "data/chat_tokenizer.h"
#include "data/dataset.h"

namespace kestrel::cli {

int cmd_tokenize(const Args& argv);

int cmd_tokenize(const Args& argv) {
  ParsedArgs args("tokenize",
                  {{"tokenizer", "folder with tokenizer.json (and tokenizer_config.json for --chat)", true, ""},
                   {"input", "JSONL: {\"text\": ...} per line, or {\"messages\": [...]} with --chat", true, ""},
                   {"output", "JSONL written atomically: {\"input_ids\": [...]} per input line", true, ""},
                   {"chat", "render \"messages\" with the tokenizer's chat template", false, ""},
                   {"add-generation-prompt", "with --chat: end with the assistant header", false, ""},
                   {"add-special-tokens", "plain text: apply the post-processor (e.g. a BOS)", false, ""}},
                  argv);
  if (args.help()) {
    std::printf("%s", args.usage().c_str());
    return 0;
  }
  auto tok_r = data::ChatTokenizer::from_dir(args.require("tokenizer"));
  if (!tok_r) KS_FAIL(tok_r.status().message());
  const data::ChatTokenizer& tok = *tok_r;
  const bool chat = args.has("chat"), gen = args.has("add-generation-prompt"), special = args.has("add-special-tokens");
  if (gen && !chat) KS_FAIL("kestrel tokenize: --add-generation-prompt needs --chat");
  if (chat && !tok.has_chat_template())
    KS_FAIL(args.get("tokenizer"), ": no chat template in tokenizer_config.json; --chat needs one");
  const std::string in = args.require("input");
  check_output_file(args.require("output"), "--output", {{in, "--input"}}).throw_if_error();
  std::string out;
  int64_t n = 0;
  Status st = data::read_jsonl_rows(in, [&](nlohmann::ordered_json& row, int64_t line) -> Status {
    std::vector<int32_t> ids;
    if (chat) {
      if (!row.contains("messages") || !row["messages"].is_array())
        return KS_ERR(in, ":", line, ": field 'messages' is missing or not a list");
      auto text = tok.render(row["messages"], gen);
      if (!text) return text.status().with_context(in + ":" + std::to_string(line));
      ids = tok.encode(*text);
    } else {
      if (!row.contains("text") || !row["text"].is_string())
        return KS_ERR(in, ":", line, ": field 'text' is missing or not a string");
      ids = tok.tokenizer().encode(row["text"].get<std::string>(), special);
    }
    out += nlohmann::json{{"input_ids", ids}}.dump() + "\n";
    ++n;
    return Status::ok();
  });
  st.throw_if_error();
  write_file_atomic(args.require("output"), out).throw_if_error();
  std::fprintf(stderr, "tokenize: %lld lines -> %s\n", (long long)n, args.get("output").c_str());
  return 0;
}

}  // namespace kestrel::cli
