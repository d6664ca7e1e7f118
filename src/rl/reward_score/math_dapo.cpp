// verl/utils/reward_score/math_dapo.py (Minerva answer normalisation). The
// re.sub calls are hand-written matchers with Python's semantics: '.' does not
// match '\n', lazy groups stop at the first closing character, scanning
// resumes after each replacement.
#include <vector>

#include "rl/reward_score/pytext.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl::reward_score {

namespace {

using pytext::U32;

const std::vector<std::pair<U32, U32>>& substitutions() {
  static const std::vector<std::pair<U32, U32>> k = {
      {U"an ", U""}, {U"a ", U""}, {U".$", U"$"}, {U"\\$", U""}, {U"\\ ", U""}, {U" ", U""}, {U"mbox", U"text"},
      {U",\\text{and}", U","}, {U"\\text{and}", U","}, {U"\\text{m}", U"\\text{}"}};
  return k;
}

const std::vector<U32>& removed_expressions() {
  static const std::vector<U32> k = {
      U"square", U"ways", U"integers", U"dollars", U"mph", U"inches", U"hours", U"km", U"units", U"\\ldots", U"sue",
      U"points", U"feet", U"minutes", U"digits", U"cents", U"degrees", U"cm", U"gm", U"pounds", U"meters", U"meals",
      U"edges", U"students", U"childrentickets", U"multiples", U"\\text{s}", U"\\text{.}", U"\\text{\ns}",
      U"\\text{}^2", U"\\text{}^3", U"\\text{\n}", U"\\text{}", U"\\mathrm{th}", U"^\\circ", U"^{\\circ}", U"\\;",
      U",\\!", U"{,}", U"\"", U"\\dots"};
  return k;
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s): a line (no '\n' is crossed)
// holding two '$' becomes "$" + the text between its first two '$' + "$".
U32 sub_dollar_pairs(const U32& s) {
  U32 out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t nl = s.find(U'\n', start);
    const size_t end = nl == U32::npos ? s.size() : nl;
    const U32 line = s.substr(start, end - start);
    const size_t d1 = line.find(U'$');
    const size_t d2 = d1 == U32::npos ? U32::npos : line.find(U'$', d1 + 1);
    if (d2 != U32::npos) out += U"$" + line.substr(d1 + 1, d2 - d1 - 1) + U"$";
    else out += line;
    if (nl == U32::npos) break;
    out += U'\n';
    start = nl + 1;
  }
  return out;
}

// re.sub(r"(<prefix>)(.*?)(\})", "\\2", s)
U32 sub_lazy_group(const U32& s, const U32& prefix) {
  U32 out;
  for (size_t i = 0; i < s.size();) {
    if (pytext::starts_at(s, i, prefix)) {
      size_t j = i + prefix.size();
      while (j < s.size() && s[j] != '}' && s[j] != '\n') ++j;
      if (j < s.size() && s[j] == '}') {
        out += s.substr(i + prefix.size(), j - i - prefix.size());
        i = j + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s): greedy, to the line's last '}'.
U32 sub_boxed_greedy(const U32& s) {
  static const U32 kPrefix = U"\\boxed{";
  U32 out;
  for (size_t i = 0; i < s.size();) {
    if (pytext::starts_at(s, i, kPrefix)) {
      const size_t from = i + kPrefix.size();
      size_t eol = s.find(U'\n', from);
      if (eol == U32::npos) eol = s.size();
      size_t close = U32::npos;
      for (size_t j = from; j < eol; ++j)
        if (s[j] == '}') close = j;
      if (close != U32::npos) {
        out += s.substr(from, close - from);
        i = close + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}") and re.sub(r"(sqrt)([^{])", "sqrt{\\2}").
U32 sub_frac_sqrt(const U32& s, bool frac) {
  const U32 word = frac ? U"frac" : U"sqrt";
  U32 out;
  for (size_t i = 0; i < s.size();) {
    if (pytext::starts_at(s, i, word) && i + 4 < s.size() && s[i + 4] != '{') {
      if (!frac) {
        out += U"sqrt{" + U32(1, s[i + 4]) + U"}";
        i += 5;
        continue;
      }
      if (i + 5 < s.size() && s[i + 5] != '\n') {
        out += U"frac{" + U32(1, s[i + 4]) + U"}{" + U32(1, s[i + 5]) + U"}";
        i += 6;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

U32 normalize_final_answer(const U32& in) {
  U32 s = pytext::split(in, U"=").back();
  for (const auto& [before, after] : substitutions()) s = pytext::replace(s, before, after);
  for (const U32& expr : removed_expressions()) s = pytext::replace(s, expr, U"");
  s = sub_dollar_pairs(s);
  s = sub_lazy_group(s, U"\\text{");
  s = sub_lazy_group(s, U"\\textbf{");
  s = sub_lazy_group(s, U"\\overline{");
  s = sub_boxed_greedy(s);
  s = sub_frac_sqrt(s, true);
  s = sub_frac_sqrt(s, false);
  s = pytext::replace(s, U"$", U"");
  if (pytext::is_digits(pytext::replace(s, U",", U""))) s = pytext::replace(s, U",", U"");
  return pytext::strip(s);
}

bool same_letter_ci(char32_t c, char32_t lower_lit) {
  if (c == lower_lit || c == lower_lit - 32) return true;
  return lower_lit == 's' && c == 0x017F;  // (?i): LATIN SMALL LETTER LONG S folds to 's'
}

// The last group of re.findall(r"(?i)Answer\s*:\s*([^\n]+)", s), or std::nullopt.
std::optional<U32> last_answer(const U32& s) {
  static const U32 kWord = U"answer";
  std::optional<U32> last;
  const size_t n = s.size();
  for (size_t i = 0; i + kWord.size() <= n;) {
    bool word = true;
    for (size_t k = 0; k < kWord.size() && word; ++k) word = same_letter_ci(s[i + k], kWord[k]);
    if (!word) {
      ++i;
      continue;
    }
    size_t j = i + kWord.size();
    while (j < n && pytext::is_space(s[j])) ++j;
    if (j >= n || s[j] != ':') {
      ++i;
      continue;
    }
    ++j;
    size_t k = j;
    while (k < n && pytext::is_space(s[k])) ++k;
    size_t from;
    if (k < n) {
      from = k;  // \s* takes all the whitespace; [^\n]+ starts at the next character
    } else {
      // Whitespace to the end: \s* gives back until [^\n]+ can take one non-'\n' character.
      size_t m = n;
      while (m > j && s[m - 1] == '\n') --m;
      if (m == j) {
        ++i;
        continue;
      }
      from = m - 1;
    }
    size_t to = from;
    while (to < n && s[to] != '\n') ++to;
    last = s.substr(from, to - from);
    i = to;
  }
  return last;
}

}  // namespace

std::string math_dapo_normalize_final_answer(const std::string& s) {
  return pytext::encode(normalize_final_answer(pytext::decode(s)));
}

DapoResult math_dapo_compute_score(const std::string& text, const std::string& ground_truth) {
  const U32 s = pytext::tail(pytext::decode(text), 300);
  const std::optional<U32> extracted = last_answer(s);
  const U32 pred = normalize_final_answer(extracted ? *extracted : U32(U"[INVALID]"));
  const U32 gt = normalize_final_answer(pytext::decode(ground_truth));
  const bool correct = pred == gt;
  return {correct ? 1.0 : -1.0, correct, pytext::encode(pred)};
}

}  // namespace kestrel::rl::reward_score
