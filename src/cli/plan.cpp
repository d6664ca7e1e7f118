// kestrel plan: the memory model of `kestrel train`'s configuration
// (rl/memory_plan.h), before anything loads: config.json only, no weights.
// Prints the per-rank bytes by allocator category for each phase of a step,
// the peak and its phase, whether it fits the device memory, FLOPs and
// communication per step, and the cheapest changes that make it fit.
//
// It reads the config with kestrel train's own readers (train_inputs,
// rl_options; activation recompute is TrainInputs::recompute, the policy the
// model runs). Layout keys whose feature training does not build yet
// (pipeline, virtual pipeline, context and expert parallelism) are accepted
// here on the command line and planned from Megatron's formulas, marked "not
// supported yet"; so is reuse_fp32_param while the config does not declare it.
//
// Exit status: 0 fits, 3 does not fit (the advice is printed), 1 bad input.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "parallel/pipeline_layout.h"
#include "config/config.h"
#include "data/builtin_tokenizer.h"
#include "data/config_options.h"
#include "rl/memory_plan.h"
#include "rollout/engine.h"
#include "train/builtin_model.h"

namespace kestrel::cli {

namespace {

const std::string A = "actor_rollout_ref.actor.", M = A + "megatron.", OT = M + "override_transformer_config.";

// Keys planned here that the config layer refuses today (not supported yet,
// or undeclared additions): taken aside from the command line before loading.
// The MoE layers' training keys the plan reads (Megatron's names): from the
// config once its schema declares them, else planned from the command line.
const char* const kMoeKeys[] = {"moe_router_load_balancing_type", "moe_aux_loss_coeff",
                                "moe_z_loss_coeff",               "moe_expert_capacity_factor",
                                "moe_pad_expert_input_to_capacity", "moe_router_dtype"};
const std::string kFreezeRouter = "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router";
const std::string kRolloutRouting = "actor_rollout_ref.rollout.enable_rollout_routing_replay";

bool planned_only(const std::string& key) {
  static const char* const kKeys[] = {
      "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "expert_model_parallel_size",
      "override_transformer_config.reuse_fp32_param"};
  for (const char* k : kKeys)
    if (key == M + k) return true;
  for (const char* k : kMoeKeys)
    if (key == OT + k) return true;
  return key == "critic.megatron.override_transformer_config.reuse_fp32_param" || key == kFreezeRouter ||
         key == kRolloutRouting;
}

// key=value overrides of planned-only keys the schema does not accept yet.
std::map<std::string, std::string> take_aside(std::vector<std::string>& args) {
  std::map<std::string, std::string> aside;
  const config::Schema& s = config::ppo_schema();
  std::vector<std::string> kept;
  for (const auto& a : args) {
    const size_t b = a.find_first_not_of('+'), eq = a.find('=');
    if (b != std::string::npos && eq != std::string::npos && a[0] != '-') {
      const std::string key = a.substr(b, eq - b);
      const config::KeyDecl* d = s.find(key);
      if (planned_only(key) && (!d || d->status == config::Support::NotSupportedYet)) {
        aside[key] = a.substr(eq + 1);
        continue;
      }
    }
    kept.push_back(a);
  }
  args = std::move(kept);
  return aside;
}

int64_t aside_int(const std::map<std::string, std::string>& aside, const std::string& key, int64_t dflt) {
  auto it = aside.find(key);
  if (it == aside.end() || it->second == "null") return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (*end != '\0') KS_FAIL(key, ": expected an integer, got '", it->second, "'");
  return v;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool aside_bool(const std::map<std::string, std::string>& aside, const std::string& key, bool dflt) {
  auto it = aside.find(key);
  if (it == aside.end()) return dflt;
  const std::string v = lower(it->second);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  KS_FAIL(key, ": expected true or false, got '", it->second, "'");
}

}  // namespace

namespace {

// config.json of actor_rollout_ref.model.path, or a built-in model's config
// (builtin:tiny|small; builtin:arith-sft is the tiny model), without weights.
io::ModelConfig plan_model_config(const std::string& path) {
  if (path.rfind("builtin:", 0) == 0) {
    std::string name = path.substr(8);
    if (name == "arith-sft") name = "tiny";
    const auto tf = data::arith_tokenizer();
    auto cfg = train::builtin_model_config(name, tf.vocab_size, tf.eos_id);
    if (!cfg) KS_FAIL("actor_rollout_ref.model.path: ", cfg.status().message());
    return *cfg;
  }
  const std::string dir = data::expand_paths({path}).at(0);
  auto cfg = io::load_model_config(dir);
  if (!cfg) KS_FAIL("actor_rollout_ref.model.path: ", cfg.status().message());
  return *cfg;
}

struct PlanContext {
  std::map<std::string, std::string> aside;
  int64_t world = 0;          // 0: from trainer.n_gpus_per_node x nnodes when set, else 1
  int64_t device_memory = 0;  // 0: the machine's
  bool reuse_fp32_param = false;  // --reuse-fp32-param
  bool for_train = false;     // kestrel train's start-up check: only what training builds
  bool on_device = false;     // that check for a run on a GPU, where the offload keys take state off it
};

// A reuse_fp32_param key: the config's value when the schema declares it
// (kestrel train reads it then), else the planned-only override's (not for
// kestrel train's check: train cannot run an undeclared key).
bool reuse_declared(const config::Config& c, const std::string& key) {
  const config::KeyDecl* d = c.schema().find(key);
  return d && d->status != config::Support::NotSupportedYet;
}

bool reuse_flag(const config::Config& c, const PlanContext& ctx, const std::string& key) {
  if (reuse_declared(c, key)) return c.get_bool(key);
  return !ctx.for_train && aside_bool(ctx.aside, key, false);
}

// A MoE training key: the config's value when its schema declares it, else
// the command line's planned-only value (recorded in `planned`; never for
// kestrel train's check, which plans what train runs), else the default.
struct MoeKeyReader {
  const config::Config& c;
  const PlanContext& ctx;
  std::vector<std::string>& planned;
  const std::string* text(const std::string& key) {
    if (reuse_declared(c, key)) return nullptr;
    auto it = ctx.aside.find(key);
    if (ctx.for_train || it == ctx.aside.end()) return nullptr;
    planned.push_back(key);
    return &it->second;
  }
  double number(const std::string& key, double dflt) {
    if (reuse_declared(c, key)) return c.get_float_or(key, dflt);
    const std::string* t = text(key);
    if (!t || *t == "null") return dflt;
    char* end = nullptr;
    const double v = std::strtod(t->c_str(), &end);
    if (end == t->c_str() || *end != '\0') KS_FAIL(key, ": expected a number or null, got '", *t, "'");
    return v;
  }
  std::string word(const std::string& key, const std::string& dflt) {
    if (reuse_declared(c, key)) return c.get_string_or(key, dflt);
    const std::string* t = text(key);
    return !t || *t == "null" ? dflt : *t;
  }
  bool flag(const std::string& key, bool dflt) {
    if (reuse_declared(c, key)) return c.get_bool(key);
    return text(key) ? aside_bool(ctx.aside, key, dflt) : dflt;
  }
};

// Megatron's MoE keys as model::MoeTrainOptions (model/moe_options.h); the
// keys the config does not declare yet go to `planned`.
model::MoeTrainOptions moe_options(const config::Config& c, const PlanContext& ctx, std::vector<std::string>& planned) {
  MoeKeyReader r{c, ctx, planned};
  model::MoeTrainOptions o;
  o.load_balancing_type = r.word(OT + "moe_router_load_balancing_type", o.load_balancing_type);
  if (o.load_balancing_type != "aux_loss" && o.load_balancing_type != "seq_aux_loss" && o.load_balancing_type != "none")
    KS_FAIL(OT, "moe_router_load_balancing_type: expected aux_loss, seq_aux_loss or none, got '",
            o.load_balancing_type, "'");
  o.aux_loss_coeff = r.number(OT + "moe_aux_loss_coeff", 0.0);
  o.z_loss_coeff = r.number(OT + "moe_z_loss_coeff", 0.0);
  o.capacity_factor = r.number(OT + "moe_expert_capacity_factor", 0.0);
  o.pad_to_capacity = r.flag(OT + "moe_pad_expert_input_to_capacity", false);
  o.router_logits_fp32 = r.word(OT + "moe_router_dtype", "null") == "fp32";
  o.freeze_router = r.flag(kFreezeRouter, false);
  return o;
}

rl::PlanInputs plan_inputs(const config::Config& c, const std::string& model_path, const PlanContext& ctx,
                           std::vector<std::string>* planned_keys = nullptr) {
  const TrainInputs in = train_inputs(c);
  const rl::RlOptions o = rl_options(c, 1);
  rl::PlanInputs p;
  p.model = plan_model_config(model_path.empty() ? in.model_path : model_path);
  p.dtype = in.dtype;
  p.vocab_divisible_by = in.vocab_divisible_by;
  rl::PlanLayout& l = p.layout;
  l.tp = in.tp;
  l.pp = aside_int(ctx.aside, M + "pipeline_model_parallel_size", c.get_int(M + "pipeline_model_parallel_size"));
  l.vpp = aside_int(ctx.aside, M + "virtual_pipeline_model_parallel_size",
                    c.get_int_or(M + "virtual_pipeline_model_parallel_size", 1));
  if (l.pp > 1 || l.vpp > 1) {  // the layer split kestrel train will build (uneven stages, noop layers)
    parallel::PipelineSpec spec = in.actor_pipeline;
    spec.pp = int(l.pp);
    spec.vpp = int(l.vpp);
    check_num_layers(c, in, p.model.num_hidden_layers);
    if (auto chunks = parallel::pipeline_chunks(spec, p.model.num_hidden_layers); !chunks)
      KS_FAIL(chunks.status().message());
    l.first_stage_layers = spec.first_stage_layers;
    l.last_stage_layers = spec.last_stage_layers;
    l.noop_layers = spec.noop_layers;
  }
  {  // context parallelism as kestrel train reads it (cli/options_cp.cpp)
    const CpSettings cps = read_context_parallel(c, OT, {A + "ulysses_sequence_parallel_size",
                                                         A + "fsdp_config.ulysses_sequence_parallel_size"});
    l.cp = cps.cp;
    l.cp_ulysses = l.cp > 1 ? parallel::cp_ulysses_degree(cps.algo, int(l.cp), int(cps.ulysses_degree)) : 1;
  }
  l.ep = aside_int(ctx.aside, M + "expert_model_parallel_size", c.get_int(M + "expert_model_parallel_size"));
  // null: the experts are split like the attention (Megatron's default).
  l.etp = c.is_null(M + "expert_tensor_parallel_size") ? 0 : c.get_int(M + "expert_tensor_parallel_size");
  l.sequence_parallel = in.sequence_parallel;
  l.distributed_optimizer = in.distributed_optimizer;
  int64_t world = ctx.world;
  const bool gpus_set = c.origin("trainer.n_gpus_per_node") != "default" || c.origin("trainer.nnodes") != "default";
  if (world <= 0) world = gpus_set ? c.get_int("trainer.n_gpus_per_node") * c.get_int("trainer.nnodes") : 1;
  const int64_t model_ranks = l.tp * l.pp * l.cp;
  if (world < 1 || world % model_ranks != 0)
    KS_FAIL("the world size ", world, " (--world, or trainer.n_gpus_per_node x trainer.nnodes) does not divide by "
            "tensor x pipeline x context parallel = ", model_ranks, "; choose sizes dividing it");
  l.dp = world / model_ranks;
  // reuse_fp32_param: read from the config when it declares the key (then
  // kestrel train runs it), else taken aside from the command line (planned
  // only; kestrel train's start-up check plans what train runs: none).
  const std::string reuse_key = OT + "reuse_fp32_param", critic_reuse_key = "critic.megatron." + reuse_key.substr(M.size());
  p.reuse_fp32_param = reuse_flag(c, ctx, reuse_key) || (!ctx.for_train && ctx.reuse_fp32_param);
  if (p.reuse_fp32_param && p.dtype == DType::F32)
    KS_FAIL(reuse_key, "=true needs bf16 training (", M, "dtype=bfloat16); f32 weights are the masters");
  p.critic_reuse_fp32_param = in.critic && reuse_flag(c, ctx, critic_reuse_key);
  if (p.critic_reuse_fp32_param && in.critic_dtype == DType::F32)
    KS_FAIL(critic_reuse_key, "=true needs bf16 training (critic.megatron.dtype=bfloat16)");
  p.recompute = in.recompute;  // the policy kestrel train gives the actor's model
  p.critic_recompute = in.critic_recompute;
  std::vector<std::string> planned;
  if (p.model.moe.num_experts > 0) p.moe = moe_options(c, ctx, planned);
  if (planned_keys) *planned_keys = planned;
  p.offload = {c.get_bool(M + "param_offload"), c.get_bool(M + "grad_offload"), c.get_bool(M + "optimizer_offload")};
  if (ctx.for_train && !ctx.on_device) p.offload = {};  // on the CPU host memory is the device memory
  rl::PlanBatching& b = p.batch;
  b.prompt_len = o.max_prompt_length;
  b.response_len = o.response_length;
  b.n = o.n;
  b.train_batch_size = o.gen_batch_size;
  b.ppo_mini_batch_size = o.ppo_mini_batch_size;
  b.ppo_epochs = o.ppo_epochs;
  b.micro_batch_size = o.micro_batch_size;
  b.max_token_len = o.max_token_len;
  b.share_prompts = o.share_prompts;
  b.log_prob_micro_batch_size = o.log_prob_micro_batch_size;
  b.log_prob_max_token_len = o.log_prob_max_token_len;
  b.old_log_prob = o.ppo_epochs > 1 || o.ppo_mini_batch_size < o.gen_batch_size || o.use_kl_in_reward;
  if (c.get_string(A + "router_replay.mode") != "disabled") {  // R2/R3: routed experts per token in the batches
    int64_t moe_layers = 0;
    for (int64_t i = 0; i < p.model.num_hidden_layers; ++i) moe_layers += p.model.is_moe_layer(i) ? 1 : 0;
    b.replay_values = moe_layers * p.model.moe.top_k;
  }
  p.ref = o.loss.use_kl_loss || o.use_kl_in_reward;
  p.critic = in.critic;
  p.critic_dtype = in.critic_dtype;
  p.rollout.tp = in.rollout_tp;
  p.rollout.ep = in.ep.rollout_ep;
  p.rollout.dtype = in.dtype;  // train_inputs requires the rollout dtype to equal the actor's
  p.rollout.gpu_memory_utilization = in.gpu_memory_utilization;
  p.rollout.block_size = o.engine.block_size;
  p.rollout.max_num_batched_tokens = o.engine.max_num_batched_tokens;
  p.rollout.max_num_seqs = o.engine.max_num_seqs;
  if (p.model.moe.num_experts > 0) {  // R3: the rollout records the routing in a cache beside the KV cache
    MoeKeyReader r{c, ctx, planned};
    p.rollout.record_routing = r.flag(kRolloutRouting, false);
    if (planned_keys) *planned_keys = planned;
  }
  if (ctx.device_memory > 0) {
    p.device_memory = ctx.device_memory;
  } else {
    const int64_t nodes = c.origin("trainer.nnodes") != "default" ? std::max<int64_t>(1, c.get_int("trainer.nnodes")) : 1;
    auto mem = rollout::device_memory_bytes(std::max<int64_t>(1, world / nodes));
    if (!mem) KS_FAIL(mem.status().message());
    p.device_memory = *mem;
  }
  if (Status s = rl::validate_plan_inputs(p); !s.is_ok()) KS_FAIL(s.message());
  return p;
}

const char* kCategoryNames[] = {"Params", "Grads", "OptimizerState", "Activations", "KVCache", "Other"};

std::string layout_line(const rl::PlanInputs& in) {
  const rl::PlanLayout& l = in.layout;
  char buf[256];
  std::snprintf(buf, sizeof buf, "tp %lld%s pp %lld%s cp %lld ep %lld%s dp %lld%s", (long long)l.tp,
                l.sequence_parallel && l.tp > 1 ? " (sp)" : "", (long long)l.pp,
                l.vpp > 1 ? (" vpp " + std::to_string(l.vpp)).c_str() : "", (long long)l.cp, (long long)l.ep,
                l.expert_tp() != l.tp ? (" etp " + std::to_string(l.expert_tp())).c_str() : "", (long long)l.dp,
                l.distributed_optimizer && l.dp > 1 ? " (distributed optimizer)" : "");
  return buf;
}

std::string flops_str(double f) {
  char buf[32];
  if (f >= 1e15) std::snprintf(buf, sizeof buf, "%.2f PFLOP", f / 1e15);
  else if (f >= 1e12) std::snprintf(buf, sizeof buf, "%.2f TFLOP", f / 1e12);
  else if (f >= 1e8 || f == 0) std::snprintf(buf, sizeof buf, "%.2f GFLOP", f / 1e9);
  else if (f >= 1e5) std::snprintf(buf, sizeof buf, "%.2f MFLOP", f / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f FLOP", f);
  return buf;
}

std::string count_str(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

// The model's MoE/MLA shape, active parameters and FLOPs per token, and the
// rollout's KV cache per token (MLA: the latent row and its decompressed
// GQA-equivalent).
void print_model_lines(const rl::MemoryPlan& p) {
  const io::ModelConfig& c = p.inputs.model;
  const int64_t total = c.num_parameters();
  if (c.moe.num_experts > 0) {
    int64_t moe_layers = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.is_moe_layer(i) ? 1 : 0;
    std::printf("mixture of experts: %lld of %lld layers, %lld routed experts (top-%lld, width %lld)", (long long)moe_layers,
                (long long)c.num_hidden_layers, (long long)c.moe.num_experts, (long long)c.moe.top_k,
                (long long)c.moe.moe_intermediate_size);
    if (c.moe.shared_intermediate_size > 0)
      std::printf(" + shared width %lld%s", (long long)c.moe.shared_intermediate_size,
                  c.moe.shared_expert_gate ? " (gated)" : "");
    std::printf("; %s of %s parameters active per token\n", count_str(double(p.active_params)).c_str(),
                count_str(double(total)).c_str());
  }
  std::printf("forward FLOPs per token: %s (GEMMs%s; attention core extra per (query, key) pair)\n",
              flops_str(p.flops_per_token).c_str(), c.moe.num_experts > 0 ? ", active experts only" : "");
  if (c.mla.enabled) {
    const int64_t lat = c.mla.kv_lora_rank + c.mla.qk_rope_head_dim;
    std::printf("KV cache per token: %s (MLA latent: %lld layers x %lld values [kv_lora %lld + rope %lld]); "
                "decompressed K/V (GQA-equivalent) would be %s (%.1fx)\n",
                rl::format_bytes(p.kv_bytes_per_token).c_str(), (long long)c.num_hidden_layers, (long long)lat,
                (long long)c.mla.kv_lora_rank, (long long)c.mla.qk_rope_head_dim,
                rl::format_bytes(p.kv_bytes_per_token_gqa).c_str(),
                double(p.kv_bytes_per_token_gqa) / double(std::max<int64_t>(1, p.kv_bytes_per_token)));
  } else {
    std::printf("KV cache per token: %s (%lld layers x K and V of %lld kv heads x %lld)\n",
                rl::format_bytes(p.kv_bytes_per_token).c_str(), (long long)c.num_hidden_layers,
                (long long)(rl::kv_values_per_token_layer(c, p.inputs.rollout.tp) / (2 * c.head_dim)),
                (long long)c.head_dim);
  }
  if (p.kv_routing_bytes_per_token > 0)
    std::printf("routing cache per token: %s (enable_rollout_routing_replay: n_moe_layers x top_k i32)\n",
                rl::format_bytes(p.kv_routing_bytes_per_token).c_str());
  std::printf("KV cache: %s, %lld tokens (%lld blocks of %lld)\n", rl::format_bytes(p.kv_cache_bytes).c_str(),
              (long long)p.kv_tokens, (long long)p.kv_blocks, (long long)p.inputs.rollout.block_size);
}

void print_table(const rl::MemoryPlan& p, const std::vector<rl::PlanAdvice>& advice, const std::string& model) {
  const rl::PlanInputs& in = p.inputs;
  std::printf("kestrel plan: %s (%s, %lld layers, hidden %lld, vocab %lld), %s, %s, recompute %s%s\n", model.c_str(),
              io::arch_name(in.model.arch), (long long)in.model.num_hidden_layers, (long long)in.model.hidden_size,
              (long long)in.model.vocab_size, dtype_name(in.dtype), layout_line(in).c_str(), in.recompute.describe().c_str(),
              in.reuse_fp32_param ? ", reuse_fp32_param" : "");
  std::printf("per rank: %lld parameters%s; micro-batches of <= %lld tokens (%lld per mini-batch of %lld sequences), "
              "%lld optimizer steps per step\n",
              (long long)p.shapes.params,
              in.layout.pp > 1 ? (" (pipeline rank " + std::to_string(p.shapes.pp_rank) + ", " +
                                  std::to_string(p.shapes.L) + " layers)").c_str()
                               : "",
              (long long)p.micro.max_tokens, (long long)p.micro.micro_batches, (long long)p.micro.mini_batch_seqs,
              (long long)p.micro.optimizer_steps);
  print_model_lines(p);
  std::printf("\n");
  std::printf("%-16s", "bytes per rank");
  for (const auto& ph : p.phases) std::printf(" %14s", ph.name.c_str());
  std::printf("\n");
  for (size_t c = 0; c < kNumMemCategories; ++c) {
    std::printf("%-16s", kCategoryNames[c]);
    for (const auto& ph : p.phases) std::printf(" %14s", rl::format_bytes(ph.bytes[c]).c_str());
    std::printf("\n");
  }
  std::printf("%-16s", "total");
  for (const auto& ph : p.phases) std::printf(" %14s", rl::format_bytes(ph.total()).c_str());
  std::printf("\n\n");
  for (const auto& ph : p.phases) std::printf("  %s: %s\n", ph.name.c_str(), ph.detail.c_str());
  const rl::PhasePlan& peak = p.phases[p.peak_phase];
  std::printf("\npeak: %s in %s\n", rl::format_bytes(p.peak()).c_str(), peak.name.c_str());
  std::printf("device memory: %s per rank: %s (%.0f%%)\n", rl::format_bytes(in.device_memory).c_str(),
              p.fits() ? "fits" : "DOES NOT FIT", 100.0 * double(p.peak()) / double(in.device_memory));
  std::printf("FLOPs per rank per step: actor update %s, scoring %s, rollout %s\n", flops_str(p.flops_actor).c_str(),
              flops_str(p.flops_scoring).c_str(), flops_str(p.flops_rollout).c_str());
  for (const auto& cv : p.comm)
    std::printf("communication: %s: %s per step (%s sent per rank)\n", cv.what.c_str(), rl::format_bytes(cv.payload).c_str(),
                rl::format_bytes(cv.traffic).c_str());
  for (const auto& s : p.not_supported) std::printf("%s\n", s.c_str());
  for (const auto& s : p.notes) std::printf("note: %s\n", s.c_str());
  if (!p.fits()) {
    std::printf("\nto fit %s, cheapest first:\n", rl::format_bytes(in.device_memory).c_str());
    bool any = false;
    for (const auto& a : advice) {
      if (!a.fits) continue;
      any = true;
      std::printf("  %s: %s%s\n", a.change.c_str(), a.effect.c_str(), a.supported ? "" : " [not supported yet for training]");
    }
    if (!any) {
      std::printf("  no single change fits; closest:\n");
      for (size_t i = 0; i < advice.size() && i < 3; ++i)
        std::printf("  %s: %s%s\n", advice[i].change.c_str(), advice[i].effect.c_str(),
                    advice[i].supported ? "" : " [not supported yet for training]");
    }
  }
}

nlohmann::ordered_json plan_json(const rl::MemoryPlan& p, const std::vector<rl::PlanAdvice>& advice,
                                 const std::string& model) {
  const rl::PlanInputs& in = p.inputs;
  nlohmann::ordered_json j;
  j["model"] = model;
  j["params_per_rank"] = p.shapes.params;
  j["pp_rank"] = p.shapes.pp_rank;
  j["dtype"] = dtype_name(in.dtype);
  const rl::PlanLayout& l = in.layout;
  j["layout"] = {{"tp", l.tp}, {"pp", l.pp}, {"vpp", l.vpp}, {"cp", l.cp}, {"ep", l.ep}, {"etp", l.expert_tp()}, {"dp", l.dp},
                 {"sequence_parallel", l.sequence_parallel}, {"distributed_optimizer", l.distributed_optimizer}};
  j["recompute"] = in.recompute.describe();
  j["reuse_fp32_param"] = in.reuse_fp32_param;
  j["micro_batch"] = {{"max_tokens", p.micro.max_tokens}, {"per_mini_batch", p.micro.micro_batches},
                      {"mini_batch_seqs", p.micro.mini_batch_seqs}, {"optimizer_steps", p.micro.optimizer_steps}};
  nlohmann::ordered_json phases = nlohmann::ordered_json::array();
  for (const auto& ph : p.phases) {
    nlohmann::ordered_json b;
    for (size_t c = 0; c < kNumMemCategories; ++c) b[kCategoryNames[c]] = ph.bytes[c];
    phases.push_back({{"name", ph.name}, {"bytes", b}, {"total", ph.total()}, {"detail", ph.detail}});
  }
  j["phases"] = phases;
  j["actor_activations"] = {{"per_layer", p.actor.per_layer}, {"kept_layers", p.actor.kept_layers},
                            {"recompute_live", p.actor.recompute_live}, {"head", p.actor.head},
                            {"logits", p.actor.logits}, {"loss", p.actor.loss}, {"backward", p.actor.backward},
                            {"workspace", p.actor.workspace}, {"peak", p.actor.peak}, {"at", p.actor.at}};
  j["kv_cache"] = {{"bytes", p.kv_cache_bytes},
                   {"blocks", p.kv_blocks},
                   {"tokens", p.kv_tokens},
                   {"bytes_per_token", p.kv_bytes_per_token},
                   {"routing_bytes_per_token", p.kv_routing_bytes_per_token},
                   {"bytes_per_token_gqa_equivalent", p.kv_bytes_per_token_gqa}};
  j["active_params"] = p.active_params;
  j["flops_per_token"] = p.flops_per_token;
  if (in.model.moe.num_experts > 0)
    j["moe"] = {{"experts", in.model.moe.num_experts},
                {"top_k", in.model.moe.top_k},
                {"layers_on_rank", p.shapes.moe_layers},
                {"capacity_factor", in.moe.capacity_factor},
                {"pad_to_capacity", in.moe.pad_to_capacity},
                {"buffer_bytes", p.shapes.buffers}};
  j["peak"] = {{"bytes", p.peak()}, {"phase", p.phases[p.peak_phase].name}};
  j["device_memory"] = in.device_memory;
  j["fits"] = p.fits();
  j["flops"] = {{"actor_update", p.flops_actor}, {"scoring", p.flops_scoring}, {"rollout", p.flops_rollout}};
  nlohmann::ordered_json comm = nlohmann::ordered_json::array();
  for (const auto& cv : p.comm)
    comm.push_back({{"what", cv.what}, {"payload_bytes", cv.payload}, {"traffic_bytes", cv.traffic}, {"calls", cv.calls}});
  j["communication"] = comm;
  j["not_supported"] = p.not_supported;
  j["notes"] = p.notes;
  nlohmann::ordered_json adv = nlohmann::ordered_json::array();
  if (!p.fits())
    for (const auto& a : advice)
      adv.push_back({{"change", a.change}, {"effect", a.effect}, {"peak", a.peak}, {"fits", a.fits},
                     {"supported", a.supported}});
  j["advice"] = adv;
  return j;
}

}  // namespace

Status check_layout_fits(const config::Config& c, const std::string& model_dir, int world_size,
                         int64_t device_memory_bytes, Device device) {
  PlanContext ctx;
  ctx.world = world_size;
  ctx.device_memory = device_memory_bytes;
  ctx.for_train = true;
  ctx.on_device = device != Device::CPU;
  rl::PlanInputs in;
  try {
    in = plan_inputs(c, model_dir, ctx);
  } catch (const std::exception& e) {
    return Status::error(e.what());
  }
  const rl::MemoryPlan p = rl::plan_memory(in);
  if (p.fits()) return Status::ok();
  std::string msg = "the planned peak " + rl::format_bytes(p.peak()) + " per rank (" + p.phases[p.peak_phase].name +
                    ") exceeds the device memory " + rl::format_bytes(in.device_memory) +
                    (ctx.on_device ? " of the GPU" : " (KESTREL_DEVICE_MEMORY or MemTotal)") +
                    "; `kestrel plan` with the same arguments shows the table. "
                    "To fit:";
  int shown = 0;
  for (const auto& a : rl::plan_advice(in))
    if (a.fits && shown < 3) {
      msg += " " + a.change + " (" + a.effect + (a.supported ? "" : ", not supported yet") + ");";
      ++shown;
    }
  if (shown == 0) msg += " no single change fits; lower the micro-batch token budget or the response length;";
  return Status::error(msg);
}

int cmd_plan(const std::vector<std::string>& argv) {
  std::vector<std::string> args;
  PlanContext ctx;
  bool json = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    auto value = [&](const std::string& flag) -> std::string {
      const std::string eq = flag + "=";
      if (a.rfind(eq, 0) == 0) return a.substr(eq.size());
      if (i + 1 >= argv.size()) KS_FAIL("kestrel plan: ", flag, " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: kestrel plan [--config FILE.yaml] [key=value ...] [--device-memory SIZE] [--world N] "
          "[--reuse-fp32-param] [--json]\n\n"
          "The memory model of `kestrel train` with the same config and overrides, before anything loads (config.json "
          "only):\nper-rank bytes by allocator category in each phase (rollout, scoring, critic, actor update), the "
          "peak,\nwhether it fits, FLOPs and communication per step, and what to change when it does not fit.\n\n"
          "  --device-memory SIZE  memory per rank (80GiB, 24GB, bytes); default KESTREL_DEVICE_MEMORY or MemTotal / "
          "ranks per node\n"
          "  --world N             processes (default trainer.n_gpus_per_node x nnodes when set, else 1); dp = N / "
          "(tp x pp x cp)\n"
          "  --reuse-fp32-param    plan the actor's bf16 master as the bf16 weight + a 16-bit residual\n"
          "  --json                print JSON\n"
          "  --show-builtin-layer  print kestrel train's built-in run layer (applied without --config and data)\n\n"
          "Tensor (with sequence parallelism), pipeline (virtual stages included), context and expert parallelism\n"
          "  (expert_model_parallel_size, expert_tensor_parallel_size) are planned as kestrel train runs them, MoE and\n"
          "  MLA models included. Accepted here as overrides where the config does not declare them yet (shown as not\n"
          "  supported yet): %soverride_transformer_config.reuse_fp32_param; for MoE models\n"
          "  override_transformer_config.moe_{router_load_balancing_type, aux_loss_coeff, z_loss_coeff,\n"
          "  expert_capacity_factor, pad_expert_input_to_capacity, router_dtype},\n"
          "  actor_rollout_ref.model.override_config.moe_config.freeze_moe_router and\n"
          "  rollout.enable_rollout_routing_replay. Activation recompute (override_transformer_config.recompute_*,\n"
          "  model.enable_gradient_checkpointing) is planned as kestrel train runs it.\n\n"
          "Exit status: 0 fits, 3 does not fit, 1 bad input.\n",
          M.c_str());
      return 0;
    }
    if (a == "--show-builtin-layer") {
      for (const auto& o : builtin_train_layer()) std::printf("%s\n", o.c_str());
      return 0;
    }
    if (a == "--json") json = true;
    else if (a == "--reuse-fp32-param") ctx.reuse_fp32_param = true;
    else if (a == "--device-memory" || a.rfind("--device-memory=", 0) == 0)
      ctx.device_memory = rl::parse_bytes(value("--device-memory"), "--device-memory").value();
    else if (a == "--world" || a.rfind("--world=", 0) == 0) {
      const std::string v = value("--world");
      char* end = nullptr;
      ctx.world = std::strtoll(v.c_str(), &end, 10);
      if (*end != '\0' || ctx.world < 1) KS_FAIL("--world: expected a positive process count, got '", v, "'");
    } else {
      args.push_back(a);
    }
  }
  ctx.aside = take_aside(args);
  const config::Config c = load_command_config(config::ppo_schema(), args, train_first_layer(args, "kestrel plan"));
  std::vector<std::string> planned;
  const rl::PlanInputs in = plan_inputs(c, "", ctx, &planned);
  rl::MemoryPlan p = rl::plan_memory(in);
  for (const std::string& key : planned)
    p.not_supported.push_back("not supported yet: " + key + " in kestrel train's config (Kestrel builds it; planned "
                              "from the command line)");
  if (in.reuse_fp32_param && !reuse_declared(c, OT + "reuse_fp32_param"))
    p.not_supported.push_back("not supported yet: " + OT + "reuse_fp32_param in kestrel train's config (the engine "
                              "builds it; planned: -2 B/param of optimizer state)");
  std::vector<rl::PlanAdvice> advice;
  if (!p.fits()) advice = rl::plan_advice(in);
  const std::string model = c.get_string("actor_rollout_ref.model.path");
  if (json) std::printf("%s\n", plan_json(p, advice, model).dump(2).c_str());
  else print_table(p, advice, model);
  return p.fits() ? 0 : 3;
}

}  // namespace kestrel::cli
