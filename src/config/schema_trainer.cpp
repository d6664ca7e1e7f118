// reward_model.*, custom_reward_function.*, algorithm.* (AlgoConfig) and
// trainer.* (verl ppo_megatron_trainer.yaml).
#include "config/schema.h"

namespace kestrel::config::schema_detail {

namespace {
constexpr Support YES = Support::Supported;
constexpr Support NO = Support::NotSupportedYet;
constexpr Support NOP = Support::NoEffect;
constexpr Type B = Type::Bool, I = Type::Int, F = Type::Float, S = Type::String, SL = Type::StringList, M = Type::Map;

// reward_model.*, reward.* (the DAPO recipe's layout) and custom_reward_function.*.
void declare_reward(Builder& b) {
  b.scope("reward_model");
  b.k("enable", B, "false", NO, "Score responses with a reward model instead of only the rule-based reward.");
  b.k("enable_resource_pool", B, "false", NO, "Give the reward model its own devices.");
  b.k("n_gpus_per_node", I, "8", NO, "Devices per node of the reward-model pool.");
  b.k("nnodes", I, "0", NO, "Nodes of the reward-model pool.");
  b.k("strategy", S, "megatron", NOP, "Reward-model backend name; Kestrel has no reward model (reward_model.enable).",
      {"megatron", "fsdp"});
  b.k("reward_command", S, "null", YES,
      "External reward program (run via /bin/sh -c) speaking JSON lines on stdin/stdout (Kestrel).");
  b.k("arith_step_credit", F, "0.0", YES,
      "Built-in arith task: a wrong answer scores this times the fraction of its equations with right "
      "arithmetic; validation accuracy stays exact match (Kestrel).").in(0, 1);
  b.k("model.input_tokenizer", S, "${actor_rollout_ref.model.path}", NO, "Tokenizer of the policy's text (for re-tokenizing).");
  b.k("model.path", S, "~/models/FsfairX-LLaMA3-RM-v0.1", NO, "Reward model directory.");
  b.k("model.trust_remote_code", B, "false", NO, "Run Python modelling code from the model repository.");
  b.k("model.external_lib", S, "null", NO, "Python module imported to register custom models.");
  b.k("micro_batch_size_per_gpu", I, "null", NO, "Sequences per reward-model forward on one rank.");
  b.k("max_length", I, "null", NO, "Maximum reward-model input length.");
  b.k("reward_manager", S, "naive", YES,
      "verl's reward manager: naive (one response at a time), dapo (naive + overlong penalty, acc logged), batch "
      "(one call of a batch function per batch; needs custom_reward_function.path), prime (naive without "
      "reward_extra_info; a dict result zeroes the batch), remote (= naive).",
      {"naive", "prime", "batch", "dapo", "remote", "rate_limited"}, {"naive", "prime", "batch", "dapo", "remote"});
  b.k("launch_reward_fn_async", B, "false", YES,
      "Score rewards on a background thread: each response the moment its generation finishes (a reward program "
      "runs alongside the rollout; per-response managers), the rest (another rank's share, a batch-wise manager's "
      "batch) while the old/ref log-probs run; the step waits for them before the advantages. Scores equal the "
      "synchronous ones; timing_s/reward is the wait. Not with algorithm.filter_groups.enable.");
  b.k("use_reward_loop", B, "true", NOP, "Compute rewards in verl's reward loop; Kestrel computes them in-process.");
  b.k("num_workers", I, "1", YES,
      "Reward-loop workers: this many copies of the reward program (custom_reward_function, reward_command; threads "
      "for the built-in rules) score a batch's responses in parallel, and the background stream of "
      "launch_reward_fn_async runs as many. Scores do not change. Not with reward_manager=batch. verl's default: 8; "
      "Kestrel's: 1.").at_least(1);
  b.k("sandbox_fusion.url", S, "null", NO, "Code-execution sandbox endpoint.");
  b.k("sandbox_fusion.max_concurrent", I, "64", NO, "Concurrent sandbox requests.");
  b.k("sandbox_fusion.memory_limit_mb", I, "1024", NO, "Sandbox memory limit.");
  b.k("overlong_buffer.enable", B, "false", YES,
      "DAPO overlong penalty (reward_manager=dapo; the recipe's run scripts set it here).");
  b.k("overlong_buffer.len", I, "0", YES, "DAPO overlong buffer length L_buf (tokens).").at_least(0);
  b.k("overlong_buffer.penalty_factor", F, "0.0", YES,
      "DAPO penalty added to the score: min(-(L - (max_resp_len - L_buf)) / L_buf * factor, 0); max_resp_len = "
      "reward.reward_kwargs.max_resp_len, else data.max_response_length.").at_least(0);
  b.k("overlong_buffer.log", B, "false", YES, "Log overlong_reward and overlong in reward_extra_info.");

  // verl's older layout: reward_model.reward_kwargs are the reward manager's
  // constructor arguments; the DAPO recipe's run scripts add them with '+'.
  for (const char* k : {"enable", "len", "penalty_factor", "log"}) {
    const std::string key = std::string("reward_kwargs.overlong_buffer_cfg.") + k;
    const bool flag = std::string(k) == "enable" || std::string(k) == "log";
    b.k(key, flag ? B : (std::string(k) == "len" ? I : F), flag ? "false" : (std::string(k) == "len" ? "0" : "0.0"), YES,
        "As reward.reward_kwargs.overlong_buffer_cfg." + std::string(k) + " (verl's older layout; added with '+').")
        .addable = true;
    if (!flag) b.existing(b.prefix() + "." + key).at_least(0);
  }
  b.k("reward_kwargs.max_resp_len", I, "null", YES,
      "As reward.reward_kwargs.max_resp_len (verl's older layout; added with '+').").at_least(1)
      .addable = true;

  // The DAPO recipe's newer layout (recipe/dapo/config/dapo_trainer.yaml).
  b.scope("reward");
  b.k("reward_manager.name", S, "null", YES, "Reward manager (as reward_model.reward_manager, which null keeps).",
      {"naive", "prime", "batch", "dapo", "remote", "rate_limited"}, {"naive", "prime", "batch", "dapo", "remote"});
  b.k("reward_kwargs.overlong_buffer_cfg.enable", B, "false", YES, "DAPO overlong penalty (reward_manager=dapo).");
  b.k("reward_kwargs.overlong_buffer_cfg.len", I, "0", YES, "DAPO overlong buffer length L_buf (tokens).").at_least(0);
  b.k("reward_kwargs.overlong_buffer_cfg.penalty_factor", F, "0.0", YES,
      "DAPO penalty: min(-(L - (max_resp_len - L_buf)) / L_buf * factor, 0).").at_least(0);
  b.k("reward_kwargs.overlong_buffer_cfg.log", B, "false", YES, "Log overlong_reward and overlong in reward_extra_info.");
  b.k("reward_kwargs.max_resp_len", I, "null", YES, "max_resp_len of the overlong penalty; null = data.max_response_length.").at_least(1);

  b.scope("custom_reward_function");
  b.k("path", S, "null", YES, "Python file with fn(data_source, solution_str, ground_truth, extra_info).");
  b.k("name", S, "compute_score", YES, "Function name in custom_reward_function.path.");
  b.k("timeout_s", F, "30.0", YES,
      "Seconds to wait for each reward answer; a hang scores 0, is counted, and the program restarts (Kestrel).").above(0);
  b.k("stderr_log", S, "null", YES, "File for the reward program's stderr; null forwards it to Kestrel's (Kestrel).");
  b.k("reward_kwargs", M, "{}", YES, "Extra keyword arguments passed to the reward function.");
}

// algorithm.*, and the sections verl's fully-async entry points add: async_training.*, rollout.*.
void declare_algorithm(Builder& b) {
  b.scope("algorithm");
  b.k("gamma", F, "1.0", YES, "Discount factor (GAE).").in(0, 1);
  b.k("lam", F, "1.0", YES, "GAE lambda.").in(0, 1);
  b.k("adv_estimator", S, "gae", YES, "Advantage estimator: gae (PPO with critic), grpo, rloo, reinforce_plus_plus ...",
      {"gae", "grpo", "grpo_vectorized", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
       "rloo", "rloo_vectorized", "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline"},
      {"gae", "grpo", "rloo", "reinforce_plus_plus"});
  b.k("norm_adv_by_std_in_grpo", B, "true", YES, "Divide GRPO advantages by the group std; false gives Dr.GRPO.");
  b.k("use_kl_in_reward", B, "false", YES, "Subtract kl_coef * KL(actor || ref) from token rewards.");
  b.k("kl_penalty", S, "kl", YES, "KL estimator of the in-reward penalty.",
      {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"},
      {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"});
  b.k("kl_ctrl.type", S, "fixed", YES, "KL coefficient controller.", {"fixed", "adaptive"});
  b.k("kl_ctrl.kl_coef", F, "0.001", YES, "(Initial) in-reward KL coefficient.").at_least(0);
  b.k("kl_ctrl.horizon", I, "10000", YES, "Adaptive controller horizon.").at_least(1);
  b.k("kl_ctrl.target_kl", F, "0.1", YES, "Adaptive controller target KL.").above(0);
  b.k("use_pf_ppo", B, "false", NO, "Preference-feedback PPO reweighting.");
  b.k("pf_ppo.reweight_method", S, "pow", NO, "PF-PPO reweighting.", {"pow", "max_min", "max_random"});
  b.k("pf_ppo.weight_pow", F, "2.0", NO, "PF-PPO weight power.");
  b.k("filter_groups.enable", B, "false", YES,
      "DAPO dynamic sampling: generate data.gen_batch_size prompts at a time and keep only groups whose metric "
      "varies, until data.train_batch_size groups are kept.");
  b.k("filter_groups.metric", S, "null", YES,
      "Per-response metric whose std over a group must be > 0: acc, score (a reward_extra_info key), seq_reward "
      "(the score), seq_final_reward (after the in-reward KL), or another reward_extra_info key.");
  b.k("filter_groups.max_num_gen_batches", I, "0", YES, "Generation batches tried per step; <= 0 = unlimited.").any_value("<= 0 means unlimited");
  // verl's RolloutCorrectionConfig (rl/rollout_correction.h); all of it needs
  // actor_rollout_ref.rollout.calculate_log_probs=true (the rollout's log-probs in the batch).
  b.k("rollout_correction.rollout_is", S, "null", YES,
      "Truncated importance weights pi_old/pi_rollout on the policy loss: token (per token) or sequence (product "
      "over the response); null = none (metrics only).", {"token", "sequence"});
  b.k("rollout_correction.rollout_is_threshold", F, "2.0", YES, "Upper cap of the importance weights.").above(0);
  b.k("rollout_correction.rollout_rs", S, "null", YES,
      "Rejection sampling: comma list of token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3 "
      "(k1 = -log r, k2 = (log r)^2/2, k3 = r - 1 - log r); a rejected token leaves the loss. null = none.");
  b.k("rollout_correction.rollout_rs_threshold", S, "null", YES,
      "Rejection thresholds, one for all options or one per option (comma list): lower_upper ratio bounds (or "
      "upper alone, lower = 1/upper) for k1 options, an upper bound for k2/k3.");
  b.k("rollout_correction.bypass_mode", B, "false", YES,
      "Use the rollout's log-probs as the old log-probs (no recompute); weights and rejection then come from the "
      "current policy inside the loss.");
  b.k("rollout_correction.loss_type", S, "ppo_clip", YES,
      "Policy loss in bypass mode: ppo_clip (clipped ratio to the rollout policy, no extra weights) or reinforce "
      "(-A * logp times the IS weights).", {"ppo_clip", "reinforce"});
  b.k("rollout_correction.rollout_is_batch_normalize", B, "false", YES,
      "Normalise the truncated importance weights to mean 1 over the batch (per sequence at sequence level).");
  b.k("partial_rollout_max_split", I, "1", YES,
      "Partial rollout (MindSpeed's rl_config.partial_rollout_max_split, verl_npu's key): generation runs in rounds "
      "of ceil(response_length / s) tokens per response; unfinished responses stay in the sample store and continue "
      "next round (re-prefilled under the current weights); a step trains the oldest train_batch_size finished "
      "groups. 1 = off.").at_least(1).addable = true;

  // verl's fully-async trainer (verl/experimental/fully_async_policy): its
  // yaml adds this section to ppo_trainer.yaml (or a script adds it with '+').
  b.scope("async_training");
  b.k("staleness_threshold", F, "0.0", YES,
      "Bounded staleness: the rollout generates up to (1 + t) batches per parameter sync (verl's rollout_num), as a "
      "fixed pipeline: a prompt trains at most ceil(t) versions after it was generated; 1 = one-step off-policy. "
      "verl's fully-async yaml default: 0.1; Kestrel's: 0 (synchronous).").at_least(0).addable = true;
  b.k("trigger_parameter_sync_step", I, "1", NO,
      "Local updates between two parameter syncs; Kestrel syncs after every step (1). verl's fully-async default: 4.")
      .at_least(1).addable = true;
  b.k("require_batches", I, "1", NOP,
      "Mini-batches per local update; a Kestrel step trains data.train_batch_size prompts in ppo_mini_batch_size "
      "mini-batches, then syncs (verl's require_batches = train_batch_size / ppo_mini_batch_size).")
      .at_least(1).addable = true;
  b.k("partial_rollout", B, "false", YES,
      "verl's partial rollout (responses interrupted at a parameter sync and continued after it). Kestrel's rounds "
      "have a token budget: true needs algorithm.partial_rollout_max_split > 1, which then runs it (alone it is "
      "refused, naming that key). verl's fully-async default: true.").addable = true;
  b.k("use_rollout_log_probs", B, "false", YES,
      "Train with the rollout's log-probs as the old log-probs (no recompute; needs "
      "actor_rollout_ref.rollout.calculate_log_probs=true). verl's fully-async default: true.").addable = true;
  b.k("stream_log_probs", B, "false", YES,
      "Kestrel: with rollout ranks (rollout.nnodes), score each group's reference log-probs (and, at staleness 0 "
      "without partial rollout, its old log-probs) on the trainer as soon as its responses arrive, while the "
      "rollout ranks go on generating (the trainer's cores idle then); the rest of the batch when it comes. Each "
      "group is its own micro-batch, so the log-probs equal the batch pass's to f32 rounding, not bit for bit; "
      "ref/streamed_fraction and old_log_prob/streamed_fraction say how much was streamed. Needs a trainer of one "
      "rank.").addable = true;
  b.k("compute_prox_log_prob", B, "false", NO, "Recompute a proximal policy's log-probs (AReaL's decoupled PPO).")
      .addable = true;
  b.k("use_trainer_do_validate", B, "false", NOP,
      "Validate on the trainer's ranks; Kestrel validates on its rollout, as verl's rollouter does.").addable = true;
  b.k("checkpoint_engine.enable", B, "true", NOP,
      "Bucketed weight sync to disaggregated rollout ranks: Kestrel's always is (over MPI; bucket size "
      "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes).").addable = true;
  b.k("checkpoint_engine.device_buffer_size_M", I, "4096", NOP,
      "Bucket size of verl's checkpoint engine; Kestrel's is actor_rollout_ref.rollout.checkpoint_engine."
      "update_weights_bucket_megabytes.").at_least(1).addable = true;
  b.k("checkpoint_engine.overlap_broadcast_and_consume", B, "false", NO,
      "Overlap the weight broadcast with loading it into the rollout.").addable = true;

  // verl's fully-async and one-step-off-policy entry points place the rollout
  // on its own ranks; their yaml adds this section.
  b.scope("rollout");
  b.k("nnodes", I, "0", YES,
      "Disaggregated rollout: with n_gpus_per_node, the last nnodes x n_gpus_per_node processes of the job only "
      "generate (each a whole copy of the policy) and world rank 0 trains; weights reach them over MPI in buckets "
      "after each step. 0 = colocated (verl's fully-async yaml default: 1).").at_least(0).addable = true;
  b.k("n_gpus_per_node", I, "0", YES, "Rollout processes per node of the disaggregated rollout (see rollout.nnodes); "
      "0 = colocated (verl's fully-async yaml default: 8).").at_least(0).addable = true;
}

// trainer.*.
void declare_trainer(Builder& b) {
  b.scope("trainer");
  b.k("balance_batch", B, "true", YES, "Reorder the batch so DP ranks get equal valid-token counts.");
  b.k("total_epochs", I, "30", YES, "Passes over the training set.").at_least(1);
  b.k("total_training_steps", I, "null", YES, "Stop after this many steps; null = steps per epoch * total_epochs.").at_least(1);
  b.k("project_name", S, "verl_examples", YES, "Project name for logging and checkpoint paths.");
  b.k("experiment_name", S, "gsm8k", YES, "Run name for logging and checkpoint paths.");
  b.k("logger", SL, "[console]", YES, "Metric sinks. verl default: [console, wandb].",
      {"console", "wandb", "swanlab", "mlflow", "tensorboard", "trackio", "vemlp_wandb", "clearml", "file"},
      {"console", "tensorboard", "file"});
  b.k("console_metrics", S, "compact", YES,
      "What the console logger prints per step: compact (reward, accuracy when validated, KL, entropy, response "
      "length, seconds) or full (every metric, as verl's console logger); metrics.jsonl and TensorBoard always get "
      "every metric (Kestrel).",
      {"compact", "full"});
  b.k("max_consecutive_skipped_steps", I, "10", YES,
      "NaN/Inf guard: an update whose loss or gradient norm is not finite is skipped and counted "
      "(actor/step_skipped); after this many skips in a row the run stops with the step and the quantity; 0 never "
      "stops (Kestrel).").at_least(0);
  b.k("log_val_generations", I, "0", NO, "Validation generations printed per validation.");
  b.k("rollout_data_dir", S, "null", NO, "Dump each step's rollouts as JSONL here.");
  b.k("validation_data_dir", S, "null", NO, "Dump validation generations as JSONL here.");
  b.k("nnodes", I, "1", NOP, "Nodes; Kestrel's processes are the ones mpirun/srun starts (-np).");
  b.k("n_gpus_per_node", I, "8", NOP, "Devices (ranks) per node; Kestrel's processes are the ones mpirun/srun starts.");
  b.k("device", S, "cuda", NOP, "Device type: cuda (the GPU, where the build has the CUDA backend and a device; else, left unset, the CPU) or cpu.",
      {"cuda", "npu", "cpu"}, {"cuda", "cpu"});
  b.k("save_freq", I, "-1", YES, "Save a checkpoint every N steps and at the end; -1 never saves.").at_least(-1);
  b.k("esi_redundant_time", I, "0", NO, "Save before an ESI instance expires (seconds of margin).");
  b.k("resume_mode", S, "auto", YES, "auto: latest checkpoint in default_local_dir; disable: fresh; resume_path: resume_from_path.",
      {"auto", "disable", "resume_path"});
  b.k("resume_from_path", S, "null", YES, "Checkpoint directory (global_step_N) for resume_mode=resume_path.");
  b.k("del_local_ckpt_after_load", B, "false", NO, "Delete the local checkpoint after resuming from it.");
  b.k("val_before_train", B, "true", YES, "Validate before the first step.");
  b.k("val_only", B, "false", YES, "Validate and exit.");
  b.k("test_freq", I, "-1", YES, "Validate every N steps; -1 never.").at_least(-1);
  b.k("critic_warmup", I, "0", YES, "Steps of critic-only training before actor updates start.").at_least(0);
  b.k("time_budget_s", F, "null", YES,
      "Wall-clock budget in seconds (validation included): training stops early, validated and saved, "
      "so the run ends within it; null = none (Kestrel).").above(0);
  b.k("default_hdfs_dir", S, "null", NO, "Copy checkpoints to HDFS.");
  b.k("default_local_dir", S, "checkpoints/${trainer.project_name}/${trainer.experiment_name}", YES,
      "Checkpoint root: {default_local_dir}/global_step_{N}/.");
  b.k("max_actor_ckpt_to_keep", I, "null", YES, "Keep at most this many actor checkpoints; null keeps all.").at_least(0);
  b.k("max_critic_ckpt_to_keep", I, "null", NO,
      "Keep at most this many critic checkpoints; Kestrel saves the critic inside each global_step_N, which "
      "max_actor_ckpt_to_keep prunes.");
  b.k("ray_wait_register_center_timeout", I, "300", NOP, "Ray start-up timeout; Kestrel has no Ray.");
  b.k("use_legacy_worker_impl", S, "auto", NOP, "verl's worker implementation; Kestrel has its own workers.",
      {"auto", "enable", "disable"});
}

}  // namespace

void declare_reward_algorithm_trainer(Builder& b) {
  declare_reward(b);
  declare_algorithm(b);
  declare_trainer(b);
}

}  // namespace kestrel::config::schema_detail
