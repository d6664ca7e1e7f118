#include "tokenizer/regex_split.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

enum class Family { Gpt2, Qwen2, Llama3 };

// Hand-written equivalents of the three patterns. Every character is a letter, number, white space or
// "other", and each pattern has an alternative starting with each class, so the matches tile the
// input: match_at(i) returns the end of the match that starts at i. The alternatives are tried in
// pattern order with the backtracking a leftmost-first regex engine would do.
template <Family F>
class FastSplitter final : public RegexSplitter {
 public:
  void for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const override {
    size_t i = 0;
    while (i < s.size()) {
      const size_t e = match_at(s, i);
      on_match(i, e);
      i = e;
    }
  }
  bool is_fast() const override { return true; }

 private:
  struct Ch {
    char32_t cp;
    size_t len;
    CharClass cls;
  };
  static Ch at(std::string_view s, size_t i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) return {b, 1, ascii_class(b)};
    size_t len;
    const char32_t cp = decode_utf8(s, i, len);
    return {cp, len, char_class(cp)};
  }
  static CharClass ascii_class(unsigned char b) {
    static const auto table = [] {
      std::array<CharClass, 128> t{};
      for (int c = 0; c < 128; ++c) t[c] = char_class(static_cast<char32_t>(c));
      return t;
    }();
    return table[b];
  }
  // End of the run of characters of class cls starting at i (max_count characters at most).
  static size_t run(std::string_view s, size_t i, CharClass cls, size_t max_count = SIZE_MAX) {
    size_t count = 0;
    while (i < s.size() && count < max_count) {
      const Ch c = at(s, i);
      if (c.cls != cls) break;
      i += c.len;
      ++count;
    }
    return i;
  }
  static bool is_ci(char32_t cp, char lower) { return cp == static_cast<char32_t>(lower) || cp == static_cast<char32_t>(lower - 32); }

  // 's 't 're 've 'm 'll 'd after the apostrophe at i; case-insensitive for Qwen2/Llama-3, where onig's
  // case folding also lets U+017F (long s) match s.
  static size_t contraction(std::string_view s, size_t i) {
    const size_t j = i + 1;
    if (j >= s.size()) return 0;
    if constexpr (F == Family::Gpt2) {
      const char c1 = s[j];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return j + 1;
      if (j + 1 < s.size()) {
        const char c2 = s[j + 1];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return j + 2;
      }
      return 0;
    } else {
      const Ch c1 = at(s, j);
      if (is_ci(c1.cp, 's') || c1.cp == 0x17F || is_ci(c1.cp, 't') || is_ci(c1.cp, 'm') || is_ci(c1.cp, 'd'))
        return j + c1.len;
      if (j + 1 < s.size()) {
        const auto c2 = static_cast<char32_t>(static_cast<unsigned char>(s[j + 1]));
        if ((is_ci(c1.cp, 'r') && is_ci(c2, 'e')) || (is_ci(c1.cp, 'v') && is_ci(c2, 'e')) ||
            (is_ci(c1.cp, 'l') && is_ci(c2, 'l')))
          return j + 2;
      }
      return 0;
    }
  }

  // \s+(?!\S)|\s+ at a white-space character i: the whole run at the end of input, else the run
  // minus its last character (which then leads the next piece), else the single character.
  static size_t space_run(std::string_view s, size_t i) {
    size_t k = i, last = i, count = 0;
    while (k < s.size()) {
      const Ch c = at(s, k);
      if (c.cls != kSpace) break;
      last = k;
      k += c.len;
      ++count;
    }
    if (k == s.size() || count == 1) return k;
    return last;
  }

  static size_t match_at(std::string_view s, size_t i) {
    const Ch c0 = at(s, i);
    if (c0.cp == '\'') {
      if (const size_t e = contraction(s, i)) return e;
    }
    if constexpr (F == Family::Gpt2) {
      // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: the optional space binds to a following non-space run.
      size_t j = i;
      CharClass cls = c0.cls;
      if (c0.cp == ' ' && i + 1 < s.size()) {
        j = i + 1;
        cls = at(s, j).cls;
      }
      if (cls != kSpace) return run(s, j, cls);
      return space_run(s, i);
    } else {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (c0.cls == kLetter) return run(s, i, kLetter);
      const bool is_crlf = c0.cp == '\r' || c0.cp == '\n';
      if (c0.cls != kNumber && !is_crlf && i + c0.len < s.size() && at(s, i + c0.len).cls == kLetter)
        return run(s, i + c0.len, kLetter);
      // \p{N} (Qwen2) or \p{N}{1,3} (Llama-3)
      if (c0.cls == kNumber) return F == Family::Qwen2 ? i + c0.len : run(s, i, kNumber, 3);
      // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
      size_t j = i;
      if (c0.cp == ' ' && i + 1 < s.size() && at(s, i + 1).cls == kOther) j = i + 1;
      if (j > i || c0.cls == kOther) {
        size_t e = run(s, j, kOther);
        while (e < s.size() && (s[e] == '\r' || s[e] == '\n')) ++e;
        return e;
      }
      // c0 is white space. \s*[\r\n]+: greedy \s* backs off to the last \r or \n of the run.
      size_t k = i, last_crlf = SIZE_MAX;
      while (k < s.size()) {
        const Ch c = at(s, k);
        if (c.cls != kSpace) break;
        if (c.cp == '\r' || c.cp == '\n') last_crlf = k;
        k += c.len;
      }
      if (last_crlf != SIZE_MAX) return last_crlf + 1;
      return space_run(s, i);
    }
  }
};

