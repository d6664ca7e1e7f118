// kestrel train's option builders: ppo_trainer keys -> TrainInputs,
// rl::RlOptions, rl::CriticOptions (see options.h).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cli/options.h"
#include "data/config_options.h"

namespace kestrel::cli {

namespace {

const std::string A = "actor_rollout_ref.actor.", R = "actor_rollout_ref.rollout.";

void reject_unbuilt(const config::Config& c) {
  auto fail_if = [&](bool bad, const std::string& what) {
    if (bad) KS_FAIL("not supported yet: ", what);
  };
  fail_if(c.get_string("algorithm.kl_penalty") == "full", "algorithm.kl_penalty=full (use kl, abs, mse or low_var_kl)");
  const std::string lm = c.get_string(A + "policy_loss.loss_mode");
  fail_if(lm != "vanilla", A + "policy_loss.loss_mode=" + lm);
  fail_if(c.get_int(R + "data_parallel_size") != 1,
          R + "data_parallel_size (the rollout's data parallelism is world size / rollout tensor_model_parallel_size)");
}

std::vector<std::string> list_or_empty(const config::Config& c, const std::string& key) {
  return c.is_null(key) ? std::vector<std::string>{} : c.get_string_list(key);
}

// The optimizer state in host memory (train::EngineOptions::optimizer_offload_pieces):
// MindSpeed's swap optimizer in swap_optimizer_times pieces, else Megatron's or
// verl FSDP's optimizer_offload in one; it acts for a model on the GPU only.
// fsdp: the owner's fsdp_config scope ("critic.model.fsdp_config." for the critic).
int64_t optimizer_offload_pieces(const config::Config& c, const std::string& P, const std::string& fsdp) {
  const std::string ot = P + "megatron.override_transformer_config.";
  const int64_t times = c.get_int(ot + "swap_optimizer_times");
  if (c.get_bool(ot + "swap_optimizer")) return times;
  return c.get_bool(P + "megatron.optimizer_offload") || c.get_bool(fsdp + "optimizer_offload") ? 1 : 0;
}

// param_offload / grad_offload of a model: Megatron's keys, or verl FSDP's
// param_offload, which offloads the whole module (parameters and gradients).
struct PhaseOffload {
  bool params = false, grads = false;
};
PhaseOffload phase_offload(const config::Config& c, const std::string& P, const std::string& fsdp) {
  const bool fsdp_module = c.get_bool(fsdp + "param_offload");
  return {c.get_bool(P + "megatron.param_offload") || fsdp_module, c.get_bool(P + "megatron.grad_offload") || fsdp_module};
}

optim::AdamWConfig adamw_config(const config::Config& c, const std::string& P) {
  const auto betas = c.get_float_list(P + "optim.betas");
  if (betas.size() != 2) KS_FAIL(c.origin(P + "optim.betas"), ": ", P, "optim.betas must hold two numbers");
  return {betas[0], betas[1], c.get_float(P + "optim.eps"), c.get_float(P + "optim.weight_decay")};
}

// clip_ratio_low / clip_ratio_high: their own value, or actor.clip_ratio when
// null (verl's core_algos: `clip_ratio_low if not None else clip_ratio`).
double clip_ratio_side(const config::Config& c, const std::string& side) {
  const double base = c.get_float(A + "clip_ratio");
  return c.get_float_or(A + side, base);
}

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// <meg>.pipeline_model_parallel_size, virtual_pipeline_model_parallel_size and the override_transformer_config
// layout keys, as given (unchecked); *num_layers gets override_transformer_config.num_layers (-1 when null).
// The layer layout alone (what scoring needs too): pp, vpp, the uneven split, noop layers.
parallel::PipelineSpec read_layer_layout(const config::Config& c, const std::string& meg) {
  const std::string K = meg + ".override_transformer_config.";
  parallel::PipelineSpec p;
  p.pp = int(c.get_int(meg + ".pipeline_model_parallel_size"));
  p.vpp = int(c.get_int_or(meg + ".virtual_pipeline_model_parallel_size", 1));
  p.first_stage_layers = c.get_int_or(K + "num_layers_in_first_pipeline_stage", -1);
  p.last_stage_layers = c.get_int_or(K + "num_layers_in_last_pipeline_stage", -1);
  if (!c.is_null(K + "noop_layers")) p.noop_layers = c.get_int_list(K + "noop_layers");
  return p;
}

parallel::PipelineSpec read_pipeline(const config::Config& c, const std::string& meg, int64_t* num_layers) {
  const std::string K = meg + ".override_transformer_config.";
  parallel::PipelineSpec p = read_layer_layout(c, meg);
  p.microbatch_group_size = c.get_int_or(K + "microbatch_group_size_per_vp_stage", 0);
  *num_layers = c.get_int_or(K + "num_layers", -1);
  return p;
}

// What the config alone decides (the ranges, pp and vpp >= 1, noop ids >= 0, the config layer has checked):
// interleaving needs two stages, and each noop slot is listed once. The split against the model's
// num_hidden_layers is parallel::pipeline_chunks's.
void check_pipeline(const config::Config& c, const std::string& meg, const parallel::PipelineSpec& p) {
  const std::string pp_key = meg + ".pipeline_model_parallel_size", vpp_key = meg + ".virtual_pipeline_model_parallel_size";
  if (p.vpp > 1 && p.pp < 2)
    KS_FAIL(c.origin(vpp_key), ": ", vpp_key, "=", p.vpp, " interleaves pipeline stages and needs ", pp_key,
            " >= 2 (it is ", p.pp, ", from ", c.origin(pp_key), "); set ", vpp_key, "=null or ", pp_key, " >= 2");
  const std::string noop_key = meg + ".override_transformer_config.noop_layers";
  std::vector<int64_t> ids = p.noop_layers;
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0)
      KS_FAIL(c.origin(noop_key), ": ", noop_key, "=", list_text(p.noop_layers), " has ", ids[i],
              "; noop layer ids are slot indices >= 0");
    if (i > 0 && ids[i] == ids[i - 1])
      KS_FAIL(c.origin(noop_key), ": ", noop_key, "=", list_text(p.noop_layers), " lists slot ", ids[i],
              " twice; each noop layer id must appear once");
  }
}

