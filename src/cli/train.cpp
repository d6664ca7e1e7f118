// kestrel train: RL post-training (GRPO / RLOO / REINFORCE++) with verl's
// ppo_trainer keys through the config layer.
//
// Without --config and without data.train_files, a built-in run layer
// (kBuiltinRun below) comes first: the built-in `arith` task, the tiny
// built-in policy warm-started by SFT (trained once with `kestrel sft`
// settings and cached, see warm_start_dir) and GRPO settings sized for a
// 2-core CPU. Command-line overrides apply on top. A verl script always names
// its data, and then gets verl's defaults, as `python3 -m verl.trainer.main_ppo` does.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "backend/cpu/gemm.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/loader_source.h"
#include "cli/options.h"
#include "comm/device_group.h"
#include "comm/nodes.h"
#include "comm/world.h"
#include "config/config.h"
#include "core/files.h"
#include "core/parallel_for.h"
#include "data/arith.h"
#include "data/chat_tokenizer.h"
#include "data/config_options.h"
#include "rollout/engine.h"
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
    "critic.megatron.dtype=float32",
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
    // ~0.4 s a step on 2 cores: the 10-minute budget (validations included)
    // ends the run, after ~1400 steps; docs/benchmarks.md has the curve.
    "trainer.total_training_steps=2000",
    "trainer.time_budget_s=590",  // + ~5 s of start-up: within 10 minutes
    "trainer.test_freq=50",
    "trainer.save_freq=100",
    "trainer.val_before_train=true",
};

}  // namespace

const std::vector<std::string>& builtin_train_layer() {
  static const std::vector<std::string> layer(std::begin(kBuiltinRun), std::end(kBuiltinRun));
  return layer;
}

std::vector<std::string> train_first_layer(const std::vector<std::string>& args, const char* command) {
  auto lo = config::options_from_args(args);
  if (!lo) KS_FAIL(command, ": ", lo.status().message());
  const bool names_data = std::any_of(lo->overrides.begin(), lo->overrides.end(), [](const std::string& o) {
    const size_t b = o.find_first_not_of('+');
    return b != std::string::npos && o.compare(b, 17, "data.train_files=") == 0;
  });
  if (!lo->config_files.empty() || names_data) return {};
  return builtin_train_layer();
}

