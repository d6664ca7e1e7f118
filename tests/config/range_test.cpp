// Ranges and finiteness declared on the keys (KeyDecl::range): every numeric
// key of every tree either has a range or says why any value is valid, every
// literal default is inside its range, and a value outside is refused with the
// key, the value, where it came from and the valid range.
#include <cmath>
#include <set>

#include "config/internal.h"
#include "config_testing.h"

namespace kestrel::config {
namespace {

using testing::load_error;
using testing::TempYaml;

bool numeric(Type t) { return t == Type::Int || t == Type::Float || t == Type::IntList || t == Type::FloatList; }

// Numeric keys with status Supported that are unbounded without a written reason,
// reviewed: declared inside declare_transformer_overrides (another change owns
// that function; the range goes on its lines when it lands).
const std::set<std::string> kReviewedUnbounded = {
    "actor_rollout_ref.actor.megatron.override_transformer_config.make_vocab_size_divisible_by",
    "actor_rollout_ref.ref.megatron.override_transformer_config.make_vocab_size_divisible_by",
    "critic.megatron.override_transformer_config.make_vocab_size_divisible_by",
};

TEST(ConfigRanges, EveryNumericKeyHasARangeOrAReason) {
  // NotSupportedYet keys accept only their default, NoEffect keys reach no
  // code: a range would refuse nothing Kestrel could misuse.
  std::vector<std::string> missing;
  for (const Schema* s : all_schemas())
    for (const auto& d : s->keys()) {
      if (!numeric(d.type) || d.status != Support::Supported) continue;
      if (d.range || !d.unbounded.empty() || kReviewedUnbounded.count(d.path)) continue;
      missing.push_back(s->name() + ": " + d.path);
    }
  std::string all;
  for (const auto& m : missing) all += "\n  " + m;
  EXPECT_TRUE(missing.empty()) << "numeric keys with neither a range (.at_least/.in/.above) nor .any_value(why):"
                               << all;
}

TEST(ConfigRanges, LiteralDefaultsAreInRange) {
  for (const Schema* s : all_schemas())
    for (const auto& d : s->keys()) {
      if (!d.range || d.default_yaml.find("${") != std::string::npos) continue;
      const Value v = detail::parse_default(d);
      std::vector<const Value*> elems;
      if (v.is_list())
        for (const auto& e : v.list) elems.push_back(&e);
      else
        elems.push_back(&v);
      for (const Value* e : elems) {
        if (e->is_null()) continue;
        const double x = e->kind == Value::Kind::Int ? double(e->i) : e->f;
        EXPECT_TRUE(d.range->contains(x)) << s->name() << ": " << d.path << " default " << d.default_yaml
                                          << " outside " << d.range->describe();
      }
    }
}

TEST(ConfigRanges, RangeDescriptions) {
  KeyDecl d;
  d.path = "x";
  EXPECT_EQ(d.in(0, 1).range->describe(), "in [0, 1]");
  EXPECT_EQ(d.in(0, 1, false, true).range->describe(), "in (0, 1]");
  EXPECT_EQ(d.in(0, 1, true, false).range->describe(), "in [0, 1)");
  EXPECT_EQ(d.at_least(1).range->describe(), ">= 1");
  EXPECT_EQ(d.above(0).range->describe(), "> 0");
  EXPECT_EQ(d.at_least(1).or_value(-1).range->describe(), ">= 1 or -1");
  EXPECT_TRUE(d.range->contains(-1));
  EXPECT_FALSE(d.range->contains(0));
  EXPECT_FALSE(d.range->contains(NAN));
}

TEST(ConfigRanges, LearningRateMustBeFiniteAndNonNegative) {
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim.lr=nan"}),
            "config key 'actor_rollout_ref.actor.optim.lr' must be finite (>= 0), got 'nan' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim.lr=inf"}),
            "config key 'actor_rollout_ref.actor.optim.lr' must be finite (>= 0), got 'inf' (from command line)");
  EXPECT_EQ(load_error({"critic.optim.lr=-1e-5"}),
            "config key 'critic.optim.lr' must be >= 0, got '-1e-5' (from command line)");
}

TEST(ConfigRanges, BatchSizesAndCountsAtLeastOne) {
  EXPECT_EQ(load_error({"data.train_batch_size=0"}),
            "config key 'data.train_batch_size' must be >= 1, got '0' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.rollout.n=0"}),
            "config key 'actor_rollout_ref.rollout.n' must be >= 1, got '0' (from command line)");
  EXPECT_EQ(load_error({"trainer.total_training_steps=0"}),
            "config key 'trainer.total_training_steps' must be >= 1, got '0' (from command line)");
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=-2"}),
            "config key 'actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu' must be >= 1, got '-2' (from command "
            "line)");
  // A sentinel outside the range: the optimizer's -1 is "fill in from trainer".
  EXPECT_TRUE(testing::load_overrides({"actor_rollout_ref.actor.optim.total_training_steps=-1"}).is_ok());
  EXPECT_FALSE(testing::load_overrides({"actor_rollout_ref.actor.optim.total_training_steps=0"}).is_ok());
}

TEST(ConfigRanges, ListElementsNamedByIndex) {
  EXPECT_EQ(load_error({"actor_rollout_ref.actor.optim.betas=[0.9,1.0]"}),
            "config key 'actor_rollout_ref.actor.optim.betas' element 1 must be in [0, 1), got '1.0' in [0.9, 1.0] "
            "(from command line)");
}

TEST(ConfigRanges, FileValuesNameFileAndLine) {
  TempYaml y("range_file", "actor_rollout_ref:\n  rollout:\n    top_p: 0\n    gpu_memory_utilization: 1.5\n");
  const std::string e = load_error({}, {y.path()});
  EXPECT_NE(e.find("config key 'actor_rollout_ref.rollout.top_p' must be in (0, 1], got '0' (from " + y.path() + ":3)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("config key 'actor_rollout_ref.rollout.gpu_memory_utilization' must be in (0, 1], got '1.5' (from " +
                   y.path() + ":4)"),
            std::string::npos)
      << e;
}

TEST(ConfigRanges, SftRefusesWhatItUsedToTrainWith) {
  LoadOptions o;
  o.schema = &sft_schema();
  o.overrides = {"optim.lr=-1", "optim.warmup_steps_ratio=5", "optim.eps=0"};
  auto r = load(o);
  ASSERT_FALSE(r.is_ok());
  const std::string e = r.status().message();
  EXPECT_NE(e.find("config key 'optim.lr' must be >= 0, got '-1'"), std::string::npos) << e;
  EXPECT_NE(e.find("config key 'optim.warmup_steps_ratio' must be in [0, 1], got '5'"), std::string::npos) << e;
  EXPECT_NE(e.find("config key 'optim.eps' must be > 0, got '0'"), std::string::npos) << e;
}

TEST(ConfigRanges, ACopyOfARejectedKeyIsNotReportedTwice) {
  // rollout.prompt_length copies data.max_prompt_length: one message.
  EXPECT_EQ(load_error({"data.max_prompt_length=0"}),
            "config key 'data.max_prompt_length' must be >= 1, got '0' (from command line)");
}

TEST(ConfigRanges, DocsShowTheRange) {
  const std::string d = docs();
  EXPECT_NE(d.find("actor_rollout_ref.rollout.top_p\n    float, default 1.0, supported\n    Nucleus sampling mass; 1 "
                   "disables.\n    valid: in (0, 1]\n"),
            std::string::npos);
}

}  // namespace
}  // namespace kestrel::config