// The reference model is the actor's copy on the actor's stages: its layout keys must equal the actor's.
void check_ref_pipeline(const config::Config& c, const parallel::PipelineSpec& actor, int64_t actor_num_layers,
                        const parallel::PipelineSpec& ref, int64_t ref_num_layers) {
  const std::string AM = "actor_rollout_ref.actor.megatron.", RM = "actor_rollout_ref.ref.megatron.",
                    OT = "override_transformer_config.";
  auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  auto differ = [&](bool bad, const std::string& key, const std::string& rv, const std::string& av) {
    if (bad)
      KS_FAIL("not supported yet: ", RM, key, "=", rv, " (from ", c.origin(RM + key), ") differs from ", AM, key, "=",
              av, ": the reference model is the actor's copy on its pipeline stages; leave ", RM, key,
              " unset (it follows the actor's) or set both alike");
  };
  auto num = [](int64_t v) { return v < 0 ? std::string("null") : std::to_string(v); };
  differ(ref.pp != actor.pp, "pipeline_model_parallel_size", num(ref.pp), num(actor.pp));
  differ(ref.vpp != actor.vpp, "virtual_pipeline_model_parallel_size", num(ref.vpp), num(actor.vpp));
  differ(ref.first_stage_layers != actor.first_stage_layers, OT + "num_layers_in_first_pipeline_stage",
         num(ref.first_stage_layers), num(actor.first_stage_layers));
  differ(ref.last_stage_layers != actor.last_stage_layers, OT + "num_layers_in_last_pipeline_stage",
         num(ref.last_stage_layers), num(actor.last_stage_layers));
  differ(sorted(ref.noop_layers) != sorted(actor.noop_layers), OT + "noop_layers", list_text(ref.noop_layers),
         list_text(actor.noop_layers));
  differ(ref.microbatch_group_size != actor.microbatch_group_size, OT + "microbatch_group_size_per_vp_stage",
         num(ref.microbatch_group_size > 0 ? ref.microbatch_group_size : -1),
         num(actor.microbatch_group_size > 0 ? actor.microbatch_group_size : -1));
  differ(ref_num_layers != actor_num_layers, OT + "num_layers", num(ref_num_layers), num(actor_num_layers));
}

}  // namespace

model::RecomputePolicy recompute_policy(const config::Config& c, const std::string& meg, const std::string& gc_key) {
  const std::string K = meg + ".override_transformer_config.";
  auto str = [&](const std::string& k) { return c.is_null(K + k) ? std::string() : c.get_string(K + k); };
  auto num = [&](const std::string& k) { return c.get_int_or(K + k, -1); };
  std::string gran = str("recompute_granularity"), method = str("recompute_method");
  int64_t n = num("recompute_num_layers");
  // verl FSDP's switch, when the Megatron keys leave recompute off: full/uniform/1.
  const bool gc = !gc_key.empty() && c.get_bool(gc_key);
  if (gc && gran.empty() && method.empty() && n < 0) {
    gran = "full";
    method = "uniform";
    n = 1;
  }
  auto r = model::make_recompute_policy(
      gran, method, n, c.get_string_list(K + "recompute_modules"), c.get_bool(K + "recompute_activation_function"),
      num("recompute_activation_function_num_layers"), c.get_bool(K + "recompute_norm"),
      num("recompute_norm_num_layers"), K);
  if (!r) {
    const std::string where = c.origin(K + "recompute_granularity");
    KS_FAIL(where == "default" && gc ? c.origin(gc_key) + ": " + gc_key + "=true: " : where + ": ",
            r.status().message());
  }
  return std::move(r).value();
}

DType parse_compute_dtype(const std::string& name, const std::string& key) {
  if (name == "float32" || name == "f32" || name == "fp32") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  KS_FAIL(key, ": compute dtype must be float32 (f32) or bfloat16 (bf16), got '", name, "'");
}

int64_t local_ranks() {
  for (const char* e : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(e); v && *v) {
      const long long n = std::atoll(v);
      if (n > 0) return n;
    }
  return 1;
}