namespace {

std::string help_text() {
  std::string s =
      "usage: kestrel train [--config FILE.yaml] [key=value ...]\n\n"
      "RL post-training with verl's ppo_trainer keys ('kestrel config docs' lists them).\n"
      "Without --config and data.train_files the built-in run comes first (arith task, SFT-warm-started\n"
      "tiny policy, GRPO); a command naming its data (as verl scripts do) gets verl's defaults:\n";
  for (const char* o : kBuiltinRun) s += std::string("  ") + o + "\n";
  s += "\nbuiltin:arith as a data file is the built-in task; builtin:tiny|small as model path a random-init\n"
       "model (builtin:tiny-qwen3-moe and builtin:tiny-deepseek-v3: random-init mixture-of-experts models,\n"
       "the second with latent attention); builtin:arith-sft the tiny model after SFT on arith (trained once and cached under\n"
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
// (configs/sft_arith.yaml's settings, ~4 minutes on 2 cores), run once. It
// checkpoints every 100 steps and resumes, so an interrupted warm start
// continues where it stopped (bit for bit) instead of starting over.
std::string warm_start_path() { return cache_root() + "/arith_sft_tiny/hf_model"; }

std::string warm_start_dir() {
  const std::string root = cache_root() + "/arith_sft_tiny";
  const std::string out = warm_start_path();
  if (fs::exists(out + "/model.safetensors")) return out;
  std::fprintf(stderr, "train: no SFT warm start at %s; running kestrel sft first (once; resumable)\n", out.c_str());
  const std::vector<std::string> sft = {
      "data.train_files=builtin:arith", "data.val_files=null", "data.max_length=256", "data.train_batch_size=16",
      "data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=4096", "model.partial_pretrain=builtin:tiny",
      "optim.lr=3e-3", "optim.betas=[0.9,0.95]", "optim.weight_decay=0.01", "optim.warmup_steps_ratio=0.03",
      "optim.clip_grad=1.0", "optim.lr_scheduler=cosine", "optim.min_lr_ratio=0.1",
      "trainer.default_local_dir=" + root, "trainer.total_training_steps=1000", "trainer.logger=[file]",
      "trainer.save_freq=100", "trainer.resume_mode=auto", "trainer.export_dir=" + out};
  if (int rc = cmd_sft(sft); rc != 0) KS_FAIL("train: the SFT warm start failed (exit ", rc, ")");
  return out;
}

}  // namespace

std::string resolve_model_folder(const std::string& spec) {
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

namespace {

std::string resolve_model(const std::string& spec) { return resolve_model_folder(spec); }

std::vector<rl::RlPrompt> to_prompts(const std::vector<data::RlSample>& rows) {
  std::vector<rl::RlPrompt> out;
  for (const auto& r : rows) out.push_back({r.prompt_ids, r.data_source, r.ground_truth, r.extra_info});
  return out;
}

// The PPO critic (critic.*): its value model starts from critic.model.path,
// an actor folder (lm_head dropped, a seeded score head) or a critic checkpoint.
std::unique_ptr<rl::Critic> make_critic(const config::Config& c, const TrainInputs& in, const rl::RlOptions& o,
                                        const std::string& actor_dir, const model::ModelOptions& actor_opts) {
  if (!in.critic) return nullptr;
  const std::string dir = in.critic_model_path == in.model_path ? actor_dir : resolve_model(in.critic_model_path);
  model::ModelOptions mo = actor_opts;
  mo.value_head = true;
  mo.value_head_seed = in.critic_seed;
  mo.dtype = in.critic_dtype;
  mo.recompute = in.critic_recompute;
  {
    auto mc = io::load_model_config(dir);
    if (!mc) KS_FAIL(c.origin("critic.model.path"), ": ", mc.status().message());
    mo.moe = moe_train_options(in.critic_moe, *mc, dir + " (critic.model.path)");
  }
  if (in.critic_pipeline.pp > 1) {  // the same grid as the actor (equal pp); its own layer split
    auto mc = io::load_model_config(dir);
    if (!mc) KS_FAIL(c.origin("critic.model.path"), ": ", mc.status().message());
    check_num_layers(c, in, mc->num_hidden_layers);
    auto chunks = parallel::pipeline_chunks(in.critic_pipeline, mc->num_hidden_layers);
    if (!chunks) KS_FAIL("kestrel train: critic: ", chunks.status().message());
    model::set_pipeline_stage(mo, (*chunks)[size_t(actor_opts.parallel.pp->rank())]);
    mo.parallel.vpp_microbatch_group = in.critic_pipeline.microbatch_group_size;
  }
  auto m = model::CausalLM::load(dir, mo);
  if (!m) KS_FAIL(c.origin("critic.model.path"), ": ", m.status().message());
  return std::make_unique<rl::Critic>(std::move(m).value(), critic_options(c, o));
}

// The training and validation rows (data.train_files / val_files).
std::pair<std::vector<data::RlSample>, std::vector<data::RlSample>> load_rows(const TrainInputs& in,
                                                                              const data::ChatTokenizer& tok,
                                                                              bool leader) {
  data::LoadStats tst, vst;
  auto train_rows = data::load_rl_dataset(resolve_files(in.train_files, true), tok, in.train_data, &tst);
  if (!train_rows) KS_FAIL(train_rows.status().message());
  std::vector<data::RlSample> val_rows;
  if (!in.val_files.empty()) {
    auto v = data::load_rl_dataset(resolve_files(in.val_files, false), tok, in.val_data, &vst);
    if (!v) KS_FAIL(v.status().message());
    val_rows = std::move(v).value();
  }
  if (leader) std::fprintf(stderr, "train: train %s; val %s\n", tst.summary().c_str(), vst.summary().c_str());
  return {std::move(train_rows).value(), std::move(val_rows)};
}

}  // namespace

std::string builtin_budget_note(int64_t steps, int64_t steps_run, int64_t total_steps, double budget_s, double fit_s) {
  // The built-in run is sized for its 10-minute budget: docs/benchmarks.md's
  // runs gain +16 to +23 points at 1000-2000 steps (0.3-0.6 s a step). Fewer
  // steps than this in that budget is a machine too slow for it, said as such.
  constexpr int64_t kSizedForSteps = 1000;
  constexpr double kBuiltinBudgetS = 590;
  // A resumed run's earlier steps ran in another process: judge only a run from step 0.
  if (budget_s < kBuiltinBudgetS || steps_run != steps || steps <= 0 || steps >= total_steps || steps >= kSizedForSteps)
    return "";
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "note: this machine ran %.2f s a step, so the %.0f s budget held %lld steps; the built-in run is "
                "sized for >= %lld (<= %.2f s a step), where it gains 15+ points (docs/benchmarks.md). The gain "
                "below is that of a %lld-step run; trainer.time_budget_s=0 runs all %lld steps.",
                fit_s / double(steps), budget_s, (long long)steps, (long long)kSizedForSteps,
                budget_s / double(kSizedForSteps), (long long)steps, (long long)total_steps);
  return buf;
}

namespace {

// The end-of-run summary: validation scores first -> last, where the outputs are.
void print_summary(const rl::RlTrainer& trainer, double wall, double fit_s, int64_t steps_run, bool builtin_run,
                   const rl::RlOptions& o, const std::string& ckpt_root, const train::MetricsOptions& mo) {
  const int64_t steps = trainer.global_step();
  std::fprintf(stderr, "\ntrain: done, %lld steps, wall time %s\n", (long long)steps,
               train::ProgressBar::format_duration(wall).c_str());
  if (const std::string note =
          builtin_run ? builtin_budget_note(steps, steps_run, o.total_steps, o.time_budget_s, fit_s) : std::string();
      !note.empty())
    std::fprintf(stderr, "  %s\n", note.c_str());
  for (const auto& [k, v] : trainer.last_validation()) {
    if (k.rfind("val-core/", 0) != 0) continue;
    auto f = trainer.first_validation().find(k);
    if (f != trainer.first_validation().end() && &trainer.first_validation() != &trainer.last_validation())
      std::fprintf(stderr, "  %s: %.4f -> %.4f (%+.1f points)\n", k.c_str(), f->second, v, 100 * (v - f->second));
    else
      std::fprintf(stderr, "  %s: %.4f\n", k.c_str(), v);
  }
  std::fprintf(stderr, "  gemm: %s\n", cpu::gemm_summary().c_str());
  std::fprintf(stderr, "  checkpoints: %s\n", ckpt_root.c_str());
  if (!mo.jsonl_path.empty()) std::fprintf(stderr, "  metrics: %s\n", mo.jsonl_path.c_str());
  if (!mo.tensorboard_dir.empty()) std::fprintf(stderr, "  tensorboard: %s\n", mo.tensorboard_dir.c_str());
}

// The metrics logger; a resumed run keeps the metrics up to its checkpoint.
std::unique_ptr<train::MetricsLogger> open_logger(const rl::RlOptions& o, const train::MetricsOptions& mo) {
  int64_t resume_step = -1;
  if (o.resume_mode == "auto") {
    auto latest = train::latest_checkpoint_step(o.ckpt_root);
    if (latest && latest->has_value()) resume_step = **latest;
  } else if (o.resume_mode == "resume_path" && !o.resume_from_path.empty()) {
    auto s = train::checkpoint_step_of(o.resume_from_path);
    if (s) resume_step = *s;
  }
  auto l = train::MetricsLogger::open(mo, resume_step);
  if (!l) KS_FAIL(l.status().message());
  return std::move(l).value();
}

// Under mpirun: the process grid (tp from the actor, dp = world / tp), the
// model's share of it and the trainer's groups (rl/distributed.h).
std::unique_ptr<parallel::ProcessGrid> setup_parallel(const comm::World& world, const TrainInputs& in,
                                                      const std::string& model_dir, model::ModelOptions& mopt,
                                                      rl::RlParallel& par) {
  auto mc = io::load_model_config(model_dir);
  if (!mc) KS_FAIL(mc.status().message());
  parallel::ParallelDims dims = parallel::dims_for(int(in.tp), in.sequence_parallel);
  dims.pp = in.actor_pipeline.pp;
  dims.cp = int(in.cp.cp);
  dims.ep = int(in.ep.ep);
  dims.etp = int(in.ep.etp);
  // On the device the grid's groups carry device buffers over NCCL (and host ones over MPI).
  auto g = parallel::make_process_grid(world, dims, model::model_facts(*mc, dims.pp > 1), mopt.device);
  if (!g) KS_FAIL("kestrel train: ", g.status().message());
  std::unique_ptr<parallel::ProcessGrid> grid = std::move(g).value();
  mopt.parallel = model::model_parallel_for(*grid);
  mopt.parallel.etp = grid->group(parallel::GroupKind::Etp);  // tp's when of tp's size (CausalLM)
  model::set_context_parallel(mopt.parallel, world, *grid, in.cp.algo, int(in.cp.ulysses_degree));
  mopt.parallel.vpp_microbatch_group = in.actor_pipeline.microbatch_group_size;
  if (dims.pp > 1) {  // this rank's stage: its chunks of the actor's layers (the reference holds the same)
    auto chunks = parallel::pipeline_chunks(in.actor_pipeline, mc->num_hidden_layers);
    if (!chunks) KS_FAIL("kestrel train: ", chunks.status().message());
    model::set_pipeline_stage(mopt, (*chunks)[size_t(grid->coords().pp)]);
  }
  par.world = grid->world();
  par.dp = grid->group(parallel::GroupKind::Dp);
  if (dims.cp > 1) par.dp_cp = grid->group(parallel::GroupKind::DpCp);
  // The experts' own data-parallel group: under ep, or when etp keeps them apart from tp.
  if (dims.ep > 1 || dims.etp != dims.tp) par.expert_dp = grid->group(parallel::GroupKind::Edp);
  par.rollout_ep = in.ep.rollout_ep;
  par.distributed_optimizer = in.distributed_optimizer;
  if (in.rollout_tp != in.tp)
    par.rollout_tp = grid->adopt(world.split(world.rank() / int(in.rollout_tp), world.rank(), "rollout_tp"));
  return grid;
}

// metrics.jsonl and TensorBoard events always go next to the checkpoints
// (the config layer accepts only trainer.logger=[console] so far).
train::MetricsOptions metrics_options(const TrainInputs& in, const std::string& ckpt_root) {
  train::MetricsOptions mo;
  mo.console = in.console_logger;
  mo.console_full = in.console_full;
  mo.jsonl_path = ckpt_root + "/metrics.jsonl";
  mo.tensorboard_dir = ckpt_root + "/tensorboard";
  fs::create_directories(ckpt_root);
  return mo;
}

// config.json of the actor, checked against the job's keys:
// override_transformer_config.num_layers (Megatron's total, noop slots
// included) and the expert-parallel layout.
io::ModelConfig checked_model_config(const config::Config& c, const TrainInputs& in, const std::string& model_dir) {
  auto mc = io::load_model_config(model_dir);
  if (!mc) KS_FAIL(mc.status().message());
  check_num_layers(c, in, mc->num_hidden_layers);
  check_expert_parallel_model(c, in.ep, *mc, model_dir);
  return *mc;
}

// The memory a rank plans with: the GPU's, or on the CPU this process's
// share of RAM.
int64_t rank_memory_bytes(Device device) {
  auto mem = device == Device::CPU ? rollout::device_memory_bytes(local_ranks()) : device_total_memory();
  if (!mem) KS_FAIL(mem.status().message());
  return *mem;
}

// A step takes `batch` prompts (the generation batch when it differs).
void check_batch_fits(const config::Config& c, int64_t batch, size_t train_prompts) {
  if (int64_t(train_prompts) >= batch) return;
  KS_FAIL(c.get_int("data.gen_batch_size") == c.get_int("data.train_batch_size")
              ? "data.train_batch_size=" + std::to_string(batch)
              : "data.gen_batch_size=" + std::to_string(batch) + " (the generation batch)",
          " but the training set has only ", train_prompts, " prompts: lower it or add data");
}

// The processes that train: all of them, less the disaggregated rollout
// ranks (rollout.nnodes x rollout.n_gpus_per_node, the job's last ranks),
// with the layouts those ranks do not support yet refused by key.
int trainer_ranks(const config::Config& c, const TrainInputs& in, int world_size) {
  const int train_ranks = world_size - int(std::min<int64_t>(in.rollout_ranks, world_size));
  if (in.rollout_ranks <= 0) return train_ranks;
  if (train_ranks < 1)
    KS_FAIL(c.origin("rollout.nnodes"), ": rollout.nnodes x rollout.n_gpus_per_node = ", in.rollout_ranks,
            " rollout processes leave no trainer among the ", world_size, " processes: launch with mpirun -np ",
            in.rollout_ranks + 1, " or more");
  if (in.tp > 1 || in.actor_pipeline.pp > 1 || in.cp.cp > 1 || in.ep.ep > 1)
    KS_FAIL(c.origin("rollout.nnodes"), ": not supported yet: a disaggregated trainer with tensor, pipeline, "
            "context or expert parallelism (its ranks train by data parallelism so far; each rollout rank holds a "
            "whole copy)");
  if (in.rollout_tp > 1)
    KS_FAIL(c.origin("actor_rollout_ref.rollout.tensor_model_parallel_size"), ": not supported yet: "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=", in.rollout_tp, " on disaggregated rollout ranks "
            "(each holds a whole copy of the policy); set it to 1");
  if (in.val_only)
    KS_FAIL(c.origin("trainer.val_only"), ": not supported yet: trainer.val_only with rollout.nnodes (disaggregated "
            "rollout ranks); validate a checkpoint with the colocated layout");
  return train_ranks;
}

// The built-in run says up front what it will do and for how long.
void announce_builtin_run(const config::Config& c, const TrainInputs& in) {
  const bool warm = in.model_path == "builtin:arith-sft";
  const bool cached = warm && fs::exists(warm_start_path() + "/model.safetensors");
  const double budget = c.get_float_or("trainer.time_budget_s", 0.0);
  std::string plan = "train: the built-in run: ";
  if (warm)
    plan += cached ? "the SFT warm start of the tiny model is cached (" + warm_start_path() + "); "
                   : "first an SFT warm start of the tiny model on arith (1000 steps, about 4 minutes on 2 cores, "
                     "once: cached and resumable), then ";
  plan += "GRPO on arith for up to " + std::to_string(c.get_int("trainer.total_training_steps")) + " steps" +
          (budget > 0 ? " or " + std::to_string(int64_t(budget)) + " s (trainer.time_budget_s), whichever comes first"
                      : "") +
          ", validating every " + std::to_string(c.get_int("trainer.test_freq")) + " steps\n";
  std::fputs(plan.c_str(), stderr);
}

// The rollout reads the actor's weights in place: its share of the memory
// (gpu_memory_utilization) holds those weights and the KV cache, which gets
// what is left of that share.
int64_t rollout_kv_cache_bytes(const config::Config& c, const TrainInputs& in, const model::CausalLM& actor,
                               int64_t memory) {
  // Under pipeline parallelism the rollout holds a whole-model copy
  // (rollout::RolloutWeights), not this rank's stage: its bytes from config.json.
  const int64_t rollout_weight_bytes =
      actor.is_whole_model() && actor.ep().size() == in.ep.rollout_ep  // else the rollout copy holds every expert
          ? rollout::weight_bytes(actor)
          : actor.config().num_parameters() * int64_t(dtype_size(actor.dtype())) / actor.tp().size() +
                rollout::buffer_bytes(actor.config());
  auto kv = rollout::kv_cache_bytes_for(in.gpu_memory_utilization, memory, rollout_weight_bytes);
  if (!kv) KS_FAIL(c.origin("actor_rollout_ref.rollout.gpu_memory_utilization"), ": ", kv.status().message());
  return *kv;
}

// The reward manager, checked against every row's data_source.
Result<std::unique_ptr<rl::RewardManager>> make_rewards(const TrainInputs& in, const std::vector<data::RlSample>& train,
                                                        const std::vector<data::RlSample>& val) {
  auto rm = rl::RewardManager::create(in.reward);
  if (!rm) KS_FAIL(rm.status().message());
  {
    std::vector<std::string> srcs;
    for (const auto& r : train) srcs.push_back(r.data_source);
    for (const auto& r : val) srcs.push_back(r.data_source);
    (*rm)->validate_data_sources(srcs).throw_if_error();
  }
  return rm;
}

}  // namespace

// A disaggregated rollout rank (rl/disaggregated.h): generates for the
// trainer on world rank 0 until it says stop; its model is a whole copy.
int run_rollout_process(const rl::RlOptions& o, const rl::DisaggregatedLayout& layout, model::CausalLM& model,
                        const comm::World& world, std::shared_ptr<comm::ProcessGroup> rollout_group,
                        const std::vector<data::RlSample>& rows, const std::vector<data::RlSample>& val_rows,
                        std::unique_ptr<train::BatchSource> source) {
  KS_CHECK(o.ref_router_replay != rl::RouterReplay::R3 && o.actor_router_replay != rl::RouterReplay::R3,
           "not supported yet: router replay R3 with disaggregated rollout ranks");
  std::vector<std::vector<int32_t>> prompts;
  prompts.reserve(rows.size());
  for (const auto& r : rows) prompts.push_back(r.prompt_ids);
  std::vector<std::vector<int32_t>> val_prompts;
  for (const auto& r : val_rows) val_prompts.push_back(r.prompt_ids);
  rl::RolloutRankInputs ri;
  ri.world = world.group().get();
  ri.layout = layout;
  ri.model = &model;
  ri.rollout = rl::split_options(o).rollout;
  ri.parallel.world = std::move(rollout_group);
  ri.async = rl::async_rollout_options(o);
  ri.source = source.get();
  ri.prompts = &prompts;
  ri.val_prompts = &val_prompts;
  ri.total_steps = o.total_steps;
  ri.stream_responses = o.launch_reward_fn_async || o.stream_log_probs;
  rl::run_rollout_rank(ri).throw_if_error();
  return 0;
}

int cmd_train(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") {
      std::printf("%s", help_text().c_str());
      return 0;
    }
  const auto t_start = std::chrono::steady_clock::now();
  check_omp_num_threads("train");  // before any parallel region
  const std::vector<std::string> first = train_first_layer(argv, "kestrel train");
  const config::Config c = load_command_config(config::ppo_schema(), argv, first);
  const TrainInputs in = train_inputs(c);

