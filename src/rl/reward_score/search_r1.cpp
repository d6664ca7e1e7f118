// verl/utils/reward_score/search_r1_like_qa_em.py (SQuAD-style exact match).
#include <vector>

#include "rl/reward_score/pytext.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl::reward_score {

namespace {

using pytext::U32;

bool ascii_punct(char32_t c) {  // string.punctuation
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}

// re.sub(r"\b(a|an|the)\b", " ", text)
U32 remove_articles(const U32& t) {
  static const U32 kArticles[] = {U"a", U"an", U"the"};  // the alternation's order
  U32 out;
  auto word_at = [&](size_t i) { return i < t.size() && pytext::is_word(t[i]); };
  for (size_t i = 0; i < t.size();) {
    const bool boundary_before = (i == 0 || !pytext::is_word(t[i - 1])) && word_at(i);
    bool hit = false;
    if (boundary_before) {
      for (const U32& a : kArticles) {
        if (pytext::starts_at(t, i, a) && !word_at(i + a.size())) {
          out += U' ';
          i += a.size();
          hit = true;
          break;
        }
      }
    }
    if (!hit) out += t[i++];
  }
  return out;
}

U32 normalize(const U32& s) {
  U32 t = pytext::lower(s), np;
  for (char32_t c : t)
    if (!ascii_punct(c)) np += c;
  const std::vector<U32> words = pytext::split_ws(remove_articles(np));
  U32 out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? U" " : U"") + words[i];
  return out;
}

// The last <answer>(.*?)</answer> (DOTALL), stripped; std::nullopt when none.
std::optional<U32> extract_solution(const U32& s) {
  static const U32 kOpen = U"<answer>", kClose = U"</answer>";
  std::optional<U32> last;
  for (size_t i = 0; i < s.size();) {
    if (pytext::starts_at(s, i, kOpen)) {
      const size_t close = s.find(kClose, i + kOpen.size());
      if (close != U32::npos) {
        last = pytext::strip(s.substr(i + kOpen.size(), close - i - kOpen.size()));
        i = close + kClose.size();
        continue;
      }
    }
    ++i;
  }
  return last;
}

// ground_truth["target"] as a list of strings.
std::vector<std::string> targets_of(const std::string& ground_truth) {
  nlohmann::json j = nlohmann::json::parse(ground_truth, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("target")) return {ground_truth};
  const nlohmann::json& t = j["target"];
  std::vector<std::string> out;
  if (t.is_string()) out.push_back(t.get<std::string>());
  else if (t.is_array())
    for (const auto& x : t) out.push_back(x.is_string() ? x.get<std::string>() : x.dump());
  else out.push_back(t.dump());
  return out;
}

}  // namespace

std::string search_r1_normalize_answer(const std::string& s) { return pytext::encode(normalize(pytext::decode(s))); }

double search_r1_compute_score(const std::string& text, const std::string& ground_truth, double format_score,
                               double score) {
  const U32 s = pytext::decode(text);
  const std::optional<U32> answer = extract_solution(s);
  if (!answer) return 0.0;
  const U32 pred = normalize(*answer);
  bool match = false;
  for (const std::string& g : targets_of(ground_truth)) match = match || normalize(pytext::decode(g)) == pred;
  if (!match) return format_score;
  // More than 10 opening or closing tags: a quarter (against spamming </answer>).
  if (pytext::count(s, U"<answer>") > 10 || pytext::count(s, U"</answer>") > 10) return score / 4;
  return score;
}

}  // namespace kestrel::rl::reward_score
