// YAML aliases expand when a config is read (issue 20): a self-referencing
// alias recursed until the stack overflowed and "billion laughs" reached 6 GB
// in 8 s. Both are errors naming the file, line and the limit.
#include "config_testing.h"

namespace kestrel::config {
namespace {

using testing::load_error;
using testing::TempYaml;

TEST(YamlLimits, SelfReferencingAliasIsAnError) {
  TempYaml y("self_alias", "trainer:\n  a: &a [*a]\n");
  const std::string e = load_error({}, {y.path()});
  EXPECT_NE(e.find(y.path() + ":2: YAML nested deeper than 64 levels once aliases expand"), std::string::npos) << e;
}

TEST(YamlLimits, BillionLaughsIsAnError) {
  std::string text = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  const std::string names = "abcdefghi";
  for (size_t k = 1; k < names.size(); ++k) {
    text += std::string(1, names[k]) + ": &" + names[k] + " [";
    for (int r = 0; r < 9; ++r) text += std::string(r ? ", *" : "*") + names[k - 1];
    text += "]\n";
  }
  TempYaml y("laughs", text);
  const std::string e = load_error({}, {y.path()});
  EXPECT_NE(e.find(y.path() + ":"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML expands to more than 50000 nodes once aliases expand"), std::string::npos) << e;
}

TEST(YamlLimits, OverrideValuesAreBoundedToo) {
  const std::string e = load_error({"data.train_files=[&a [*a]]"});
  EXPECT_NE(e.find("command-line value"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML nested deeper than 64 levels"), std::string::npos) << e;
}

TEST(YamlLimits, OverrideKeyPathDepthIsBounded) {
  std::string key = "+actor_rollout_ref.model.override_config";
  for (int k = 0; k < 100; ++k) key += ".a";
  const std::string e = load_error({key + "=1"});
  EXPECT_NE(e.find("a key path deeper than 64 levels"), std::string::npos) << e;
}

TEST(YamlLimits, OrdinaryAliasesStillWork) {
  TempYaml y("alias_ok", "common: &c {lr: 2.0e-6}\nactor_rollout_ref:\n  actor:\n    optim: *c\n");
  auto c = testing::load_overrides({}, {y.path()});
  // `common` is no key of the tree, so the file is refused for that, not for the alias.
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().message().find("aliases expand"), std::string::npos) << c.status().message();
}

}  // namespace
}  // namespace kestrel::config
