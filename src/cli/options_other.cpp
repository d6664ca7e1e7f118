// Option builders of kestrel sft (sft_trainer tree), generate and logprobs
// (views of the PPO tree), and the shared config loader (see options.h).
#include <cstdio>

#include "cli/options.h"
#include "core/files.h"
#include "core/status.h"

namespace kestrel::cli {

config::Config load_command_config(const config::Schema& s, const std::vector<std::string>& args,
                                   const std::vector<std::string>& first) {
  auto lo = config::options_from_args(args);
  if (!lo) KS_FAIL(s.command(), ": ", lo.status().message());
  lo->overrides.insert(lo->overrides.begin(), first.begin(), first.end());
  lo->schema = &s;
  auto c = config::load(*lo);
  if (!c) KS_FAIL(c.status().message());
  for (const auto& n : c->notices()) std::fprintf(stderr, "%s: %s\n", s.command().c_str(), n.c_str());
  return std::move(c).value();
}

namespace {
std::vector<std::string> list_or_empty(const config::Config& c, const std::string& key) {
  return c.is_null(key) ? std::vector<std::string>{} : c.get_string_list(key);
}
}  // namespace

SftInputs sft_inputs(const config::Config& c) {
  SftInputs in;
  in.model_spec = c.get_string("model.partial_pretrain");
  in.ckpt_root = c.get_string("trainer.default_local_dir");
  in.tokenizer_path = c.get_string_or("model.tokenizer_path", "");
  in.train_files = c.get_string_list("data.train_files");
  in.val_files = list_or_empty(c, "data.val_files");
  in.data.prompt_key = c.get_string("data.prompt_key");
  in.data.response_key = c.get_string("data.response_key");
  in.data.messages_key = c.get_string("data.multiturn.messages_key");
  in.data.max_length = c.get_int("data.max_length");
  in.data.truncation = data::parse_truncation(c.get_string("data.truncation"), "data.truncation").value();
  in.data.skip_malformed = c.get_bool("data.skip_malformed");
  in.data.max_samples = c.get_int("data.train_max_samples");
  in.val_max_samples = c.get_int("data.val_max_samples");
  in.arith.seed = uint64_t(c.get_int("data.arith.seed"));
  in.arith.min_steps = int(c.get_int("data.arith.min_steps"));
  in.arith.max_steps = int(c.get_int("data.arith.max_steps"));
  in.arith.max_operand = int(c.get_int("data.arith.max_operand"));
  in.arith_num_train = c.get_int("data.arith.num_train");
  in.arith_num_test = c.get_int("data.arith.num_test");
  in.dtype = parse_compute_dtype(c.get_string("model.dtype"), "model.dtype");
  if (c.get_bool("model.enable_gradient_checkpointing"))
    in.recompute = model::make_recompute_policy("full", "uniform", 1, {}, false, -1, false, -1, "").value();
  in.train_batch_size = c.get_int("data.train_batch_size");
  in.shuffle = c.get_bool("data.shuffle");
  in.seed = uint64_t(c.get_int("trainer.seed"));
  in.data_seed = c.is_null("data.seed") ? in.seed : uint64_t(c.get_int("data.seed"));
  in.threads = int(c.get_int("trainer.threads"));
  in.loggers = c.get_string_list("trainer.logger");
  in.console_full = c.get_string("trainer.console_metrics") == "full";
  in.val_generations = c.get_int("trainer.val_generations");
  in.max_response_length = c.get_int("data.max_response_length");
  in.tp = c.get_int("trainer.tensor_model_parallel_size");
  in.pipeline.pp = int(c.get_int("trainer.pipeline_model_parallel_size"));
  in.cp = read_context_parallel(c, "trainer.", {"ulysses_sequence_parallel_size"});
  in.pipeline.vpp = int(c.get_int_or("trainer.virtual_pipeline_model_parallel_size", 1));
  in.moe = read_moe_keys(c, "model.override_transformer_config.", "model.override_config.moe_config.freeze_moe_router",
                         true);
  if (in.pipeline.vpp > 1 && in.pipeline.pp == 1)
    KS_FAIL(c.origin("trainer.virtual_pipeline_model_parallel_size"), ": trainer.virtual_pipeline_model_parallel_size=",
            in.pipeline.vpp, " interleaves pipeline stages and needs trainer.pipeline_model_parallel_size > 1; set it "
            "or leave the virtual size null");
  return in;
}

train::SftOptions sft_options(const config::Config& c, int64_t batches_per_epoch) {
  train::SftOptions o;
  const int64_t epochs = c.get_int("trainer.total_epochs");
  o.total_steps = c.get_int_or("trainer.total_training_steps", batches_per_epoch * epochs);
  if (o.total_steps <= 0) KS_FAIL("kestrel sft: no steps to run (check trainer.total_epochs / total_training_steps)");
  o.micro_batch_size = c.get_int("data.micro_batch_size_per_gpu");
  const int64_t max_tokens = c.get_int("data.max_token_len_per_gpu");
  o.max_token_len_per_micro = c.get_bool("data.use_dynamic_bsz") ? max_tokens : 0;
  const auto betas = c.get_float_list("optim.betas");
  if (betas.size() != 2) KS_FAIL(c.origin("optim.betas"), ": optim.betas must hold two numbers");
  o.adamw = {betas[0], betas[1], c.get_float("optim.eps"), c.get_float("optim.weight_decay")};
  o.lr.lr = c.get_float("optim.lr");
  o.max_consecutive_skipped_steps = c.get_int("trainer.max_consecutive_skipped_steps");
  o.lr.style = optim::parse_lr_style(c.get_string("optim.lr_scheduler"), "optim.lr_scheduler").value();
  o.lr.total_steps = o.total_steps;
  o.lr.warmup_steps = int64_t(c.get_float("optim.warmup_steps_ratio") * double(o.total_steps));
  o.lr.min_lr_ratio = c.get_float("optim.min_lr_ratio");
  o.clip_grad = c.get_float("optim.clip_grad");
  o.save_freq = c.get_int("trainer.save_freq");
  o.test_freq = c.get_int("trainer.test_freq");
  o.val_before_train = c.get_bool("trainer.val_before_train");
  o.max_ckpt_to_keep = c.get_int_or("trainer.max_ckpt_to_keep", 0);
  o.ckpt_root = c.get_string("trainer.default_local_dir");
  o.resume_mode = c.get_string("trainer.resume_mode");
  o.resume_from_path = c.get_string_or("trainer.resume_from_path", "");
  o.export_dir = c.get_string_or("trainer.export_dir", "");
  // An export into the model it started from would overwrite its own input.
  const std::string model = c.get_string("model.partial_pretrain");
  if (model.rfind("builtin:", 0) != 0)
    check_not_inside(o.export_dir, "trainer.export_dir", model, "the model folder model.partial_pretrain")
        .throw_if_error();
  o.resolved_config_yaml = c.to_yaml();
  return o;
}

rollout::EngineConfig rollout_engine_config(const config::Config& c) {
  const std::string R = "actor_rollout_ref.rollout.";
  rollout::EngineConfig e;
  e.block_size = c.get_int(R + "block_size");
  e.kv_cache_bytes = 0;  // the command sizes it from gpu_memory_utilization and the model
  e.max_num_batched_tokens = c.get_int(R + "max_num_batched_tokens");
  e.max_num_seqs = c.get_int(R + "max_num_seqs");
  e.enable_chunked_prefill = c.get_bool(R + "enable_chunked_prefill");
  e.enable_prefix_caching = c.get_bool(R + "enable_prefix_caching");
  e.preemption_mode = c.get_string(R + "preemption_mode");
  e.swap_space_gib = double(c.get_int(R + "swap_space"));
  e.max_model_len = c.get_int_or(R + "max_model_len", 0);
  e.enforce_eager = c.get_bool(R + "enforce_eager");
  if (!c.is_null(R + "cudagraph_capture_sizes")) e.cudagraph_capture_sizes = c.get_int_list(R + "cudagraph_capture_sizes");
  return e;
}

GenerateSettings generate_settings(const config::Config& c) {
  const std::string R = "actor_rollout_ref.rollout.";
  GenerateSettings g;
  g.model_path = c.get_string_or("actor_rollout_ref.model.path", "");
  if (g.model_path.empty()) KS_FAIL("kestrel generate: give the model folder: --model DIR (or actor_rollout_ref.model.path=DIR)");
  g.tokenizer_path = c.get_string_or("actor_rollout_ref.model.tokenizer_path", "");
  g.dtype = parse_compute_dtype(c.get_string(R + "dtype"), R + "dtype");
  g.gpu_memory_utilization = c.get_float(R + "gpu_memory_utilization");
  g.engine = rollout_engine_config(c);
  rollout::SamplingParams& sp = g.sampling;
  const double temperature = c.get_float(R + "temperature");
  sp.temperature = c.get_bool(R + "do_sample") ? temperature : 0.0;
  sp.top_k = c.get_int(R + "top_k");
  sp.top_p = c.get_float(R + "top_p");
  sp.min_p = c.get_float(R + "min_p");
  sp.n = c.get_int(R + "n");
  sp.max_tokens = c.get_int(R + "response_length");
  sp.ignore_eos = c.get_bool(R + "ignore_eos");
  g.base_seed = uint64_t(c.get_int(R + "seed"));
  g.router_logits_fp32 =
      c.get_string_or("actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype", "") == "fp32";
  return g;
}

LogprobsSettings logprobs_settings(const config::Config& c) {
  const std::string M = "actor_rollout_ref.actor.megatron.";
  LogprobsSettings l;
  l.model_path = c.get_string_or("actor_rollout_ref.model.path", "");
  if (l.model_path.empty()) KS_FAIL("kestrel logprobs: give the model folder: --model DIR (or actor_rollout_ref.model.path=DIR)");
  l.dtype = parse_compute_dtype(c.get_string(M + "dtype"), M + "dtype");
  l.tp = c.get_int(M + "tensor_model_parallel_size");
  l.pipeline = scoring_pipeline_spec(c, "actor_rollout_ref.actor.megatron");
  l.cp = read_context_parallel(c, M + "override_transformer_config.");
  l.sequence_parallel = c.get_bool(M + "sequence_parallel");
  l.vocab_divisible_by = c.get_int(M + "override_transformer_config.make_vocab_size_divisible_by");
  if (l.vocab_divisible_by < 1) KS_FAIL("kestrel logprobs: make_vocab_size_divisible_by must be >= 1");
  l.moe = read_moe_keys(c, M + "override_transformer_config.", "", false);
  l.max_batch_tokens = c.get_int("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu");
  if (l.max_batch_tokens <= 0) KS_FAIL("kestrel logprobs: --max-batch-tokens must be positive");
  return l;
}

}  // namespace kestrel::cli