  // Under mpirun/srun: tp from the actor's megatron config, dp = world / tp,
  // the rollout's tp from rollout.tensor_model_parallel_size (rl/distributed.h).
  const comm::World* world = comm::World::current();
  const int world_size = world ? world->size() : 1, world_rank = world ? world->rank() : 0;
  const bool leader = world_rank == 0;
  // Disaggregated (rollout.nnodes x rollout.n_gpus_per_node): the last ranks only generate.
  const bool disaggregated = in.rollout_ranks > 0;
  const int train_ranks = trainer_ranks(c, in, world_size);
  const bool rollout_rank = disaggregated && world_rank >= train_ranks;
  // Every rank joins its role's group (collective over the job).
  std::shared_ptr<comm::ProcessGroup> role_group =
      disaggregated ? world->split(rollout_rank ? 1 : 0, world_rank, rollout_rank ? "rollout" : "trainer") : nullptr;
  check_launch(c, train_ranks);
  check_layout_divides(c, in, train_ranks);
  // The start-up window (the GEMM choice, rank 0's built-in caches) waits
  // untimed; verl's timeout is armed after it.
  std::optional<comm::UntimedCollectives> start_up_window(std::in_place);
  if (in.deterministic) set_deterministic(true);  // before the GEMM library is chosen (it pins one)
  if (leader && !first.empty()) announce_builtin_run(c, in);
  // The GEMM library is chosen now, before the rollout and trainer start
  // threads (loading OpenBLAS may set OPENBLAS_CORETYPE for a moment; the
  // one-time micro-benchmark runs here): "GEMM: ..." on stderr, and a bad
  // KESTREL_BLAS stops the run before any work with its message.
  init_gemm_for_job();
  // Rank 0 materialises the built-in caches (task files, SFT warm start) first.
  if (world_size > 1 && !leader) world->group()->barrier();
  // The data files and their columns before any model: a wrong path or
  // column fails at once, not after a warm start or a model load.
  data::check_rl_files(resolve_files(in.train_files, true), in.train_data).throw_if_error();
  data::check_rl_files(resolve_files(in.val_files, false), in.val_data).throw_if_error();
  const std::string model_dir = resolve_model(in.model_path);
  const io::ModelConfig actor_cfg = checked_model_config(c, in, model_dir);
  // MoE router options of the actor and the reference model against config.json (the critic's: make_critic).
  const model::MoeTrainOptions actor_moe = moe_train_options(in.actor_moe, actor_cfg, model_dir);
  const model::MoeTrainOptions ref_moe = moe_train_options(in.ref_moe, actor_cfg, model_dir);
  if (world_size > 1 && leader) world->group()->barrier();
  start_up_window.reset();
  // verl's NCCL timeout bounds every collective from here on (MPI): a stopped
  // or lost rank becomes a report naming it instead of a hang (comm/mpi/health.h).
  comm::World::set_collective_timeout(in.collective_timeout_s);
  // The actor, and with it the reference, the critic and the rollout engine (they follow the actor's device).
  const Device device = trainer_device(c, world_size, world_size > 1 ? comm::local_rank(*world) : 0);
  check_offload_on_device(c, device);
  const int64_t memory = rank_memory_bytes(device);
  // The planned memory of a step must fit before anything loads (cli/plan.cpp, rl/memory_plan.h).
  check_layout_fits(c, model_dir, train_ranks, memory, device).throw_if_error();
  const std::string tok_dir = in.tokenizer_path.empty() ? model_dir : in.tokenizer_path;
  auto tok_r = data::ChatTokenizer::from_dir(tok_dir);
  if (!tok_r) KS_FAIL(tok_r.status().message());
  const data::ChatTokenizer& tok = *tok_r;

