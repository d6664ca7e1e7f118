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
      {"sft", "supervised fine-tuning (verl sft_trainer keys)", cmd_sft},
      {"tokenize", "text or chats to token ids with an HF tokenizer", cmd_tokenize},
      {"builtin", "write the built-in arith data, tokenizer or model folder", cmd_builtin},
      {"data", "inspect a dataset file (Parquet or JSONL): schema, rows, first rows", cmd_data},
      {"plan", "predicted memory per rank, FLOPs and communication of a train config, before launch", cmd_plan},
  };
  return table;
}

const std::vector<std::string>& builtin_train_layer() {
  // The list of cli/train.cpp's kBuiltinRun, which prints it in `kestrel
  // train --help`; tests/scripts/plan_cli.sh fails when the two differ.
  // (The integrator may make train.cpp read this one.)
  static const std::vector<std::string> layer = {
      "algorithm.adv_estimator=grpo",
      "algorithm.norm_adv_by_std_in_grpo=true",
      "data.train_files=[builtin:arith]",
      "data.val_files=[builtin:arith]",
      "data.train_batch_size=16",
      "data.max_prompt_length=256",
      "data.max_response_length=80",
      "data.val_max_samples=500",
      "actor_rollout_ref.model.path=builtin:arith-sft",
      "actor_rollout_ref.actor.megatron.dtype=float32",
      "actor_rollout_ref.rollout.dtype=float32",
      "critic.megatron.dtype=float32",
      "actor_rollout_ref.rollout.n=8",
      "actor_rollout_ref.rollout.temperature=0.7",
      "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
      "actor_rollout_ref.actor.ppo_mini_batch_size=16",
      "actor_rollout_ref.actor.use_dynamic_bsz=true",
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
      "actor_rollout_ref.actor.optim.lr=5e-5",
      "actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
      "actor_rollout_ref.actor.optim.clip_grad=1.0",
      "actor_rollout_ref.actor.use_kl_loss=false",
      "actor_rollout_ref.actor.entropy_coeff=0",
      "trainer.project_name=kestrel",
      "trainer.experiment_name=grpo_arith",
      "trainer.device=cpu",
      "trainer.total_training_steps=2000",
      "trainer.time_budget_s=590",
      "trainer.test_freq=50",
      "trainer.save_freq=100",
      "trainer.val_before_train=true",
  };
  return layer;
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
