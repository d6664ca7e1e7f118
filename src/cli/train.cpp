// kestrel train: RL post-training (GRPO / RLOO / REINFORCE++) with verl's
// ppo_trainer keys through the config layer.
//
// Without --config, a built-in run layer (kBuiltinRun below) comes first: the
// built-in `arith` task, the tiny built-in policy warm-started by SFT (trained
// once with `kestrel sft` settings and cached, see warm_start_dir) and GRPO
// settings sized for a 2-core CPU. Command-line overrides apply on top.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "cli/loader_source.h"
#include "comm/world.h"
#include "config/config.h"
#include "core/files.h"
#include "data/arith.h"
#include "data/chat_tokenizer.h"
#include "data/config_options.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "io/model_config.h"
#include "model/parallel_setup.h"
#include "parallel/setup.h"
#include "rl/reward_manager.h"
#include "rl/trainer.h"
#include "train/checkpoint.h"

namespace kestrel::cli {

int cmd_train(const std::vector<std::string>& args);

namespace {

namespace fs = std::filesystem;

const char* const kBuiltinRun[] = {
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
    "actor_rollout_ref.rollout.n=8",
    // Below 1 the samples stay near the greedy path that validation scores
    // (T=1 samples are right 30% of the time against 47% greedy).
    "actor_rollout_ref.rollout.temperature=0.7",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
    // 1 thread: 2e-4 and 1e-4 lower greedy accuracy within 10-20 steps
    // (0.47 -> 0.33 / 0.42 on 200 prompts); 5e-5 is flat for ~80 steps, then rises.
    "actor_rollout_ref.actor.optim.lr=5e-5",
    "actor_rollout_ref.actor.optim.betas=[0.9,0.95]",
    "actor_rollout_ref.actor.optim.clip_grad=1.0",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "trainer.project_name=kestrel",
    "trainer.experiment_name=grpo_arith",
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=1",
    // ~0.4 s a step on 2 cores: the 10-minute budget (validations included)
    // ends the run, after ~1400 steps; docs/benchmarks.md has the curve.
    "trainer.total_training_steps=2000",
    "trainer.time_budget_s=590",  // + ~5 s of start-up: within 10 minutes
    "trainer.test_freq=50",
    "trainer.save_freq=100",
    "trainer.val_before_train=true",
};

std::string help_text() {
  std::string s =
      "usage: kestrel train [--config FILE.yaml] [key=value ...]\n\n"
      "RL post-training with verl's ppo_trainer keys ('kestrel config docs' lists them).\n"
      "Without --config the built-in run comes first (arith task, SFT-warm-started tiny policy, GRPO):\n";
  for (const char* o : kBuiltinRun) s += std::string("  ") + o + "\n";
  s += "\nbuiltin:arith as a data file is the built-in task; builtin:tiny|small as model path a random-init\n"
       "model; builtin:arith-sft the tiny model after SFT on arith (trained once and cached under\n"
       "$KESTREL_CACHE or ~/.cache/kestrel).\n";
  return s;
}

std::string cache_root() {
  if (const char* c = std::getenv("KESTREL_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kestrel";
  return ".kestrel_cache";
}

// The built-in arith task files (RL rows), written once per settings.
std::string arith_dir() {
  const std::string dir = cache_root() + "/arith_s1234_1-2_op20_20000_500";
  if (!fs::exists(dir + "/test.jsonl")) data::write_arith_dataset(dir, 20000, 500, data::ArithOptions{}).throw_if_error();
  return dir;
}

std::vector<std::string> resolve_files(const std::vector<std::string>& files, bool train) {
  std::vector<std::string> out;
  for (const auto& f : data::expand_paths(files))
    out.push_back(f == "builtin:arith" ? arith_dir() + (train ? "/train.jsonl" : "/test.jsonl") : f);
  return out;
}

// builtin:arith-sft: the tiny model fine-tuned on arith worked solutions
// (configs/sft_arith.yaml's settings, ~4 minutes on 2 cores), run once.
std::string warm_start_dir() {
  const std::string root = cache_root() + "/arith_sft_tiny";
  const std::string out = root + "/hf_model";
  if (fs::exists(out + "/model.safetensors")) return out;
  std::fprintf(stderr, "train: no SFT warm start at %s; running kestrel sft first (once)\n", out.c_str());
  const std::vector<std::string> sft = {
      "data.train_files=builtin:arith", "data.val_files=null", "data.max_length=256", "data.train_batch_size=16",
      "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=4096", "model.partial_pretrain=builtin:tiny",
      "optim.lr=3e-3", "optim.betas=[0.9,0.95]", "optim.weight_decay=0.01", "optim.warmup_steps_ratio=0.03",
      "optim.clip_grad=1.0", "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.1",
      "trainer.default_local_dir=" + root, "trainer.total_training_steps=1000", "trainer.logger=[file]",
      "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.export_dir=" + out};
  if (int rc = cmd_sft(sft); rc != 0) KS_FAIL("train: the SFT warm start failed (exit ", rc, ")");
  return out;
}

std::string resolve_model(const std::string& spec) {
  if (spec == "builtin:arith-sft") return warm_start_dir();
  if (spec.rfind("builtin:", 0) == 0) {
    const std::string dir = cache_root() + "/model_" + spec.substr(8);
    if (!fs::exists(dir + "/model.safetensors")) {
      if (int rc = cmd_builtin({"model", spec.substr(8), "--out", dir, "--seed", "1"}); rc != 0)
        KS_FAIL("actor_rollout_ref.model.path: cannot materialise ", spec);
    }
    return dir;
  }
  return data::expand_paths({spec}).at(0);
}

std::vector<rl::RlPrompt> to_prompts(const std::vector<data::RlSample>& rows) {
  std::vector<rl::RlPrompt> out;
  for (const auto& r : rows) out.push_back({r.prompt_ids, r.data_source, r.ground_truth, r.extra_info});
  return out;
}

void reject_unbuilt(const config::Config& c) {
  auto fail_if = [&](bool bad, const std::string& what) {
    if (bad) KS_FAIL("not supported yet: ", what);
  };
  fail_if(c.get_string("algorithm.kl_penalty") == "full", "algorithm.kl_penalty=full (use kl, abs, mse or low_var_kl)");
  const std::string lm = c.get_string("actor_rollout_ref.actor.policy_loss.loss_mode");
  fail_if(lm != "vanilla", "actor_rollout_ref.actor.policy_loss.loss_mode=" + lm);
  fail_if(c.get_int("actor_rollout_ref.rollout.data_parallel_size") != 1,
          "actor_rollout_ref.rollout.data_parallel_size (the rollout's data parallelism is world size / rollout "
          "tensor_model_parallel_size)");
}

// The learning-rate schedule of `<prefix>optim.*` (actor or critic).
optim::LrScheduleConfig lr_schedule_config(const config::Config& c, const std::string& prefix, int64_t total_steps) {
  const std::string P = prefix + "optim.";
  optim::LrScheduleConfig lr;
  lr.lr = c.get_float(P + "lr");
  const std::string style = c.is_null(P + "warmup_style") ? c.get_string(P + "lr_decay_style")
                                                          : c.get_string(P + "warmup_style");
  lr.style = optim::parse_lr_style(style, P + "lr_decay_style").value();
  lr.total_steps = c.get_int(P + "total_training_steps") > 0 ? c.get_int(P + "total_training_steps") : total_steps;
  lr.warmup_steps = optim::resolve_warmup_steps(c.get_int(P + "lr_warmup_steps"), c.get_float(P + "lr_warmup_steps_ratio"),
                                                lr.total_steps);
  lr.min_lr_ratio = c.is_null(P + "min_lr_ratio") ? (lr.lr > 0 ? c.get_float(P + "min_lr") / lr.lr : 0)
                                                  : c.get_float(P + "min_lr_ratio");
  lr.init_lr_ratio = lr.lr > 0 ? c.get_float(P + "lr_warmup_init") / lr.lr : 0;
  return lr;
}

// The PPO critic (critic.*): on when critic.enable says so, or (null) exactly
// for adv_estimator=gae. Its value model starts from critic.model.path, an
// actor folder (lm_head dropped, a seeded score head) or a critic checkpoint.
std::unique_ptr<rl::Critic> make_critic(const config::Config& c, const rl::RlOptions& o, const std::string& actor_dir,
                                        const model::ModelOptions& actor_opts) {
  const bool gae = o.adv_estimator == rl::AdvEstimator::GAE;
  const bool on = c.is_null("critic.enable") ? gae : c.get_bool("critic.enable");
  if (!on) {
    if (gae) KS_FAIL(c.origin("critic.enable"), ": algorithm.adv_estimator=gae needs the critic (critic.enable=true)");
    return nullptr;
  }
  const std::string C = "critic.";
  const std::string path = c.get_string(C + "model.path");
  const std::string dir = path == c.get_string("actor_rollout_ref.model.path") ? actor_dir : resolve_model(path);
  model::ModelOptions mo = actor_opts;
  mo.value_head = true;
  mo.value_head_seed = uint64_t(c.get_int(C + "megatron.seed"));
  auto m = model::CausalLM::load(dir, mo);
  if (!m) KS_FAIL(c.origin(C + "model.path"), ": ", m.status().message());
  rl::CriticOptions co;
  co.ppo_mini_batch_size = c.get_int(C + "ppo_mini_batch_size");
  co.n = o.n;
  co.ppo_epochs = c.get_int(C + "ppo_epochs");
  co.shuffle = c.get_bool(C + "shuffle");
  co.data_loader_seed = uint64_t(c.get_int(C + "data_loader_seed"));
  co.micro_batch_size = c.get_int_or(C + "ppo_micro_batch_size_per_gpu", 0);
  co.max_token_len = c.get_bool(C + "use_dynamic_bsz") ? c.get_int(C + "ppo_max_token_len_per_gpu") : 0;
  co.forward_max_token_len = c.get_int(C + "forward_max_token_len_per_gpu");
  co.cliprange_value = c.get_float(C + "cliprange_value");
  co.loss_agg_mode = rl::parse_agg_mode(c.get_string(C + "loss_agg_mode")).value();
  co.loss_scale_factor = o.loss_scale_factor;
  co.response_length = o.response_length;
  const auto betas = c.get_float_list(C + "optim.betas");
  if (betas.size() != 2) KS_FAIL(c.origin(C + "optim.betas"), ": ", C, "optim.betas must hold two numbers");
  co.adamw = {betas[0], betas[1], c.get_float(C + "optim.eps"), c.get_float(C + "optim.weight_decay")};
  co.lr = lr_schedule_config(c, C, o.total_steps);
  co.clip_grad = c.get_float(C + "optim.clip_grad");
  co.share_prompts = o.share_prompts;
  return std::make_unique<rl::Critic>(std::move(m).value(), co);
}

}  // namespace

int cmd_train(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      std::printf("%s", help_text().c_str());
      return 0;
    }
  const auto t_start = std::chrono::steady_clock::now();
  auto lo = config::options_from_args(argv);
  if (!lo) KS_FAIL("kestrel train: ", lo.status().message());
  if (lo->config_files.empty()) {
    std::vector<std::string> o(std::begin(kBuiltinRun), std::end(kBuiltinRun));
    o.insert(o.end(), lo->overrides.begin(), lo->overrides.end());
    lo->overrides = std::move(o);
  }
  auto cr = config::load(*lo);
  if (!cr) KS_FAIL(cr.status().message());
  const config::Config& c = *cr;
  reject_unbuilt(c);

  const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.";
  // Under mpirun/srun: tp from the actor's megatron config, dp = world / tp,
  // the rollout's tp from rollout.tensor_model_parallel_size (rl/distributed.h).
  const comm::World* world = comm::World::current();
  const int world_size = world ? world->size() : 1, world_rank = world ? world->rank() : 0;
  const bool leader = world_rank == 0;
  const int64_t tp = c.get_int(A + "megatron.tensor_model_parallel_size");
  const int64_t rtp = c.get_int(R + "tensor_model_parallel_size");
  for (const auto& [key, size] : {std::pair{A + "megatron.tensor_model_parallel_size", tp},
                                  std::pair{R + "tensor_model_parallel_size", rtp}})
    if (size < 1 || world_size % size != 0)
      KS_FAIL(c.origin(key), ": ", key, "=", size, " must divide the number of processes (", world_size,
              "); launch with mpirun -np <a multiple of ", size, "> kestrel train ...");
  // Rank 0 materialises the built-in caches (task files, SFT warm start) first.
  if (world_size > 1 && !leader) world->group()->barrier();
  const std::string model_dir = resolve_model(c.get_string("actor_rollout_ref.model.path"));
  for (const char* k : {"data.train_files", "data.val_files"})
    if (!c.is_null(k)) (void)resolve_files(c.get_string_list(k), true);
  if (world_size > 1 && leader) world->group()->barrier();
  const std::string tok_dir =
      c.is_null("actor_rollout_ref.model.tokenizer_path") ? model_dir : c.get_string("actor_rollout_ref.model.tokenizer_path");
  auto tok_r = data::ChatTokenizer::from_dir(tok_dir);
  if (!tok_r) KS_FAIL(tok_r.status().message());
  const data::ChatTokenizer& tok = *tok_r;

  auto dopt = data::rl_dataset_options(c, false);
  if (!dopt) KS_FAIL(dopt.status().message());
  data::LoadStats tst, vst;
  auto train_rows = data::load_rl_dataset(resolve_files(c.get_string_list("data.train_files"), true), tok, *dopt, &tst);
  if (!train_rows) KS_FAIL(train_rows.status().message());
  auto vopt = data::rl_dataset_options(c, true);
  if (!vopt) KS_FAIL(vopt.status().message());
  std::vector<data::RlSample> val_rows;
  if (!c.is_null("data.val_files")) {
    auto v = data::load_rl_dataset(resolve_files(c.get_string_list("data.val_files"), false), tok, *vopt, &vst);
    if (!v) KS_FAIL(v.status().message());
    val_rows = std::move(v).value();
  }
  if (leader) std::fprintf(stderr, "train: train %s; val %s\n", tst.summary().c_str(), vst.summary().c_str());

  auto ropt = rl::reward_options_from_config(c);
  auto rm = rl::RewardManager::create(ropt);
  if (!rm) KS_FAIL(rm.status().message());
  {
    std::vector<std::string> srcs;
    for (const auto& r : *train_rows) srcs.push_back(r.data_source);
    for (const auto& r : val_rows) srcs.push_back(r.data_source);
    (*rm)->validate_data_sources(srcs).throw_if_error();
  }

  model::ModelOptions mopt;
  const std::string dt = c.get_string(A + "megatron.dtype");
  mopt.dtype = dt == "bfloat16" ? DType::BF16 : DType::F32;
  std::unique_ptr<parallel::ProcessGrid> grid;
  rl::RlParallel par;
  if (world_size > 1) {
    auto mc = io::load_model_config(model_dir);
    if (!mc) KS_FAIL(mc.status().message());
    const bool sp = c.get_bool(A + "megatron.override_transformer_config.sequence_parallel");
    auto g = parallel::make_process_grid(*world, parallel::dims_for(int(tp), sp), model::model_facts(*mc));
    if (!g) KS_FAIL("kestrel train: ", g.status().message());
    grid = std::move(g).value();
    mopt.parallel = model::model_parallel_for(*grid);
    par.world = world->group();
    par.dp = grid->group(parallel::GroupKind::Dp);
    par.distributed_optimizer = c.get_bool(A + "megatron.use_distributed_optimizer");
    if (rtp != tp) par.rollout_tp = world->split(world_rank / int(rtp), world_rank, "rollout_tp");
  }
  auto loaded = model::CausalLM::load(model_dir, mopt);
  if (!loaded) KS_FAIL(loaded.status().message());
  model::CausalLM& actor = **loaded;

  rl::RlOptions o;
  o.train_batch_size = c.get_int("data.train_batch_size");
  o.n = c.get_int(R + "n");
  const bool sample = c.get_bool(R + "do_sample");
  o.temperature = sample ? c.get_float(R + "temperature") : 0.0;
  o.top_k = c.get_int(R + "top_k");
  o.top_p = c.get_float(R + "top_p");
  o.response_length = c.get_int(R + "response_length");
  o.max_prompt_length = c.get_int(R + "prompt_length");
  o.rollout_seed = uint64_t(c.get_int(R + "seed"));
  o.engine.block_size = c.get_int(R + "block_size");
  o.engine.max_num_batched_tokens = c.get_int(R + "max_num_batched_tokens");
  o.engine.max_num_seqs = c.get_int(R + "max_num_seqs");
  o.engine.enable_chunked_prefill = c.get_bool(R + "enable_chunked_prefill");
  o.engine.enable_prefix_caching = c.get_bool(R + "enable_prefix_caching");
  o.engine.preemption_mode = c.get_string(R + "preemption_mode");
  o.engine.max_model_len = c.get_int_or(R + "max_model_len", o.max_prompt_length + o.response_length);
  o.engine.kv_cache_bytes = int64_t(512) << 20;
  o.val_n = c.get_int(R + "val_kwargs.n");
  o.val_temperature = c.get_bool(R + "val_kwargs.do_sample") ? c.get_float(R + "val_kwargs.temperature") : 0.0;
  o.val_top_k = c.get_int(R + "val_kwargs.top_k");
  o.val_top_p = c.get_float(R + "val_kwargs.top_p");
  o.ppo_mini_batch_size = c.get_int(A + "ppo_mini_batch_size");
  o.ppo_epochs = c.get_int(A + "ppo_epochs");
  o.shuffle = c.get_bool(A + "shuffle");
  o.data_loader_seed = uint64_t(c.get_int(A + "data_loader_seed"));
  o.micro_batch_size = c.get_int_or(A + "ppo_micro_batch_size_per_gpu", 0);
  o.max_token_len = c.get_bool(A + "use_dynamic_bsz") ? c.get_int(A + "ppo_max_token_len_per_gpu") : 0;
  o.log_prob_max_token_len = c.get_int(R + "log_prob_max_token_len_per_gpu");
  o.share_prompts = c.get_bool(A + "use_prefix_grouper");
  o.loss.clip_ratio_low = c.get_float(A + "clip_ratio_low");
  o.loss.clip_ratio_high = c.get_float(A + "clip_ratio_high");
  o.loss.clip_ratio_c = c.get_float(A + "clip_ratio_c");
  o.loss.entropy_coeff = c.get_float(A + "entropy_coeff");
  o.loss.use_kl_loss = c.get_bool(A + "use_kl_loss");
  o.loss.kl_loss_coef = c.get_float(A + "kl_loss_coef");
  o.loss.kl_loss_type = c.get_string(A + "kl_loss_type");
  o.loss.agg.mode = rl::parse_agg_mode(c.get_string(A + "loss_agg_mode")).value();
  o.loss_scale_factor = c.get_float_or(A + "loss_scale_factor", 0.0);
  o.adv_estimator = rl::parse_adv_estimator(c.get_string("algorithm.adv_estimator")).value();
  o.norm_adv_by_std_in_grpo = c.get_bool("algorithm.norm_adv_by_std_in_grpo");
  o.gamma = c.get_float("algorithm.gamma");
  o.lam = c.get_float("algorithm.lam");
  const auto betas = c.get_float_list(A + "optim.betas");
  if (betas.size() != 2) KS_FAIL(c.origin(A + "optim.betas"), ": ", A, "optim.betas must hold two numbers");
  o.adamw = {betas[0], betas[1], c.get_float(A + "optim.eps"), c.get_float(A + "optim.weight_decay")};
  o.clip_grad = c.get_float(A + "optim.clip_grad");

  const int64_t batch = o.train_batch_size;
  if (int64_t(train_rows->size()) < batch)
    KS_FAIL("data.train_batch_size=", batch, " but the training set has only ", train_rows->size(), " prompts");
  auto source = std::make_unique<LoaderSource>(int64_t(train_rows->size()), batch, c.get_bool("data.shuffle"),
                                               data::data_seed(c));
  o.total_steps = c.is_null("trainer.total_training_steps")
                      ? source->batches_per_epoch() * c.get_int("trainer.total_epochs")
                      : c.get_int("trainer.total_training_steps");
  o.lr = lr_schedule_config(c, A, o.total_steps);
  o.use_kl_in_reward = c.get_bool("algorithm.use_kl_in_reward");
  o.kl_penalty = c.get_string("algorithm.kl_penalty");
  o.kl_ctrl.type = c.get_string("algorithm.kl_ctrl.type");
  o.kl_ctrl.value = c.get_float("algorithm.kl_ctrl.kl_coef");
  o.kl_ctrl.horizon = c.get_int("algorithm.kl_ctrl.horizon");
  o.kl_ctrl.target_kl = c.get_float("algorithm.kl_ctrl.target_kl");
  o.critic_warmup = c.get_int("trainer.critic_warmup");
  o.balance_batch = c.get_bool("trainer.balance_batch");
  o.save_freq = c.get_int("trainer.save_freq");
  o.time_budget_s = c.get_float_or("trainer.time_budget_s", 0.0);
  o.test_freq = c.get_int("trainer.test_freq");
  o.val_before_train = c.get_bool("trainer.val_before_train");
  o.max_ckpt_to_keep = c.get_int_or("trainer.max_actor_ckpt_to_keep", 0);
  o.ckpt_root = c.get_string("trainer.default_local_dir");
  o.resume_mode = c.get_string("trainer.resume_mode");
  o.resume_from_path = c.get_string_or("trainer.resume_from_path", "");
  o.progress = leader && std::getenv("KESTREL_NO_PROGRESS") == nullptr;
  o.parallel = par;
  o.resolved_config_yaml = c.to_yaml();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    if (fs::exists(tok_dir + "/" + f)) o.model_extra_files[f] = read_file(tok_dir + "/" + f).value();

  std::unique_ptr<model::CausalLM> ref;
  if (o.loss.use_kl_loss || o.use_kl_in_reward) {
    auto r = model::CausalLM::load(model_dir, mopt);  // the frozen initial policy
    if (!r) KS_FAIL(r.status().message());
    ref = std::move(r).value();
  }

  std::unique_ptr<rl::Critic> critic = make_critic(c, o, model_dir, mopt);

  // metrics.jsonl and TensorBoard events always go next to the checkpoints
  // (the config layer accepts only trainer.logger=[console] so far).
  train::MetricsOptions mo;
  mo.console = false;
  for (const auto& l : c.get_string_list("trainer.logger"))
    if (l == "console") mo.console = true;
  mo.jsonl_path = o.ckpt_root + "/metrics.jsonl";
  mo.tensorboard_dir = o.ckpt_root + "/tensorboard";
  fs::create_directories(o.ckpt_root);
  int64_t resume_step = -1;
  if (o.resume_mode == "auto") {
    auto latest = train::latest_checkpoint_step(o.ckpt_root);
    if (latest && latest->has_value()) resume_step = **latest;
  } else if (o.resume_mode == "resume_path" && !o.resume_from_path.empty()) {
    auto s = train::checkpoint_step_of(o.resume_from_path);
    if (s) resume_step = *s;
  }
  // Only world rank 0 logs (every rank computes the same metrics).
  std::unique_ptr<train::MetricsLogger> logger;
  if (leader) {
    auto l = train::MetricsLogger::open(mo, resume_step);
    if (!l) KS_FAIL(l.status().message());
    logger = std::move(l).value();
  }

  if (leader)
    std::fprintf(stderr,
               "train: %s on %s (%lld params); %lld steps of %lld prompts x %lld responses; rewards: %s\n",
               rl::adv_estimator_name(o.adv_estimator), model_dir.c_str(), (long long)actor.num_parameters(),
               (long long)o.total_steps, (long long)o.train_batch_size, (long long)o.n, (*rm)->describe().c_str());
  const bool val_only = c.get_bool("trainer.val_only");
  rl::RlTrainer trainer(actor, std::move(ref), to_prompts(*train_rows), to_prompts(val_rows), std::move(source), **rm,
                        [&tok](const std::vector<int32_t>& ids) { return tok.tokenizer().decode(ids, true); }, o,
                        logger.get(), std::move(critic));
  if (val_only) {
    auto v = trainer.validate();
    if (logger) logger->log(0, v);
    return 0;
  }
  trainer.fit().throw_if_error();
  if (!leader) return 0;

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::fprintf(stderr, "\ntrain: done, %lld steps, wall time %s\n", (long long)trainer.global_step(),
               train::ProgressBar::format_duration(wall).c_str());
  for (const auto& [k, v] : trainer.last_validation()) {
    if (k.rfind("val-core/", 0) != 0) continue;
    auto f = trainer.first_validation().find(k);
    if (f != trainer.first_validation().end() && &trainer.first_validation() != &trainer.last_validation())
      std::fprintf(stderr, "  %s: %.4f -> %.4f (%+.1f points)\n", k.c_str(), f->second, v, 100 * (v - f->second));
    else
      std::fprintf(stderr, "  %s: %.4f\n", k.c_str(), v);
  }
  std::fprintf(stderr, "  checkpoints: %s\n", o.ckpt_root.c_str());
  if (!mo.jsonl_path.empty()) std::fprintf(stderr, "  metrics: %s\n", mo.jsonl_path.c_str());
  if (!mo.tensorboard_dir.empty()) std::fprintf(stderr, "  tensorboard: %s\n", mo.tensorboard_dir.c_str());
  return 0;
}

}  // namespace kestrel::cli