  const auto [train_rows_v, val_rows] = load_rows(in, tok, leader);
  const std::vector<data::RlSample>* train_rows = &train_rows_v;

  auto rm = make_rewards(in, *train_rows, val_rows);

  model::ModelOptions mopt;
  mopt.dtype = in.dtype;
  mopt.device = device;
  mopt.make_vocab_size_divisible_by = in.vocab_divisible_by;
  mopt.recompute = in.recompute;  // the actor's training forward; scoring and the rollout ignore it
  mopt.moe = actor_moe;
  std::unique_ptr<parallel::ProcessGrid> grid;
  rl::RlParallel par;
  if (disaggregated) {  // the trainer's ranks train by data parallelism among themselves
    par.world = mopt.device == Device::CPU ? role_group : comm::device_group(role_group);
    par.dp = par.world;
    par.distributed_optimizer = in.distributed_optimizer;
  } else if (world_size > 1) {
    grid = setup_parallel(*world, in, model_dir, mopt, par);
    model::set_expert_dispatch(mopt.parallel, *world, actor_moe);  // the hierarchical all-to-all's node groups
  }
  auto loaded = model::CausalLM::load(model_dir, mopt);
  if (!loaded) KS_FAIL(loaded.status().message());
  model::CausalLM& actor = **loaded;