namespace {

// The actor's context parallelism; the reference model and the critic run on its grid, so theirs must equal it.
void read_grid_cp(const config::Config& c, TrainInputs& in) {
  const std::string OT = ".megatron.override_transformer_config.";
  in.cp = read_context_parallel(c, A.substr(0, A.size() - 1) + OT,
                                {A + "ulysses_sequence_parallel_size", A + "fsdp_config.ulysses_sequence_parallel_size"});
  auto same = [&](const CpSettings& o) {
    return o.cp == in.cp.cp && (in.cp.cp == 1 || (o.algo == in.cp.algo && (in.cp.algo != parallel::CpAlgo::Hybrid ||
                                                                            o.ulysses_degree == in.cp.ulysses_degree)));
  };
  auto refuse = [&](const std::string& who, const CpSettings& o) {
    KS_FAIL("not supported yet: ", who, "'s context parallelism (", o.size_key, "=", o.cp, " from ",
            c.origin(o.size_key), ", ", parallel::cp_algo_name(o.algo), ") differs from the actor's (", in.cp.size_key,
            "=", in.cp.cp, ", ", parallel::cp_algo_name(in.cp.algo), "): it runs on the actor's process grid; set "
            "both alike");
  };
  // Read whether or not the model is on, so a setting is checked (and never silently ignored) either way.
  const CpSettings ref_cp = read_context_parallel(c, "actor_rollout_ref.ref" + OT,
                                                  {"actor_rollout_ref.ref.ulysses_sequence_parallel_size"});
  const bool ref = c.get_bool(A + "use_kl_loss") || c.get_bool("algorithm.use_kl_in_reward");
  if (ref && !same(ref_cp)) refuse("actor_rollout_ref.ref", ref_cp);
  const std::string rk = "actor_rollout_ref.ref.megatron.context_parallel_size", ak = A + "megatron.context_parallel_size";
  const int64_t ref_meg_cp = c.get_int(rk), actor_meg_cp = c.get_int(ak);
  if (ref && ref_meg_cp != actor_meg_cp)
    KS_FAIL("not supported yet: ", rk, "=", ref_meg_cp, " (from ", c.origin(rk), ") differs from ", ak, "=",
            actor_meg_cp, ": the reference model is the actor's copy on its process grid; set both alike");
  const CpSettings critic_cp = read_context_parallel(c, "critic" + OT, {"critic.ulysses_sequence_parallel_size"});
  const bool gae = c.get_string("algorithm.adv_estimator") == "gae";
  const bool critic = c.is_null("critic.enable") ? gae : c.get_bool("critic.enable");
  if (critic && !same(critic_cp)) refuse("critic", critic_cp);
}

}  // namespace