class IcuSplitter final : public RegexSplitter {
 public:
  explicit IcuSplitter(std::unique_ptr<icu::RegexPattern> p) : pattern_(std::move(p)) {}
  void for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const override {
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, s.data(), static_cast<int64_t>(s.size()), &st);
    // RegexPattern is immutable and may be shared across threads; each call gets its own matcher.
    std::unique_ptr<icu::RegexMatcher> m(pattern_->matcher(st));
    if (U_FAILURE(st)) {
      utext_close(ut);
      KS_FAIL("tokenizer: ICU could not create a regex matcher: ", u_errorName(st));
    }
    m->reset(ut);
    while (m->find(st) && U_SUCCESS(st)) {
      // With a UTF-8 UText, ICU's native indices are byte offsets.
      on_match(static_cast<size_t>(m->start64(st)), static_cast<size_t>(m->end64(st)));
    }
    m.reset();
    utext_close(ut);
  }
  bool is_fast() const override { return false; }

 private:
  std::unique_ptr<icu::RegexPattern> pattern_;
};

class LiteralSplitter final : public RegexSplitter {
 public:
  explicit LiteralSplitter(std::string lit) : lit_(std::move(lit)) {}
  void for_each_match(std::string_view s, FunctionRef<void(size_t, size_t)> on_match) const override {
    if (lit_.empty()) return;
    size_t pos = 0;
    while ((pos = s.find(lit_, pos)) != std::string_view::npos) {
      on_match(pos, pos + lit_.size());
      pos += lit_.size();
    }
  }
  bool is_fast() const override { return true; }

 private:
  std::string lit_;
};

}  // namespace

std::string onig_to_icu_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 >= p.size()) {
      out.push_back(p[i]);
      continue;
    }
    const char c = p[i + 1];
    if (c == 's') out += "\\p{White_Space}";
    else if (c == 'S') out += "\\P{White_Space}";
    else { out.push_back('\\'); out.push_back(c); }
    ++i;  // an escaped backslash stays escaped, so "\\s" is not rewritten
  }
  return out;
}

Result<std::unique_ptr<RegexSplitter>> make_regex_splitter(const std::string& pattern, bool allow_fast) {
  if (allow_fast) {
    if (pattern == kGpt2Pattern) return std::unique_ptr<RegexSplitter>(new FastSplitter<Family::Gpt2>());
    if (pattern == kQwen2Pattern) return std::unique_ptr<RegexSplitter>(new FastSplitter<Family::Qwen2>());
    if (pattern == kLlama3Pattern) return std::unique_ptr<RegexSplitter>(new FastSplitter<Family::Llama3>());
  }
  const std::string icu_pat = onig_to_icu_pattern(pattern);
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe{};
  std::unique_ptr<icu::RegexPattern> p(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu_pat), 0, pe, st));
  if (U_FAILURE(st))
    return KS_ERR("not supported yet: pre-tokenizer regex `", pattern, "` (ICU cannot compile it: ",
                  u_errorName(st), " at offset ", pe.offset, ")");
  return std::unique_ptr<RegexSplitter>(new IcuSplitter(std::move(p)));
}

std::unique_ptr<RegexSplitter> make_literal_splitter(const std::string& literal) {
  return std::make_unique<LiteralSplitter>(literal);
}

}  // namespace kestrel::tokenizer
