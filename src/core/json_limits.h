// Bounds on JSON read from outside (tokenizer.json, config.json, safetensors
// headers and index files, dataset rows, reward-program replies). nlohmann's
// parser is iterative, but dump(), copies, comparisons and Kestrel's own
// walkers recurse once per level, so a row nested 100,000 deep overflows the
// stack long after it parsed. Every reader checks the text first with
// json_nesting_depth() and refuses deeper input with a message naming the
// file (and line), so nothing downstream sees it.
#pragma once
#include <cstddef>
#include <string_view>

namespace kestrel {

// Deeper than any real file: HF tokenizer.json and config.json nest < 10
// levels, verl dataset rows (extra_info, tool calls) < 20. Python's json stops
// near 1000 (its recursion limit).
inline constexpr int kMaxJsonDepth = 256;

// The deepest nesting of [ and { in `text`, outside string literals (escapes
// understood); stops scanning once it exceeds `stop_above`. Malformed text
// is scanned all the same: the parser reports its own errors.
inline int json_nesting_depth(std::string_view text, int stop_above = kMaxJsonDepth) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (in_string) {
      if (c == '\\') ++k;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_above) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace kestrel