  const int64_t batch = in.train_batch_size;
  check_batch_fits(c, batch, train_rows->size());
  auto source = std::make_unique<LoaderSource>(int64_t(train_rows->size()), batch, in.shuffle, in.data_seed);
  rl::RlOptions o = rl_options(c, source->batches_per_epoch());
  o.engine.kv_cache_bytes = rollout_kv_cache_bytes(c, in, actor, memory);
  o.progress = leader && std::getenv("KESTREL_NO_PROGRESS") == nullptr;
  o.parallel = par;
  if (disaggregated) {
    rl::DisaggregatedLayout layout;
    for (int r = train_ranks; r < world_size; ++r) layout.rollout.push_back(r);
    layout.bucket_bytes = in.weight_bucket_bytes;
    if (rollout_rank)
      return run_rollout_process(o, layout, actor, *world, role_group, *train_rows, val_rows, std::move(source));
    o.disaggregated = layout;
    o.job = world->group();
  }
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    if (fs::exists(tok_dir + "/" + f)) o.model_extra_files[f] = read_file(tok_dir + "/" + f).value();

  std::unique_ptr<model::CausalLM> ref;
  if (o.loss.use_kl_loss || o.use_kl_in_reward) {
    model::ModelOptions ropt = mopt;
    ropt.moe = ref_moe;
    auto r = model::CausalLM::load(model_dir, ropt);  // the frozen initial policy
    if (!r) KS_FAIL(r.status().message());
    ref = std::move(r).value();
  }

