// verl/utils/reward_score/gsm8k.py.
#include <vector>

#include "rl/reward_score/pytext.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl::reward_score {

namespace {

using pytext::U32;

bool in_number_set(char32_t c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; }

// re.findall(r"(\-?[0-9\.\,]+)", s) from position `from`, or (strict) of
// "#### (\-?[0-9\.\,]+)": the groups, non-overlapping, left to right.
std::vector<U32> find_numbers(const U32& s, bool strict) {
  static const U32 kMarker = U"#### ";
  std::vector<U32> out;
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    size_t j = i;
    if (strict) {
      if (!pytext::starts_at(s, i, kMarker)) {
        ++i;
        continue;
      }
      j = i + kMarker.size();
    }
    // \-? then [0-9.,]+: the '-' is taken only when a number character follows it.
    size_t k = j;
    if (k < n && s[k] == '-' && k + 1 < n && in_number_set(s[k + 1])) ++k;
    if (k >= n || !in_number_set(s[k])) {
      ++i;
      continue;
    }
    while (k < n && in_number_set(s[k])) ++k;
    out.push_back(s.substr(j, k - j));
    i = k;
  }
  return out;
}

}  // namespace

std::optional<std::string> gsm8k_extract(const std::string& text, bool strict) {
  const U32 s = pytext::tail(pytext::decode(text), 300);  // _SOLUTION_CLIP_CHARS
  const std::vector<U32> found = find_numbers(s, strict);
  if (found.empty()) return std::nullopt;
  if (strict) return pytext::encode(pytext::replace(pytext::replace(found.back(), U",", U""), U"$", U""));
  // for final_answer in reversed(answer): if final_answer not in ["", "."]: break
  // -- when every match is ".", the loop variable ends on the first one.
  for (size_t i = found.size(); i-- > 0;)
    if (found[i] != U".") return pytext::encode(found[i]);
  return pytext::encode(found.front());
}

double gsm8k_compute_score(const std::string& text, const std::string& ground_truth, bool strict, double format_score,
                           double score) {
  const auto a = gsm8k_extract(text, strict);
  if (!a) return 0.0;
  return *a == ground_truth ? score : format_score;
}

}  // namespace kestrel::rl::reward_score