TrainInputs train_inputs(const config::Config& c) {
  reject_unbuilt(c);
  read_verl_choices(c);
  TrainInputs in;
  in.model_path = c.get_string("actor_rollout_ref.model.path");
  in.tokenizer_path = c.get_string_or("actor_rollout_ref.model.tokenizer_path", "");
  // data.tokenizer (verl: the tokenizer of the data set) wins over the model's.
  if (!c.is_null("data.tokenizer")) in.tokenizer_path = c.get_string("data.tokenizer");
  in.train_files = c.get_string_list("data.train_files");
  {
    const int64_t nodes = c.get_int("rollout.nnodes"), per_node = c.get_int("rollout.n_gpus_per_node");
    if ((nodes > 0) != (per_node > 0))
      KS_FAIL(c.origin(nodes > 0 ? "rollout.nnodes" : "rollout.n_gpus_per_node"), ": rollout.nnodes=", nodes,
              " and rollout.n_gpus_per_node=", per_node, ": set both (disaggregated rollout ranks) or neither");
    in.rollout_ranks = nodes * per_node;
    if (!c.get_bool("actor_rollout_ref.hybrid_engine") && in.rollout_ranks == 0)
      KS_FAIL(c.origin("actor_rollout_ref.hybrid_engine"), ": actor_rollout_ref.hybrid_engine=false puts the rollout "
              "on its own processes: set rollout.nnodes and rollout.n_gpus_per_node (how many), or leave it true");
    in.weight_bucket_bytes =
        c.get_int("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes") << 20;
  }
  in.val_files = list_or_empty(c, "data.val_files");
  auto td = data::rl_dataset_options(c, false);
  if (!td) KS_FAIL(td.status().message());
  in.train_data = std::move(td).value();
  auto vd = data::rl_dataset_options(c, true);
  if (!vd) KS_FAIL(vd.status().message());
  in.val_data = std::move(vd).value();
  // The data loader gives generation batches: data.gen_batch_size prompts
  // (the DAPO recipe's key; its default is data.train_batch_size).
  in.train_batch_size = c.get_int("data.gen_batch_size");
  if (in.train_batch_size < 1)
    KS_FAIL(c.origin("data.gen_batch_size"), ": data.gen_batch_size must be >= 1, got ", in.train_batch_size);
  in.shuffle = c.get_bool("data.shuffle");
  in.data_seed = data::data_seed(c);
  in.reward = rl::reward_options_from_config(c);
  in.dtype = parse_compute_dtype(c.get_string(A + "megatron.dtype"), A + "megatron.dtype");
  in.tp = c.get_int(A + "megatron.tensor_model_parallel_size");
  in.rollout_tp = c.get_int(R + "tensor_model_parallel_size");
  in.vocab_divisible_by = c.get_int(A + "megatron.override_transformer_config.make_vocab_size_divisible_by");
  if (in.vocab_divisible_by < 1)
    KS_FAIL(c.origin(A + "megatron.override_transformer_config.make_vocab_size_divisible_by"),
            ": actor_rollout_ref.actor.megatron.override_transformer_config.make_vocab_size_divisible_by must be >= 1, got ",
            in.vocab_divisible_by);
  in.sequence_parallel = c.get_bool(A + "megatron.override_transformer_config.sequence_parallel");
  in.distributed_optimizer = c.get_bool(A + "megatron.override_transformer_config.use_distributed_optimizer");
  in.recompute = recompute_policy(c, A + "megatron", "actor_rollout_ref.model.enable_gradient_checkpointing");
  in.gpu_memory_utilization = c.get_float(R + "gpu_memory_utilization");
  in.collective_timeout_s = double(c.get_int("actor_rollout_ref.nccl_timeout"));
  in.deterministic = c.get_bool(A + "megatron.override_transformer_config.deterministic_mode") ||
                     c.get_bool(A + "fsdp_config.full_determinism");
  in.console_full = c.get_string("trainer.console_metrics") == "full";
  in.console_logger = false;
  for (const auto& l : c.get_string_list("trainer.logger"))
    if (l == "console") in.console_logger = true;
  in.val_only = c.get_bool("trainer.val_only");

  const bool gae = c.get_string("algorithm.adv_estimator") == "gae";
  in.critic = c.is_null("critic.enable") ? gae : c.get_bool("critic.enable");
  if (gae && !in.critic)
    KS_FAIL(c.origin("critic.enable"), ": algorithm.adv_estimator=gae needs the critic (critic.enable=true)");
  in.critic_model_path = c.get_string("critic.model.path");
  in.critic_seed = uint64_t(c.get_int("critic.megatron.seed"));
  in.critic_dtype = parse_compute_dtype(c.get_string("critic.megatron.dtype"), "critic.megatron.dtype");
  in.critic_recompute = recompute_policy(c, "critic.megatron", "critic.model.enable_gradient_checkpointing");
  in.actor_pipeline = read_pipeline(c, A + "megatron", &in.actor_num_layers);
  check_pipeline(c, A + "megatron", in.actor_pipeline);
  in.critic_pipeline = read_pipeline(c, "critic.megatron", &in.critic_num_layers);
  // MoE routers (checked against config.json by moe_train_options once it is read). verl's
  // freeze_moe_router of the actor sits in actor_rollout_ref.model; the critic's model.override_config is
  // not built, so its routers train.
  const std::string OT = ".megatron.override_transformer_config.";
  in.actor_moe = read_moe_keys(c, A.substr(0, A.size() - 1) + OT,
                               "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router", true);
  in.ref_moe = read_moe_keys(c, "actor_rollout_ref.ref" + OT, "", false);
  in.critic_moe = read_moe_keys(c, "critic" + OT, "", true);
  read_grid_cp(c, in);
  in.ep = read_expert_parallel(c, in.tp, c.get_bool(A + "use_kl_loss") || c.get_bool("algorithm.use_kl_in_reward"),
                               in.critic);
  if (in.critic) {
    check_pipeline(c, "critic.megatron", in.critic_pipeline);
    const std::string cpp = "critic.megatron.pipeline_model_parallel_size";
    if (in.critic_pipeline.pp != in.actor_pipeline.pp)
      KS_FAIL("not supported yet: ", cpp, "=", in.critic_pipeline.pp, " (from ", c.origin(cpp),
              ") differs from the actor's ", in.actor_pipeline.pp, " (", A,
              "megatron.pipeline_model_parallel_size): the critic runs on the actor's process grid; set both alike");
  }

  // The rollout reads the actor's weights in place, so it computes in their dtype.
  const std::string rdt = c.get_string(R + "dtype"), adt = c.get_string(A + "megatron.dtype");
  if (rdt != adt)
    KS_FAIL("not supported yet: ", R, "dtype=", rdt, " with ", A, "megatron.dtype=", adt,
            " (the rollout reads the actor's weights in place; set both to the same dtype)");
  // The critic runs on the actor's process grid, with the actor's model options.
  const std::string cvocab_key = "critic.megatron.override_transformer_config.make_vocab_size_divisible_by";
  if (in.critic && c.get_int(cvocab_key) != in.vocab_divisible_by)
    KS_FAIL("not supported yet: ", cvocab_key, "=", c.get_int(cvocab_key), " differs from the actor's ",
            in.vocab_divisible_by, " (the critic is built with the actor's model options)");
  const int64_t ctp = c.get_int("critic.megatron.tensor_model_parallel_size");
  const bool csp = c.get_bool("critic.megatron.override_transformer_config.sequence_parallel");
  if (in.critic && ctp != in.tp)
    KS_FAIL("not supported yet: critic.megatron.tensor_model_parallel_size=", ctp, " differs from the actor's ", in.tp,
            " (the critic runs on the actor's process grid)");
  if (in.critic && in.tp > 1 && csp != in.sequence_parallel)
    KS_FAIL("not supported yet: critic.megatron.sequence_parallel=", csp ? "true" : "false", " differs from the actor's",
            " (the critic runs on the actor's process grid)");
  // The reference model (use_kl_loss or use_kl_in_reward) is the actor's copy on the actor's grid.
  const std::string F = "actor_rollout_ref.ref.megatron.";
  const bool ref = c.get_bool(A + "use_kl_loss") || c.get_bool("algorithm.use_kl_in_reward");
  const int64_t rtp_ref = c.get_int(F + "tensor_model_parallel_size");
  const bool rsp = c.get_bool(F + "override_transformer_config.sequence_parallel") &&
                   c.get_bool(F + "sequence_parallel");
  const std::string rdt_ref = c.get_string(F + "dtype");
  const int64_t rvocab = c.get_int(F + "override_transformer_config.make_vocab_size_divisible_by");
  int64_t ref_num_layers = -1;
  const parallel::PipelineSpec ref_pipeline = read_pipeline(c, "actor_rollout_ref.ref.megatron", &ref_num_layers);
  if (ref) check_ref_pipeline(c, in.actor_pipeline, in.actor_num_layers, ref_pipeline, ref_num_layers);
  if (ref && (rtp_ref != in.tp || (in.tp > 1 && rsp != in.sequence_parallel) || rdt_ref != adt ||
              rvocab != in.vocab_divisible_by))
    KS_FAIL("not supported yet: actor_rollout_ref.ref.megatron.{tensor_model_parallel_size, sequence_parallel, dtype, "
            "override_transformer_config.make_vocab_size_divisible_by} "
            "differing from the actor's (the reference model is the actor's copy on its process grid)");
  return in;
}

