// verl/utils/reward_score/__init__.py:default_compute_score, by data_source.
#include <algorithm>
#include <array>
#include <string_view>

#include "rl/reward_rules.h"
#include "rl/reward_score/scorers.h"

namespace kestrel::rl::reward_score {

namespace {

bool one_of(const std::string& s, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

enum class Family { None, Gsm8k, Math, MathDapo, SearchR1, Arith, Sandbox, PrimeMath, Geo3k };

Family family_of(const std::string& ds) {
  if (ds == "openai/gsm8k" || ds == "gsm8k") return Family::Gsm8k;  // "gsm8k": Kestrel's alias
  if (one_of(ds, {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"}))
    return Family::Math;
  if (one_of(ds, {"math_dapo", "math", "math_dapo_reasoning"}) || ds.rfind("aime", 0) == 0) return Family::MathDapo;
  if (one_of(ds, {"numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                  "numina_cn_k12", "numina_olympiads"}))
    return Family::PrimeMath;
  if (one_of(ds, {"codecontests", "apps", "codeforces", "taco"})) return Family::Sandbox;
  if (ds == "hiyouga/geometry3k") return Family::Geo3k;
  if (one_of(ds, {"searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                  "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"}))
    return Family::SearchR1;
  if (ds == "arith" || ds == "kestrel/arith") return Family::Arith;
  return Family::None;
}

}  // namespace

Status rule_support(const std::string& ds) {
  switch (family_of(ds)) {
    case Family::None:
      return KS_ERR("no reward function for data_source '", ds,
                    "' (set custom_reward_function.path or reward_model.reward_command)");
    case Family::Sandbox:
      return KS_ERR("not supported yet: data_source=", ds,
                    " needs a code sandbox (verl runs it with sandbox_fusion or prime_code); score it with "
                    "custom_reward_function.path or reward_model.reward_command");
    case Family::PrimeMath:
      return KS_ERR("not supported yet: data_source=", ds,
                    " (verl scores it with prime_math, whose grader needs sympy and pylatexenc); score it with "
                    "custom_reward_function.path or reward_model.reward_command");
    case Family::Geo3k:
      return KS_ERR("not supported yet: data_source=", ds,
                    " (verl scores it with mathruler's grade_answer, which needs sympy); score it with "
                    "custom_reward_function.path or reward_model.reward_command");
    default:
      return Status::ok();
  }
}

std::optional<RuleResult> default_compute_score(const std::string& ds, const std::string& text,
                                                const std::string& gt) {
  RuleResult r;
  switch (family_of(ds)) {
    case Family::Gsm8k:
      r.score = gsm8k_compute_score(text, gt);
      return r;
    case Family::Math:
      r.score = math_compute_score(text, gt);
      return r;
    case Family::MathDapo: {
      const DapoResult d = math_dapo_compute_score(text, gt);
      r.score = d.score;
      r.is_dict = true;
      r.extra["score"] = d.score;
      r.extra["acc"] = d.acc;
      r.extra["pred"] = d.pred;
      return r;
    }
    case Family::SearchR1:
      r.score = search_r1_compute_score(text, gt);
      return r;
    case Family::Arith:
      r.score = arith_score(text, gt);
      return r;
    default:
      return std::nullopt;
  }
}

}  // namespace kestrel::rl::reward_score
