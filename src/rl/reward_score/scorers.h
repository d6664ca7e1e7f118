// Ports of verl's rule scorers (verl/utils/reward_score/*.py) and of its
// default_compute_score dispatch by data_source. Each function computes what
// its Python original returns, character for character: Python strings are
// code points, so the 300-character clips and the regexes work on decoded
// text (rl/reward_score/pytext.h). tests/rl/reward_score_golden_test.cpp checks
// every case of tests/golden/verl_reward_scores.jsonl (written by
// scripts/oracles/verl_reward_scores.py from verl's own modules).
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::rl::reward_score {

// gsm8k.py. extract_solution: the last 300 characters; strict takes the last
// "#### <number>" with ',' and '$' removed, flexible the last number-like run
// that is not "." (commas kept). compute_score: 0 without an answer, `score`
// on an exact string match, else format_score.
std::optional<std::string> gsm8k_extract(const std::string& text, bool strict = true);
double gsm8k_compute_score(const std::string& text, const std::string& ground_truth, bool strict = true,
                           double format_score = 0.0, double score = 1.0);

// math_reward.py (lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
// HuggingFaceH4/MATH-500): the last \boxed{...} (or "\boxed ...") of the whole
// response, compared with the ground truth after Hendrycks' strip_string.
std::optional<std::string> math_last_boxed_only_string(const std::string& text);
// strip_string; std::nullopt where Python raises (then is_equiv compares the raw strings).
std::optional<std::string> math_strip_string(const std::string& s);
bool math_is_equiv(const std::string& a, const std::string& b);
double math_compute_score(const std::string& text, const std::string& ground_truth);

// math_dapo.py (math_dapo, math, math_dapo_reasoning, aime*): Minerva
// "Answer: ..." on the last 300 characters, normalize_final_answer on both
// sides; score 1 or -1, acc, pred (the normalised prediction).
std::string math_dapo_normalize_final_answer(const std::string& s);
struct DapoResult {
  double score;
  bool acc;
  std::string pred;
};
DapoResult math_dapo_compute_score(const std::string& text, const std::string& ground_truth);

// search_r1_like_qa_em.py (searchR1_*): exact match of the last
// <answer>...</answer> against ground_truth["target"] (a list or a string)
// after SQuAD normalisation; score/4 when there are more than 10 opening or
// closing tags. ground_truth is Kestrel's string: a JSON object with
// "target" (as verl's preprocess writes it), or a plain string answer.
std::string search_r1_normalize_answer(const std::string& s);
double search_r1_compute_score(const std::string& text, const std::string& ground_truth, double format_score = 0.0,
                               double score = 1.0);

// default_compute_score's result: the score, and for a dict result its other
// keys (verl's reward_extra_info; "score" first, as the dict has it).
struct RuleResult {
  double score = 0;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // empty for a float result
  bool is_dict = false;
};

// Whether data_source has a rule: ok; "not supported yet: data_source=<x>
// ..." for verl's scorers that need a code sandbox or sympy; or "no reward
// function for data_source '<x>'".
Status rule_support(const std::string& data_source);
// verl's default_compute_score (plus Kestrel's built-in arith task);
// std::nullopt where rule_support fails.
std::optional<RuleResult> default_compute_score(const std::string& data_source, const std::string& text,
                                                const std::string& ground_truth);

}  // namespace kestrel::rl::reward_score