void check_layout_divides(const config::Config& c, const TrainInputs& in, int world_size) {
  auto check = [&](const std::string& meg, int64_t tp, int64_t pp) {
    const std::string tk = meg + ".tensor_model_parallel_size", pk = meg + ".pipeline_model_parallel_size";
    std::string sizes = tk + "=" + std::to_string(tp) + " (from " + c.origin(tk) + ") x " + pk + "=" +
                        std::to_string(pp) + " (from " + c.origin(pk) + ")";
    const int64_t cp = in.cp.cp;  // the critic and the reference run with the actor's (checked by train_inputs)
    if (cp > 1) sizes += " x " + in.cp.size_key + "=" + std::to_string(cp) + " (from " + c.origin(in.cp.size_key) + ")";
    // Each size below 2^31 first, so tp x pp x cp cannot overflow (the config ranges say >= 1; pp, cp <= 65536).
    if (tp < 1 || pp < 1 || tp > INT32_MAX || pp > INT32_MAX || cp > 65536)
      KS_FAIL(sizes, ": each must be in [1, the number of processes ", world_size, "]");
    const int64_t ranks = tp * pp * cp;
    if (world_size % ranks != 0)
      KS_FAIL(sizes, " = ", ranks, " ranks per model replica must divide the number of processes (", world_size,
              "); launch with mpirun -np <a multiple of ", ranks, "> kestrel train ..., or choose sizes whose "
              "product divides ", world_size);
  };
  check(A + "megatron", in.tp, in.actor_pipeline.pp);
  if (in.critic)
    check("critic.megatron", c.get_int("critic.megatron.tensor_model_parallel_size"), in.critic_pipeline.pp);
  // The expert grid (etp = tp = 1 under EP) spans ep x pp ranks.
  const int64_t eranks = in.ep.ep * in.actor_pipeline.pp;
  if (in.ep.ep > 1 && world_size % eranks != 0)
    KS_FAIL(c.origin(in.ep.size_key), ": ", in.ep.size_key, "=", in.ep.ep, " x pipeline_model_parallel_size=",
            in.actor_pipeline.pp, " = ", eranks, " must divide the number of processes (", world_size,
            "); launch with mpirun -np <a multiple of ", eranks, "> kestrel train ...");
  const std::string rk = R + "tensor_model_parallel_size";
  if (in.rollout_tp < 1 || world_size % in.rollout_tp != 0)
    KS_FAIL(c.origin(rk), ": ", rk, "=", in.rollout_tp, " must divide the number of processes (", world_size,
            "); launch with mpirun -np <a multiple of ", in.rollout_tp, "> kestrel train ...");
}

void check_num_layers(const config::Config& c, const TrainInputs& in, int64_t num_hidden_layers) {
  auto check = [&](const std::string& meg, int64_t num_layers, const parallel::PipelineSpec& p) {
    if (num_layers < 0) return;
    const std::string K = meg + ".override_transformer_config.";
    const int64_t slots = num_hidden_layers + int64_t(p.noop_layers.size());
    if (num_layers != slots)
      KS_FAIL(c.origin(K + "num_layers"), ": ", K, "num_layers=", num_layers, " must equal the model's "
              "num_hidden_layers (", num_hidden_layers, ", config.json) + the length of ", K, "noop_layers (",
              p.noop_layers.size(), ") = ", slots, ": Megatron's total layer count; set it to ", slots,
              " or leave it unset");
  };
  check(A + "megatron", in.actor_num_layers, in.actor_pipeline);
  if (in.critic) check("critic.megatron", in.critic_num_layers, in.critic_pipeline);
}

