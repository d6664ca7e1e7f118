// kestrel config show|docs|defaults: inspect the run configuration.
//   show      the resolved config (defaults <- files <- overrides) as YAML
//   docs      every key with type, default, allowed values, status and doc
//   defaults  the commented defaults file (configs/ppo_trainer.yaml)
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"

namespace kestrel::cli {

namespace {
const char* kUsage =
    "usage: kestrel config show [TREE] [--config FILE | --config-path DIR --config-name NAME] [key=value ...]\n"
    "       kestrel config docs [TREE]\n"
    "       kestrel config defaults [TREE]\n\n"
    "TREE is the command's key table: ppo_trainer (kestrel train; the default), sft_trainer (kestrel sft),\n"
    "generate or logprobs (the PPO keys those commands take).\n"
    "--config-name ppo_trainer | ppo_megatron_trainer with no such file under --config-path is verl's tree\n"
    "built in (as verl scripts pass --config-path=config); YAML files may use Hydra defaults lists.\n"
    "Overrides use Hydra syntax: key=value sets an existing key, +key=value adds one\n"
    "(free-form maps, override_transformer_config), ++key=value adds or sets, ~key deletes\n"
    "(restores a declared key's default). Values are YAML scalars or lists: lr=1e-6, logger='[console]'.\n";
}  // namespace

int cmd_config(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  // An optional tree name first (a word without '=' or a leading '-').
  const config::Schema* tree = &config::ppo_schema();
  if (!rest.empty() && rest[0].find('=') == std::string::npos && rest[0][0] != '-' && rest[0][0] != '~') {
    tree = config::find_schema(rest[0]);
    if (!tree) {
      std::fprintf(stderr, "kestrel config %s: unknown tree '%s' (ppo_trainer, sft_trainer, generate, logprobs)\n",
                   sub.c_str(), rest[0].c_str());
      return 2;
    }
    rest.erase(rest.begin());
  }
  if (sub == "docs" || sub == "defaults") {
    if (!rest.empty()) {
      std::fprintf(stderr, "kestrel config %s: takes no arguments but a tree name\n%s", sub.c_str(), kUsage);
      return 2;
    }
    const std::string text = sub == "docs" ? config::docs(*tree) : config::defaults_yaml(*tree);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  if (sub != "show") {
    std::fprintf(stderr, "kestrel config: unknown subcommand '%s'\n%s", sub.c_str(), kUsage);
    return 2;
  }
  for (const auto& a : rest) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  auto opts = config::options_from_args(rest);
  if (!opts.is_ok()) {
    std::fprintf(stderr, "kestrel config show: %s\n", opts.status().message().c_str());
    return 2;
  }
  opts.value().schema = tree;
  auto cfg = config::load(opts.value());
  if (!cfg.is_ok()) {
    std::fprintf(stderr, "kestrel config show: %s\n", cfg.status().message().c_str());
    return 1;
  }
  for (const auto& n : cfg.value().notices()) std::fprintf(stderr, "kestrel config show: %s\n", n.c_str());
  const std::string yaml = cfg.value().to_yaml();
  std::fwrite(yaml.data(), 1, yaml.size(), stdout);
  return 0;
}

}  // namespace kestrel::cli
