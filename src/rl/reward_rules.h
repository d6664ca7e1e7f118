// Rule-based rewards, chosen per data_source as verl's default_compute_score
// does (the scorers themselves live in rl/reward_score/scorers.h: gsm8k,
// MATH, math_dapo, searchR1), and the built-in arith task. These are the
// float views of them the CLI and validation use.
#pragma once
#include <optional>
#include <string>

namespace kestrel::rl {

// verl gsm8k.extract_solution: looks at the last 300 characters; strict takes
// the last "#### <number>", flexible the last number; ',' and '$' removed.
std::optional<std::string> gsm8k_extract(const std::string& text, bool strict = true);
// 1.0 on an exact string match of the extracted answer, else format_score (0).
double gsm8k_score(const std::string& text, const std::string& ground_truth, bool strict = true,
                   double format_score = 0.0, double score = 1.0);

// verl math.py: the last \boxed{...} (or \boxed ...) content, compared after
// the Hendrycks MATH normalisation (strip_string).
std::optional<std::string> last_boxed_content(const std::string& text);
std::string math_strip_string(std::string s);
double math_score(const std::string& text, const std::string& ground_truth);

// Built-in arith task: the integer after the last "####" must equal the truth.
double arith_score(const std::string& text, const std::string& ground_truth);

// Built-in arith with step credit (Kestrel): 1.0 for the right final answer;
// otherwise `credit` times the fraction of the response's equations
// "a + b = c", "a - b = c", "a * b = c" whose arithmetic is right (0 when it
// has none). A wrong answer reached by right arithmetic from a misread number
// then outranks one with arithmetic errors, so GRPO stops pushing down
// correct arithmetic. Validation accuracy stays arith_score (exact match).
double arith_step_credit_score(const std::string& text, const std::string& ground_truth, double credit);

// The score of reward_score::default_compute_score (a dict result's "score");
// std::nullopt when no rule is registered for the data source.
std::optional<double> rule_score(const std::string& data_source, const std::string& text,
                                 const std::string& ground_truth);

// The answer a rule extracts from a response (the "pred" of verl's
// reward_extra_info that maj@N votes on); std::nullopt when the data source
// has no rule or no answer was found.
std::optional<std::string> rule_prediction(const std::string& data_source, const std::string& text);

}  // namespace kestrel::rl