  std::unique_ptr<rl::Critic> critic = make_critic(c, in, o, model_dir, mopt);

  const train::MetricsOptions mo = metrics_options(in, o.ckpt_root);
  std::unique_ptr<train::MetricsLogger> logger = leader ? open_logger(o, mo) : nullptr;

  if (leader)
    std::fprintf(stderr,
               "train: %s on %s (%lld params, on %s); %lld steps of %lld prompts x %lld responses; rewards: %s\n",
               rl::adv_estimator_name(o.adv_estimator), model_dir.c_str(), (long long)actor.num_parameters(),
               device_name(actor.device()),
               (long long)o.total_steps, (long long)o.train_batch_size, (long long)o.n, (*rm)->describe().c_str());
  if (leader) write_run_info_file(o.ckpt_root, "kestrel train", world_size);
  const bool val_only = in.val_only;
  rl::RlTrainer trainer(actor, std::move(ref), to_prompts(*train_rows), to_prompts(val_rows), std::move(source), **rm,
                        [&tok](const std::vector<int32_t>& ids) { return tok.tokenizer().decode(ids, true); }, o,
                        logger.get(), std::move(critic));
  if (val_only) {
    auto v = trainer.validate();
    if (logger) logger->log(0, v);
    return 0;
  }
  const auto t_fit = std::chrono::steady_clock::now();
  trainer.fit().throw_if_error();
  if (!leader) return 0;

  const auto t_end = std::chrono::steady_clock::now();
  const double wall = std::chrono::duration<double>(t_end - t_start).count();
  print_summary(trainer, wall, std::chrono::duration<double>(t_end - t_fit).count(), trainer.global_step() - trainer.fit_start_step(),
                !first.empty(), o, o.ckpt_root, mo);
  write_run_report_file(o.ckpt_root, "kestrel train");
  return 0;
}

}  // namespace kestrel::cli
