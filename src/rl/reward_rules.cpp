#include "rl/reward_rules.h"

#include <cctype>
#include <regex>
#include <vector>

namespace kestrel::rl {

namespace {

std::string remove_chars(std::string s, const std::string& chars) {
  std::string out;
  for (char c : s)
    if (chars.find(c) == std::string::npos) out += c;
  return out;
}

bool replace_all(std::string& s, const std::string& from, const std::string& to) {
  bool any = false;
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) {
    s.replace(p, from.size(), to);
    any = true;
  }
  return any;
}

}  // namespace

std::optional<std::string> gsm8k_extract(const std::string& text, bool strict) {
  const std::string clip = text.size() > 300 ? text.substr(text.size() - 300) : text;
  if (strict) {
    static const std::regex re("#### (\\-?[0-9\\.\\,]+)");
    std::optional<std::string> last;
    for (auto it = std::sregex_iterator(clip.begin(), clip.end(), re); it != std::sregex_iterator(); ++it)
      last = (*it)[1].str();
    if (!last) return std::nullopt;
    return remove_chars(*last, ",$");
  }
  static const std::regex re("(\\-?[0-9\\.\\,]+)");
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(clip.begin(), clip.end(), re); it != std::sregex_iterator(); ++it) {
    std::string s = (*it)[1].str();
    if (s != "" && s != ".") last = s;
  }
  if (!last) return std::nullopt;
  return remove_chars(*last, ",$");
}

double gsm8k_score(const std::string& text, const std::string& truth, bool strict, double format_score,
                   double score) {
  auto a = gsm8k_extract(text, strict);
  if (!a) return 0.0;
  return *a == truth ? score : format_score;
}

std::optional<std::string> last_boxed_content(const std::string& s) {
  size_t idx = s.rfind("\\boxed");
  if (idx == std::string::npos) {
    idx = s.rfind("\\fbox");
    if (idx == std::string::npos) return std::nullopt;
  }
  // "\boxed 5" form: content up to the next '$'.
  if (s.compare(idx, 7, "\\boxed ") == 0) {
    size_t start = idx + 7, end = s.find('$', start);
    return s.substr(start, end == std::string::npos ? std::string::npos : end - start);
  }
  size_t open = s.find('{', idx);
  if (open == std::string::npos) return std::nullopt;
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return s.substr(open + 1, i - open - 1);
  }
  return std::nullopt;
}

namespace {

std::string fix_fracs(const std::string& string) {
  // "\frac12" -> "\frac{1}{2}", "\frac1{72}" -> "\frac{1}{72}"
  std::vector<std::string> substrs;
  size_t pos = 0, next;
  while ((next = string.find("\\frac", pos)) != std::string::npos) {
    substrs.push_back(string.substr(pos, next - pos));
    pos = next + 5;
  }
  substrs.push_back(string.substr(pos));
  std::string new_str = substrs[0];
  for (size_t i = 1; i < substrs.size(); ++i) {
    const std::string& sub = substrs[i];
    new_str += "\\frac";
    if (!sub.empty() && sub[0] == '{') {
      new_str += sub;
    } else {
      if (sub.size() < 2) return string;
      const char a = sub[0], b = sub[1];
      if (b != '{') {
        new_str += std::string("{") + a + "}{" + b + "}" + sub.substr(2);
      } else {
        new_str += std::string("{") + a + "}" + b + sub.substr(2);
      }
    }
  }
  return new_str;
}

std::string fix_a_slash_b(const std::string& s) {
  auto slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return s;
  const std::string a = s.substr(0, slash), b = s.substr(slash + 1);
  auto is_int = [](const std::string& x) {
    if (x.empty()) return false;
    for (char c : x)
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
  };
  if (!is_int(a) || !is_int(b)) return s;
  return "\\frac{" + std::to_string(std::stoll(a)) + "}{" + std::to_string(std::stoll(b)) + "}";
}

std::string remove_right_units(const std::string& s) {
  auto p = s.find("\\text{ ");
  if (p != std::string::npos) return s.substr(0, p);
  return s;
}

std::string fix_sqrt(const std::string& s) {
  if (s.find("\\sqrt") == std::string::npos) return s;
  std::vector<std::string> splits;
  size_t pos = 0, next;
  while ((next = s.find("\\sqrt", pos)) != std::string::npos) {
    splits.push_back(s.substr(pos, next - pos));
    pos = next + 5;
  }
  splits.push_back(s.substr(pos));
  std::string out = splits[0];
  for (size_t i = 1; i < splits.size(); ++i) {
    const std::string& sp = splits[i];
    if (!sp.empty() && sp[0] != '{') out += "\\sqrt{" + sp.substr(0, 1) + "}" + sp.substr(1);
    else out += "\\sqrt" + sp;
  }
  return out;
}

}  // namespace

std::string math_strip_string(std::string s) {
  replace_all(s, "\n", "");
  replace_all(s, "\\!", "");
  replace_all(s, "\\\\", "\\");
  replace_all(s, "tfrac", "frac");
  replace_all(s, "dfrac", "frac");
  replace_all(s, "\\left", "");
  replace_all(s, "\\right", "");
  replace_all(s, "^{\\circ}", "");
  replace_all(s, "^\\circ", "");
  replace_all(s, "\\$", "");
  s = remove_right_units(s);
  replace_all(s, "\\%", "");
  replace_all(s, "\%", "");
  replace_all(s, " .", " 0.");
  replace_all(s, "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  // "x = 5" -> "5" when the left side is short
  if (auto eq = s.find('='); eq != std::string::npos && s.find('=', eq + 1) == std::string::npos && eq <= 2)
    s = s.substr(eq + 1);
  s = fix_sqrt(s);
  s = remove_chars(s, " ");
  s = fix_fracs(s);
  if (s == "0.5") s = "\\frac{1}{2}";
  s = fix_a_slash_b(s);
  return s;
}

double math_score(const std::string& text, const std::string& truth) {
  auto boxed = last_boxed_content(text);
  if (!boxed) return 0.0;
  return math_strip_string(*boxed) == math_strip_string(truth) ? 1.0 : 0.0;
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
  if (src == "openai/gsm8k" || src == "gsm8k") return gsm8k_score(text, truth);
  if (src == "lighteval/MATH" || src == "DigitalLearningGmbH/MATH-lighteval" || src == "math")
    return math_score(text, truth);
  if (src == "arith" || src == "kestrel/arith") return arith_score(text, truth);
  return std::nullopt;
}

std::optional<std::string> rule_prediction(const std::string& src, const std::string& text) {
  if (src == "openai/gsm8k" || src == "gsm8k") return gsm8k_extract(text);
  if (src == "arith" || src == "kestrel/arith") return arith_extract(text);
  if (src == "lighteval/MATH" || src == "DigitalLearningGmbH/MATH-lighteval" || src == "math") {
    auto b = last_boxed_content(text);
    if (b) return math_strip_string(*b);
  }
  return std::nullopt;
}

}  // namespace kestrel::rl