optim::LrScheduleConfig lr_schedule_config(const config::Config& c, const std::string& prefix, int64_t total_steps) {
  const std::string P = prefix + "optim.";
  optim::LrScheduleConfig lr;
  lr.lr = c.get_float(P + "lr");
  const std::string decay_style = c.get_string(P + "lr_decay_style");
  // verl's FSDP names win over Megatron's: warmup_style (deprecated), then lr_scheduler_type.
  const std::string fsdp_style = c.get_string_or(P + "lr_scheduler_type", decay_style);
  const std::string style = c.is_null(P + "warmup_style") ? fsdp_style : c.get_string(P + "warmup_style");
  lr.style = optim::parse_lr_style(style, P + "lr_decay_style").value();
  const int64_t own_total = c.get_int(P + "total_training_steps");
  lr.total_steps = own_total > 0 ? own_total : total_steps;
  lr.warmup_steps = optim::resolve_warmup_steps(c.get_int(P + "lr_warmup_steps"), c.get_float(P + "lr_warmup_steps_ratio"),
                                                lr.total_steps);
  // Megatron's lr_decay_steps: the step where the decay reaches min_lr; null = total_training_steps.
  lr.decay_steps = c.get_int_or(P + "lr_decay_steps", 0);
  if (lr.decay_steps < 0) KS_FAIL(c.origin(P + "lr_decay_steps"), ": ", P, "lr_decay_steps must be >= 0 or null");
  const double min_lr = c.get_float(P + "min_lr");
  lr.min_lr_ratio = c.is_null(P + "min_lr_ratio") ? (lr.lr > 0 ? min_lr / lr.lr : 0) : c.get_float(P + "min_lr_ratio");
  lr.init_lr_ratio = lr.lr > 0 ? c.get_float(P + "lr_warmup_init") / lr.lr : 0;
  return lr;
}

// algorithm.rollout_correction.* (verl's RolloutCorrectionConfig) and rollout.calculate_log_probs, which
// decides whether the batch carries the rollout's log-probs (verl's rollout_log_probs) at all.
static rl::RolloutCorrectionConfig rollout_correction_config(const config::Config& c) {
  const std::string P = "algorithm.rollout_correction.";
  rl::RolloutCorrectionConfig rc;
  rc.active = c.get_bool(R + "calculate_log_probs");
  auto check = [&](const auto& r, const std::string& key) {
    if (!r.is_ok()) KS_FAIL(c.origin(key), ": ", r.status().message());
  };
  const auto is = rl::parse_rollout_is(c.get_string_or(P + "rollout_is", ""));
  check(is, P + "rollout_is");
  rc.rollout_is = is.value();
  rc.rollout_is_threshold = c.get_float(P + "rollout_is_threshold");
  rc.rollout_is_batch_normalize = c.get_bool(P + "rollout_is_batch_normalize");
  const auto rs = rl::parse_rollout_rs(c.get_string_or(P + "rollout_rs", ""), c.get_string_or(P + "rollout_rs_threshold", ""));
  check(rs, P + "rollout_rs");
  rc.rollout_rs = rs.value();
  rc.bypass_mode = c.get_bool(P + "bypass_mode");
  const auto lt = rl::parse_bypass_loss(c.get_string(P + "loss_type"));
  check(lt, P + "loss_type");
  rc.loss_type = lt.value();
  // verl silently does nothing without rollout log-probs (bypass mode raises); Kestrel refuses the request.
  const bool asks = rc.rollout_is != rl::IsLevel::None || rc.rejects() || rc.bypass_mode;
  if (asks && !rc.active)
    KS_FAIL(c.origin(R + "calculate_log_probs"), ": ", P, "rollout_is/rollout_rs/bypass_mode need the rollout's "
            "log-probs: set ", R, "calculate_log_probs=true (it is false)");
  return rc;
}

