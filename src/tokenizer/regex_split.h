// Regex matching for Split pre-tokenizers with the semantics of HF tokenizers (onig, leftmost-first
// alternation, Unicode \p{..}, \s = White_Space). The GPT-2, Qwen2 and Llama-3 patterns (recognized by
// exact string equality) get hand-written matchers; any other pattern runs on ICU's RegexMatcher.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "core/status.h"

namespace kestrel::tokenizer {

// A non-owning reference to a callable (cheaper than std::function on hot paths).
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  virtual ~RegexSplitter() = default;
  // Calls on_match(begin, end) for each non-overlapping match, left to right (onig's find_iter).
  // Byte offsets into s. Thread-safe.
  virtual void for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const = 0;
  // True for the hand-written matchers.
  virtual bool is_fast() const = 0;
};

// allow_fast=false forces ICU even for the well-known patterns (tests compare the two).
Result<std::unique_ptr<RegexSplitter>> make_regex_splitter(const std::string& pattern, bool allow_fast = true);
// A literal (the "String" form of a Split pattern).
std::unique_ptr<RegexSplitter> make_literal_splitter(const std::string& literal);

// Rewrites onig's \s / \S (White_Space, which includes \v and U+0085) for ICU, whose \s lacks them.
std::string onig_to_icu_pattern(std::string_view pattern);

}  // namespace kestrel::tokenizer
