// verl's rule scorers, case by case against tests/golden/verl_reward_scores.jsonl:
// the scores verl's own modules (verl/utils/reward_score/*.py, commit in the
// file's first line) give for a corpus of tricky responses plus 600 seeded
// random ones built from the scorers' syntax (fuzz_corpus). Regenerate with
//   python3 scripts/oracles/verl_reward_scores.py --verl-git-dir <verl clone>/.git
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "rl/reward_score/scorers.h"

using namespace kestrel::rl::reward_score;
using json = nlohmann::ordered_json;

namespace {

std::string gt_string(const json& gt) { return gt.is_string() ? gt.get<std::string>() : gt.dump(); }

}  // namespace

TEST(VerlRewardScoreGolden, EveryCaseMatchesVerl) {
  std::ifstream in(std::string(KESTREL_SOURCE_DIR) + "/tests/golden/verl_reward_scores.jsonl");
  ASSERT_TRUE(in) << "missing tests/golden/verl_reward_scores.jsonl";
  std::string line;
  int cases = 0, failures = 0;
  std::string commit;
  while (std::getline(in, line)) {
    const json c = json::parse(line);
    if (c.contains("meta")) {
      commit = c["meta"]["verl_commit"].get<std::string>();
      continue;
    }
    ++cases;
    const std::string fn = c["fn"], ds = c["data_source"], s = c["solution_str"];
    const std::string gt = gt_string(c["ground_truth"]);
    const json& kw = c["kwargs"];
    const json& want = c["expected"];
    std::string got_desc;
    bool ok = false;
    if (fn == "default_compute_score") {
      auto r = default_compute_score(ds, s, gt);
      if (!r) {
        got_desc = "no rule";
      } else if (want.is_object()) {
        ok = r->is_dict && r->extra == want;
        got_desc = r->extra.dump();
      } else {
        ok = !r->is_dict && r->score == want.get<double>();
        got_desc = std::to_string(r->score);
      }
    } else if (fn == "gsm8k.compute_score") {
      const double got = gsm8k_compute_score(s, gt, kw.value("method", "strict") == "strict",
                                             kw.value("format_score", 0.0), kw.value("score", 1.0));
      ok = got == want.get<double>();
      got_desc = std::to_string(got);
    } else if (fn == "search_r1_like_qa_em.compute_score") {
      const double got = search_r1_compute_score(s, gt, kw.value("format_score", 0.0), kw.value("score", 1.0));
      ok = got == want.get<double>();
      got_desc = std::to_string(got);
    } else {
      FAIL() << "unknown fn " << fn;
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << ds << " " << fn << " " << kw.dump() << "\n  solution_str: " << json(s).dump()
                    << "\n  ground_truth: " << gt << "\n  verl: " << want.dump() << "\n  kestrel: " << got_desc;
    }
  }
  EXPECT_GT(cases, 800);
  EXPECT_EQ(commit.size(), 40u) << "the golden file names the verl commit it was made from";
  EXPECT_EQ(failures, 0) << failures << " of " << cases << " cases differ from verl " << commit;
}

TEST(VerlRewardScore, RuleSupportRefusesSandboxAndSympyScorers) {
  EXPECT_TRUE(rule_support("openai/gsm8k").is_ok());
  EXPECT_TRUE(rule_support("aime2025").is_ok());
  EXPECT_TRUE(rule_support("searchR1_bamboogle").is_ok());
  for (const char* ds : {"codecontests", "apps", "codeforces", "taco"}) {
    const auto st = rule_support(ds);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(std::string("not supported yet: data_source=") + ds + " needs a code sandbox"),
              std::string::npos)
        << st.message();
  }
  for (const char* ds : {"numina_cn_k12", "hiyouga/geometry3k"}) {
    const auto st = rule_support(ds);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find(std::string("not supported yet: data_source=") + ds), std::string::npos);
    EXPECT_NE(st.message().find("sympy"), std::string::npos);
  }
  const auto none = rule_support("my/dataset");
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.message().find("no reward function for data_source 'my/dataset'"), std::string::npos);
}
