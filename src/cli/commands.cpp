#include "cli/commands.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/cpu_features.h"

namespace kestrel::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"logprobs", "score token sequences: per-token logprob and entropy", cmd_logprobs},
      {"config", "show the resolved config (verl syntax) or document every key", cmd_config},
      {"train", "RL post-training: GRPO/RLOO/REINFORCE++ with verl's ppo_trainer keys", cmd_train},
      {"generate", "generate completions with the rollout engine (verl rollout keys)", cmd_generate},
      {"sft", "supervised fine-tuning (verl sft_trainer keys)", cmd_sft_world},
      {"tokenize", "text or chats to token ids with an HF tokenizer", cmd_tokenize},
      {"builtin", "write the built-in arith data, tokenizer or model folder", cmd_builtin},
      {"data", "inspect a dataset file (Parquet or JSONL): schema, rows, first rows", cmd_data},
      {"report", "write the HTML run report of a run folder (curves, stage timeline, config)", cmd_report},
      {"plan", "predicted memory per rank, FLOPs and communication of a train config, before launch", cmd_plan},
  };
  return table;
}


static void print_help() {
  std::printf("kestrel: RL post-training of LLMs (GRPO/PPO) in one native program.\n\n"
              "usage: kestrel <command> [options]\n\ncommands:\n");
  for (const auto& c : commands()) std::printf("  %-12s %s\n", c.name, c.summary);
  std::printf("\n'kestrel <command> --help' describes a command.\n");
}

int run_main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  // KESTREL_ISA is read at the first kernel call; a bad value fails here, up front.
  if (Result<IsaLevel> isa = isa_from_env(std::getenv("KESTREL_ISA")); !isa.is_ok())
    KS_FAIL(isa.status().message());
  for (const auto& c : commands()) {
    if (c.name == std::string(argv[1])) return c.run(Args(argv + 2, argv + argc));
  }
  std::fprintf(stderr, "kestrel: unknown command '%s'; see 'kestrel --help'\n", argv[1]);
  return 2;
}

}  // namespace kestrel::cli
