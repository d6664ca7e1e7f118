// verl/utils/reward_score/math_reward.py (Hendrycks MATH normalisation).
// Python's exceptions are followed exactly: an assert or IndexError inside
// strip_string makes is_equiv compare the raw strings; one in remove_boxed
// makes compute_score return 0.
#include <vector>

#include "rl/reward_score/pytext.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl::reward_score {

namespace {

using pytext::U32;

std::optional<U32> last_boxed_only_string(const U32& s) {
  const size_t boxed = pytext::rfind(s, U"\\boxed");
  if (pytext::contains(s, U"\\boxed ")) {
    const U32 after = pytext::split(s, U"\\boxed ").back();
    return U"\\boxed " + pytext::split(after, U"$").front();
  }
  size_t idx = boxed;
  if (idx == U32::npos) {
    idx = pytext::rfind(s, U"\\fbox");
    if (idx == U32::npos) return std::nullopt;
  }
  int open = 0;
  for (size_t i = idx; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}') {
      --open;
      if (open == 0) return s.substr(idx, i + 1 - idx);
    }
  }
  return std::nullopt;
}

// remove_boxed; std::nullopt where its asserts fail.
std::optional<U32> remove_boxed(const U32& s) {
  if (pytext::contains(s, U"\\boxed ")) {
    if (!pytext::starts_at(s, 0, U"\\boxed ")) return std::nullopt;
    return s.substr(7);
  }
  if (!pytext::starts_at(s, 0, U"\\boxed{") || s.back() != '}') return std::nullopt;
  return s.substr(7, s.size() - 8);
}

// fix_fracs; std::nullopt for the IndexError of an empty piece after "\frac".
std::optional<U32> fix_fracs(const U32& string) {
  const std::vector<U32> substrs = pytext::split(string, U"\\frac");
  U32 out = substrs[0];
  for (size_t i = 1; i < substrs.size(); ++i) {
    const U32& sub = substrs[i];
    out += U"\\frac";
    if (sub.empty()) return std::nullopt;  // substr[0]
    if (sub[0] == '{') {
      out += sub;
      continue;
    }
    if (sub.size() < 2) return string;
    const char32_t a = sub[0], b = sub[1];
    if (b != '{') out += U"{" + U32(1, a) + U"}{" + U32(1, b) + U"}" + sub.substr(2);
    else out += U"{" + U32(1, a) + U"}" + U32(1, b) + sub.substr(2);
  }
  return out;
}

// int(x) followed by the check that str(int(x)) == x: an ASCII integer in
// canonical form ("-0", "01", "+1", "1_0", " 1" and non-ASCII digits fail).
bool canonical_int(const U32& x) {
  size_t i = x.size() > 0 && x[0] == '-' ? 1 : 0;
  if (i >= x.size()) return false;
  for (size_t k = i; k < x.size(); ++k)
    if (x[k] < '0' || x[k] > '9') return false;
  if (x[i] == '0' && (x.size() - i > 1 || i == 1)) return false;
  return true;
}

U32 fix_a_slash_b(const U32& s) {
  const std::vector<U32> parts = pytext::split(s, U"/");
  if (parts.size() != 2) return s;
  if (!canonical_int(parts[0]) || !canonical_int(parts[1])) return s;
  return U"\\frac{" + parts[0] + U"}{" + parts[1] + U"}";
}

// fix_sqrt; std::nullopt for the IndexError of an empty piece after "\sqrt".
std::optional<U32> fix_sqrt(const U32& s) {
  if (!pytext::contains(s, U"\\sqrt")) return s;
  const std::vector<U32> splits = pytext::split(s, U"\\sqrt");
  U32 out = splits[0];
  for (size_t i = 1; i < splits.size(); ++i) {
    const U32& sp = splits[i];
    if (sp.empty()) return std::nullopt;
    if (sp[0] != '{') out += U"\\sqrt{" + U32(1, sp[0]) + U"}" + sp.substr(1);
    else out += U"\\sqrt" + sp;
  }
  return out;
}

std::optional<U32> strip_string(U32 s) {
  using pytext::replace;
  s = replace(s, U"\n", U"");
  s = replace(s, U"\\!", U"");
  s = replace(s, U"\\\\", U"\\");
  s = replace(s, U"tfrac", U"frac");
  s = replace(s, U"dfrac", U"frac");
  s = replace(s, U"\\left", U"");
  s = replace(s, U"\\right", U"");
  s = replace(s, U"^{\\circ}", U"");
  s = replace(s, U"^\\circ", U"");
  s = replace(s, U"\\$", U"");
  if (pytext::contains(s, U"\\text{ ")) {  // remove_right_units
    const std::vector<U32> splits = pytext::split(s, U"\\text{ ");
    if (splits.size() != 2) return std::nullopt;  // assert len(splits) == 2
    s = splits[0];
  }
  s = replace(s, U"\\\\%", U"");
  s = replace(s, U"\\%", U"");
  s = replace(s, U" .", U" 0.");
  s = replace(s, U"{.", U"{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = U"0" + s;
  if (const std::vector<U32> eq = pytext::split(s, U"="); eq.size() == 2 && eq[0].size() <= 2) s = eq[1];
  auto sq = fix_sqrt(s);
  if (!sq) return std::nullopt;
  s = replace(*sq, U" ", U"");
  auto fr = fix_fracs(s);
  if (!fr) return std::nullopt;
  s = *fr;
  if (s == U"0.5") s = U"\\frac{1}{2}";
  return fix_a_slash_b(s);
}

}  // namespace

std::optional<std::string> math_last_boxed_only_string(const std::string& text) {
  auto b = last_boxed_only_string(pytext::decode(text));
  if (!b) return std::nullopt;
  return pytext::encode(*b);
}

std::optional<std::string> math_strip_string(const std::string& s) {
  auto r = strip_string(pytext::decode(s));
  if (!r) return std::nullopt;
  return pytext::encode(*r);
}

bool math_is_equiv(const std::string& a, const std::string& b) {
  const auto sa = strip_string(pytext::decode(a));
  const auto sb = sa ? strip_string(pytext::decode(b)) : std::nullopt;
  if (!sa || !sb) return a == b;
  return *sa == *sb;
}

double math_compute_score(const std::string& text, const std::string& ground_truth) {
  const auto boxed = last_boxed_only_string(pytext::decode(text));
  if (!boxed) return 0.0;
  const auto answer = remove_boxed(*boxed);
  if (!answer) return 0.0;
  return math_is_equiv(pytext::encode(*answer), ground_truth) ? 1.0 : 0.0;
}

}  // namespace kestrel::rl::reward_score
