// Every key a command's table declares Supported is read by the code that
// acts on it: the option builders of cli/options.h run on the default config
// (the Config getters record each read) and every Supported key must be among
// the reads, or be consumed through the default of a key that is read (e.g.
// megatron.sequence_parallel through override_transformer_config's), or admit
// only its default value (validation is then its consumer: rollout.name=kestrel).
// A key verl has that does nothing in Kestrel is Support::NoEffect (with its
// reason), one Kestrel refuses is NotSupportedYet.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "cli/options.h"
#include "config/config.h"

namespace kestrel::cli {
namespace {


config::Config load_tree(const config::Schema& s, const std::vector<std::string>& overrides) {
  config::LoadOptions lo;
  lo.schema = &s;
  lo.overrides = overrides;
  auto c = config::load(lo);
  EXPECT_TRUE(c.is_ok()) << s.name() << ": " << c.status().message();
  return std::move(c).value();
}

// Keys a declared default copies: ${a.b}, ${.x}, ${oc.select:a.b,...}.
std::vector<std::string> referenced_keys(const config::KeyDecl& d) {
  std::vector<std::string> out;
  const std::string& t = d.default_yaml;
  for (size_t at = t.find("${"); at != std::string::npos; at = t.find("${", at + 2)) {
    std::string key = t.substr(at + 2);
    if (key.rfind("oc.select:", 0) == 0) key = key.substr(10);
    key = key.substr(0, key.find_first_of(",}"));
    if (!key.empty() && key[0] == '.') {
      size_t dots = 0;
      while (dots < key.size() && key[dots] == '.') ++dots;
      std::string base = d.path;
      for (size_t i = 0; i < dots; ++i) base = base.substr(0, base.rfind('.'));
      key = base + "." + key.substr(dots);
    }
    out.push_back(key);
  }
  return out;
}

std::vector<std::string> unconsumed(const config::Schema& s, const std::set<std::string>& reads) {
  std::set<std::string> consumed = reads;
  // A key read through its default consumes what that default copies (transitively).
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& d : s.keys())
      if (consumed.count(d.path))
        for (const auto& k : referenced_keys(d)) grew |= consumed.insert(k).second;
  }
  std::vector<std::string> out;
  for (const auto& d : s.keys()) {
    if (d.status != config::Support::Supported || consumed.count(d.path))
      continue;
    if (d.supported.size() == 1 && d.type == config::Type::String) continue;  // only the default works
    out.push_back(d.path);
  }
  return out;
}

std::string listing(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += "\n  " + k;
  return s;
}

TEST(ConfigConsumers, EverySupportedTrainKeyIsRead) {
  std::set<std::string> reads;
  // Defaults (adv_estimator=gae: the critic is on), then GRPO without it.
  for (const auto& ov : std::vector<std::vector<std::string>>{{}, {"algorithm.adv_estimator=grpo"}}) {
    const config::Config c = load_tree(config::ppo_schema(), ov);
    const TrainInputs in = train_inputs(c);
    const rl::RlOptions o = rl_options(c, 10);
    if (in.critic) (void)critic_options(c, o);
    const auto r = c.reads();
    reads.insert(r.begin(), r.end());
  }
  const auto missing = unconsumed(config::ppo_schema(), reads);
  EXPECT_TRUE(missing.empty()) << "Supported ppo_trainer keys nothing reads (make them act, or declare them "
                                  "NoEffect with the reason or NotSupportedYet):"
                               << listing(missing);
}

TEST(ConfigConsumers, EverySupportedSftKeyIsRead) {
  const config::Config c = load_tree(config::sft_schema(), {});
  (void)sft_inputs(c);
  (void)sft_options(c, 10);
  const auto missing = unconsumed(config::sft_schema(), c.reads());
  EXPECT_TRUE(missing.empty()) << "Supported sft_trainer keys nothing reads:" << listing(missing);
}

TEST(ConfigConsumers, EverySupportedGenerateAndLogprobsKeyIsRead) {
  const config::Config g = load_tree(config::generate_schema(), {"actor_rollout_ref.model.path=/m"});
  (void)generate_settings(g);
  auto missing = unconsumed(config::generate_schema(), g.reads());
  EXPECT_TRUE(missing.empty()) << "Supported generate keys nothing reads:" << listing(missing);
  const config::Config l = load_tree(config::logprobs_schema(), {"actor_rollout_ref.model.path=/m"});
  (void)logprobs_settings(l);
  missing = unconsumed(config::logprobs_schema(), l.reads());
  EXPECT_TRUE(missing.empty()) << "Supported logprobs keys nothing reads:" << listing(missing);
}


}  // namespace
}  // namespace kestrel::cli