rl::RlOptions rl_options(const config::Config& c, int64_t batches_per_epoch) {
  rl::RlOptions o;
  o.train_batch_size = c.get_int("data.train_batch_size");
  o.gen_batch_size = c.get_int("data.gen_batch_size");
  o.filter_groups.enable = c.get_bool("algorithm.filter_groups.enable");
  o.filter_groups.metric = c.get_string_or("algorithm.filter_groups.metric", "");
  o.filter_groups.max_num_gen_batches = c.get_int("algorithm.filter_groups.max_num_gen_batches");
  if (o.filter_groups.enable && o.filter_groups.metric.empty())
    KS_FAIL(c.origin("algorithm.filter_groups.metric"),
            ": algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric (acc, score, seq_reward, "
            "seq_final_reward, or a reward_extra_info key)");
  if (!o.filter_groups.enable && o.gen_batch_size != o.train_batch_size)
    std::fprintf(stderr, "train: data.gen_batch_size=%lld differs from data.train_batch_size=%lld without "
                         "algorithm.filter_groups.enable: each step trains on %lld prompts (as verl does)\n",
                 (long long)o.gen_batch_size, (long long)o.train_batch_size, (long long)o.gen_batch_size);
  o.n = c.get_int(R + "n");
  const double temperature = c.get_float(R + "temperature");
  o.temperature = c.get_bool(R + "do_sample") ? temperature : 0.0;
  o.top_k = c.get_int(R + "top_k");
  o.top_p = c.get_float(R + "top_p");
  o.response_length = c.get_int(R + "response_length");
  o.max_prompt_length = c.get_int(R + "prompt_length");
  o.rollout_seed = uint64_t(c.get_int(R + "seed"));
  o.engine = rollout_engine_config(c);
  if (c.is_null(R + "max_model_len")) o.engine.max_model_len = o.max_prompt_length + o.response_length;
  o.val_n = c.get_int(R + "val_kwargs.n");
  const double val_temperature = c.get_float(R + "val_kwargs.temperature");
  o.val_temperature = c.get_bool(R + "val_kwargs.do_sample") ? val_temperature : 0.0;
  o.val_top_k = c.get_int(R + "val_kwargs.top_k");
  o.val_top_p = c.get_float(R + "val_kwargs.top_p");
  o.ppo_mini_batch_size = c.get_int(A + "ppo_mini_batch_size");
  o.ppo_epochs = c.get_int(A + "ppo_epochs");
  o.shuffle = c.get_bool(A + "shuffle");
  o.data_loader_seed = uint64_t(c.get_int(A + "data_loader_seed"));
  o.micro_batch_size = c.get_int_or(A + "ppo_micro_batch_size_per_gpu", 0);
  const int64_t max_tokens = c.get_int(A + "ppo_max_token_len_per_gpu");
  o.max_token_len = c.get_bool(A + "use_dynamic_bsz") ? max_tokens : 0;
  o.log_prob_max_token_len = c.get_int(R + "log_prob_max_token_len_per_gpu");
  // verl: the old log-probs use rollout.log_prob_micro_batch_size_per_gpu and
  // the reference's its own key; one scoring micro-batch size serves both here.
  // With log_prob_use_dynamic_bsz (or neither size set) micro-batches are cut by
  // the token budget alone.
  const int64_t old_lp_micro = c.get_int_or(R + "log_prob_micro_batch_size_per_gpu", 0);
  const int64_t ref_lp_micro = c.get_int_or("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 0);
  if (ref_lp_micro > 0 && old_lp_micro > 0 && ref_lp_micro != old_lp_micro)
    KS_FAIL("not supported yet: actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=", ref_lp_micro,
            " different from actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=", old_lp_micro,
            " (one scoring micro-batch size serves both); set them equal");
  o.log_prob_micro_batch_size = c.get_bool(R + "log_prob_use_dynamic_bsz") ? 0 : std::max(old_lp_micro, ref_lp_micro);
  // Prompt sharing packs a prompt once for its samples; context parallelism splits whole sequences, so it is
  // off under cp (model/cp_batch.h).
  o.share_prompts = c.get_bool(A + "use_prefix_grouper") &&
                    read_context_parallel(c, A + "megatron.override_transformer_config.",
                                          {A + "ulysses_sequence_parallel_size",
                                           A + "fsdp_config.ulysses_sequence_parallel_size"})
                            .cp == 1;
  // MoE router replay: R3 replays the rollout's record, which the rollout makes only when asked.
  o.engine.record_routing = c.get_bool(R + "enable_rollout_routing_replay");
  const std::string ref_rr = "actor_rollout_ref.ref.router_replay.mode";
  o.actor_router_replay = rl::parse_router_replay(c.get_string(A + "router_replay.mode"), A + "router_replay.mode").value();
  o.ref_router_replay = rl::parse_router_replay(c.get_string(ref_rr), ref_rr).value();
  for (const auto& [key, mode] : {std::pair{A + "router_replay.mode", o.actor_router_replay}, {ref_rr, o.ref_router_replay}})
    if (mode == rl::RouterReplay::R3 && !o.engine.record_routing)
      KS_FAIL(c.origin(key), ": ", key, "=R3 replays the rollout's MoE routing, which the rollout records only with ", R,
              "enable_rollout_routing_replay=true (it is false, from ", c.origin(R + "enable_rollout_routing_replay"),
              "); set it true, or the mode to R2 or disabled");
  o.loss.clip_ratio_low = clip_ratio_side(c, "clip_ratio_low");
  o.loss.clip_ratio_high = clip_ratio_side(c, "clip_ratio_high");
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
  o.adamw = adamw_config(c, A);
  o.reuse_fp32_param = c.get_bool(A + "megatron.override_transformer_config.reuse_fp32_param");
  o.optimizer_offload_pieces = optimizer_offload_pieces(c, A, A + "fsdp_config.");
  const PhaseOffload actor_off = phase_offload(c, A, A + "fsdp_config.");
  o.actor_param_offload = actor_off.params;
  o.actor_grad_offload = actor_off.grads;
  const std::string Rf = "actor_rollout_ref.ref.";
  o.ref_param_offload = c.get_bool(Rf + "megatron.param_offload") || c.get_bool(Rf + "fsdp_config.param_offload");
  o.max_consecutive_skipped_steps = c.get_int("trainer.max_consecutive_skipped_steps");
  o.clip_grad = c.get_float_or(A + "grad_clip", c.get_float(A + "optim.clip_grad"));  // verl FSDP's name wins
  const int64_t epochs = c.get_int("trainer.total_epochs");
  o.total_steps = c.get_int_or("trainer.total_training_steps", batches_per_epoch * epochs);
  if (o.filter_groups.enable) o.total_epochs = epochs;
  o.lr = lr_schedule_config(c, A, o.total_steps);
  o.use_kl_in_reward = c.get_bool("algorithm.use_kl_in_reward");
  o.kl_penalty = c.get_string("algorithm.kl_penalty");
  o.kl_ctrl.type = c.get_string("algorithm.kl_ctrl.type");
  o.kl_ctrl.value = c.get_float("algorithm.kl_ctrl.kl_coef");
  o.kl_ctrl.horizon = c.get_int("algorithm.kl_ctrl.horizon");
  o.kl_ctrl.target_kl = c.get_float("algorithm.kl_ctrl.target_kl");
  o.rollout_corr = rollout_correction_config(c);
  o.staleness_threshold = c.get_float("async_training.staleness_threshold");
  o.partial_max_split = c.get_int("algorithm.partial_rollout_max_split");
  // verl interrupts responses at each parameter sync; Kestrel's rounds need a token budget, which
  // partial_rollout_max_split gives. The flag alone says nothing about how long a round is.
  if (c.get_bool("async_training.partial_rollout") && o.partial_max_split <= 1)
    KS_FAIL(c.origin("async_training.partial_rollout"), ": async_training.partial_rollout=true: Kestrel's partial "
            "rollout runs in rounds of ceil(response_length / s) tokens; set +algorithm.partial_rollout_max_split=s "
            "(s > 1, e.g. 4; it is ", o.partial_max_split, ") or partial_rollout=false");
  o.use_rollout_log_probs = c.get_bool("async_training.use_rollout_log_probs");
  if (o.use_rollout_log_probs && !c.get_bool("actor_rollout_ref.rollout.calculate_log_probs"))
    KS_FAIL(c.origin("actor_rollout_ref.rollout.calculate_log_probs"), ": async_training.use_rollout_log_probs=true "
            "trains with the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true (it is false)");
  o.launch_reward_fn_async = c.get_bool("reward_model.launch_reward_fn_async");
  o.stream_log_probs = c.get_bool("async_training.stream_log_probs");
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
  o.resolved_config_yaml = c.to_yaml();
  return o;
}

rl::CriticOptions critic_options(const config::Config& c, const rl::RlOptions& o) {
  const std::string C = "critic.";
  rl::CriticOptions co;
  co.ppo_mini_batch_size = c.get_int(C + "ppo_mini_batch_size");
  co.n = o.n;
  co.ppo_epochs = c.get_int(C + "ppo_epochs");
  co.shuffle = c.get_bool(C + "shuffle");
  co.data_loader_seed = uint64_t(c.get_int(C + "data_loader_seed"));
  co.micro_batch_size = c.get_int_or(C + "ppo_micro_batch_size_per_gpu", 0);
  const int64_t max_tokens = c.get_int(C + "ppo_max_token_len_per_gpu");
  co.max_token_len = c.get_bool(C + "use_dynamic_bsz") ? max_tokens : 0;
  co.forward_max_token_len = c.get_int(C + "forward_max_token_len_per_gpu");
  // verl's critic cuts its values pass like its update: by the token budget
  // under use_dynamic_bsz, else forward_micro_batch_size_per_gpu sequences.
  co.forward_micro_batch_size =
      c.get_bool(C + "use_dynamic_bsz") ? 0 : c.get_int_or(C + "forward_micro_batch_size_per_gpu", 0);
  co.cliprange_value = c.get_float(C + "cliprange_value");
  co.loss_agg_mode = rl::parse_agg_mode(c.get_string(C + "loss_agg_mode")).value();
  co.loss_scale_factor = o.loss_scale_factor;
  co.response_length = o.response_length;
  co.adamw = adamw_config(c, C);
  co.reuse_fp32_param = c.get_bool(C + "megatron.override_transformer_config.reuse_fp32_param");
  co.optimizer_offload_pieces = optimizer_offload_pieces(c, C, C + "model.fsdp_config.");
  const PhaseOffload critic_off = phase_offload(c, C, C + "model.fsdp_config.");
  co.param_offload = critic_off.params;
  co.grad_offload = critic_off.grads;
  co.max_consecutive_skipped_steps = o.max_consecutive_skipped_steps;
  co.lr = lr_schedule_config(c, C, o.total_steps);
  co.clip_grad = c.get_float_or(C + "grad_clip", c.get_float(C + "optim.clip_grad"));  // verl FSDP's name wins
  co.distributed_optimizer = c.get_bool(C + "megatron.override_transformer_config.use_distributed_optimizer");
  co.share_prompts = o.share_prompts;
  return co;
}

parallel::PipelineSpec scoring_pipeline_spec(const config::Config& c, const std::string& meg) {
  const parallel::PipelineSpec p = read_layer_layout(c, meg);
  check_pipeline(c, meg, p);
  return p;
}

}  // namespace kestrel::cli
