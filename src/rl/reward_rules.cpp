#include "rl/reward_rules.h"

#include "rl/reward_score/scorers.h"

#include <cctype>
#include <regex>
#include <vector>

namespace kestrel::rl {


std::optional<std::string> gsm8k_extract(const std::string& text, bool strict) {
  return reward_score::gsm8k_extract(text, strict);
}

double gsm8k_score(const std::string& text, const std::string& truth, bool strict, double format_score,
                   double score) {
  return reward_score::gsm8k_compute_score(text, truth, strict, format_score, score);
}

std::optional<std::string> last_boxed_content(const std::string& s) {
  auto b = reward_score::math_last_boxed_only_string(s);
  if (!b) return std::nullopt;
  // remove_boxed: "\boxed X" -> X, "\boxed{X}" -> X (an \fbox has no content here, as in verl).
  if (b->rfind("\\boxed ", 0) == 0) return b->substr(7);
  if (b->rfind("\\boxed{", 0) == 0 && !b->empty() && b->back() == '}') return b->substr(7, b->size() - 8);
  return std::nullopt;
}

std::string math_strip_string(std::string s) {
  auto r = reward_score::math_strip_string(s);
  return r ? *r : s;
}

double math_score(const std::string& text, const std::string& truth) {
  return reward_score::math_compute_score(text, truth);
}

namespace {

// The integer after the last "####" (an optional '-' then digits).
std::optional<std::string> arith_extract(const std::string& text) {
  auto p = text.rfind("####");
  if (p == std::string::npos) return std::nullopt;
  size_t i = p + 4;
  while (i < text.size() && text[i] == ' ') ++i;
  size_t j = i;
  if (j < text.size() && text[j] == '-') ++j;
  size_t digits_start = j;
  while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
  if (j == digits_start) return std::nullopt;
  return text.substr(i, j - i);
}

}  // namespace

double arith_score(const std::string& text, const std::string& truth) {
  const auto a = arith_extract(text);
  return a && *a == truth ? 1.0 : 0.0;
}

double arith_step_credit_score(const std::string& text, const std::string& truth, double credit) {
  if (arith_score(text, truth) == 1.0) return 1.0;
  static const std::regex eq(R"((\d+) *([-+*]) *(\d+) *= *(-?\d+))");
  int64_t total = 0, right = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), eq); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    if (m[1].length() > 9 || m[3].length() > 9 || m[4].length() > 18) continue;  // not this task's numbers
    const int64_t a = std::stoll(m[1].str()), b = std::stoll(m[3].str()), c = std::stoll(m[4].str());
    const char op = m[2].str()[0];
    const int64_t want = op == '+' ? a + b : op == '-' ? a - b : a * b;
    ++total;
    right += want == c ? 1 : 0;
  }
  return total == 0 ? 0.0 : credit * double(right) / double(total);
}

std::optional<double> rule_score(const std::string& src, const std::string& text, const std::string& truth) {
  auto r = reward_score::default_compute_score(src, text, truth);
  if (!r) return std::nullopt;
  return r->score;
}

std::optional<std::string> rule_prediction(const std::string& src, const std::string& text) {
  if (src == "openai/gsm8k" || src == "gsm8k") return gsm8k_extract(text);
  if (src == "arith" || src == "kestrel/arith") return arith_extract(text);
  if (src == "lighteval/MATH" || src == "DigitalLearningGmbH/MATH-lighteval" || src == "HuggingFaceH4/MATH-500") {
    auto b = last_boxed_content(text);
    if (b) return math_strip_string(*b);
  }
  return std::nullopt;
}

}  // namespace kestrel::rl
