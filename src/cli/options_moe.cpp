// The mixture-of-experts keys of one model (config/schema_moe.cpp) ->
// model::MoeTrainOptions, read before config.json (MoeKeys) and checked
// against it once it is read (moe_train_options). See options.h.
#include <cstdio>

#include "cli/options.h"
#include "model/moe_mlp.h"

namespace kestrel::cli {

namespace {

std::string num_text(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// The keys Megatron takes from its arguments and Kestrel from config.json, each with the config.json value
// ("" = the model has none) and the config.json key named in messages.
struct RoutingFact {
  const char* key;
  std::string json_value;
  std::string json_key;
};

std::vector<RoutingFact> routing_facts(const io::ModelConfig& cfg) {
  const io::MoeConfig& m = cfg.moe;
  const bool moe = model::num_moe_layers(cfg) > 0;
  const bool grouped = moe && m.group_limit != io::MoeConfig::GroupLimit::None;
  const bool deepseek = cfg.arch == io::Arch::DeepseekV2 || cfg.arch == io::Arch::DeepseekV3;
  auto opt = [&](bool has, int64_t v) { return has ? std::to_string(v) : std::string(); };
  return {
      {"num_moe_experts", opt(moe, m.num_experts), deepseek ? "n_routed_experts" : "num_experts"},
      {"moe_router_topk", opt(moe, m.top_k), "num_experts_per_tok"},
      {"moe_router_score_function", moe ? (m.sigmoid_scores ? "sigmoid" : "softmax") : "", "scoring_func"},
      // A sigmoid router ignores it (empty json_value with moe: any value).
      {"moe_router_pre_softmax", moe && !m.sigmoid_scores ? (m.norm_topk_prob ? "false" : "true") : "",
       "norm_topk_prob"},
      {"moe_router_num_groups", opt(grouped, m.n_group), "n_group"},
      {"moe_router_group_topk", opt(grouped, m.topk_group), "topk_group"},
      {"moe_router_topk_scaling_factor", moe ? num_text(m.routed_scaling_factor) : "", "routed_scaling_factor"},
      {"moe_ffn_hidden_size", opt(moe, m.moe_intermediate_size), "moe_intermediate_size"},
      {"moe_shared_expert_intermediate_size", opt(moe && m.shared_intermediate_size > 0, m.shared_intermediate_size),
       deepseek ? "moe_intermediate_size x n_shared_experts" : "shared_expert_intermediate_size"},
  };
}

}  // namespace

MoeKeys read_moe_keys(const config::Config& c, const std::string& prefix, const std::string& freeze_key,
                      bool trained) {
  MoeKeys k;
  k.prefix = prefix;
  model::MoeTrainOptions& o = k.train;
  const std::string& P = prefix;
  if (trained) {
    o.load_balancing_type = c.get_string(P + "moe_router_load_balancing_type");
    o.aux_loss_coeff = c.get_float(P + "moe_aux_loss_coeff");
    o.z_loss_coeff = c.get_float_or(P + "moe_z_loss_coeff", 0.0);
    k.expert_bias = c.get_bool(P + "moe_router_enable_expert_bias");
    k.expert_bias_origin = c.origin(P + "moe_router_enable_expert_bias");
    const double rate = c.get_float(P + "moe_router_bias_update_rate");
    o.bias_update_rate = k.expert_bias ? rate : 0.0;
    if (!freeze_key.empty()) o.freeze_router = c.get_bool(freeze_key);
  }
  o.capacity_factor = c.get_float_or(P + "moe_expert_capacity_factor", 0.0);
  o.pad_to_capacity = c.get_bool(P + "moe_pad_expert_input_to_capacity");
  if (o.pad_to_capacity && o.capacity_factor <= 0)
    KS_FAIL(c.origin(P + "moe_pad_expert_input_to_capacity"), ": ", P,
            "moe_pad_expert_input_to_capacity=true pads each expert to its capacity and needs ", P,
            "moe_expert_capacity_factor (null, from ", c.origin(P + "moe_expert_capacity_factor"),
            "); set a capacity factor or leave the padding off");
  const std::string policy = c.get_string(P + "moe_token_drop_policy");
  o.drop_policy = policy == "position" ? ops::MoeDropPolicy::Position : ops::MoeDropPolicy::Probs;
  o.router_logits_fp32 = c.get_string_or(P + "moe_router_dtype", "") == "fp32";
  // Expert parallelism's dispatch (forwards too: the reference's scoring moves rows as the actor's does).
  // flex is refused by the schema (not in the supported values). Trees without EP (kestrel logprobs)
  // do not declare the keys.
  if (c.schema().find(P + "moe_token_dispatcher_type")) {
    o.dispatcher = c.get_string(P + "moe_token_dispatcher_type") == "alltoall" ? model::MoeDispatcher::AllToAll
                                                                               : model::MoeDispatcher::AllGather;
    o.hierarchical_alltoallv = c.get_bool(P + "moe_hierarchical_alltoallv");
    if (o.hierarchical_alltoallv && o.dispatcher == model::MoeDispatcher::AllGather)
      KS_FAIL(c.origin(P + "moe_hierarchical_alltoallv"), ": ", P, "moe_hierarchical_alltoallv=true exchanges the "
              "alltoall dispatcher's rows through the nodes' leaders, and ", P, "moe_token_dispatcher_type=allgather ",
              "(from ", c.origin(P + "moe_token_dispatcher_type"), ") has no all-to-all; set ", P,
              "moe_token_dispatcher_type=alltoall or leave moe_hierarchical_alltoallv false");
  }
  for (const RoutingFact& f : routing_facts(io::ModelConfig{})) {
    const std::string key = P + f.key;
    if (c.is_null(key)) continue;
    const config::KeyDecl* d = c.schema().find(key);
    std::string text;
    switch (d ? d->type : config::Type::String) {
      case config::Type::Int: text = std::to_string(c.get_int(key)); break;
      case config::Type::Float: text = num_text(c.get_float(key)); break;
      case config::Type::Bool: text = c.get_bool(key) ? "true" : "false"; break;
      default: text = c.get_string(key); break;
    }
    k.routing.push_back({f.key, text, c.origin(key)});
  }
  return k;
}

model::MoeTrainOptions moe_train_options(const MoeKeys& k, const io::ModelConfig& cfg, const std::string& model) {
  const std::string what = std::string(io::arch_name(cfg.arch)) + " model " + model;
  if (k.expert_bias && !cfg.moe.score_correction_bias)
    KS_FAIL(k.expert_bias_origin, ": ", k.prefix, "moe_router_enable_expert_bias=true moves each MoE layer's "
            "e_score_correction_bias, and the ", what, " has none (its config.json does not route with a "
            "correction bias; DeepSeek-V3's noaux_tc does); set it false");
  const std::vector<RoutingFact> facts = routing_facts(cfg);
  for (const MoeKeys::Routing& r : k.routing)
    for (const RoutingFact& f : facts) {
      if (r.key != f.key) continue;
      const bool any = std::string(f.key) == "moe_router_pre_softmax" && cfg.moe.sigmoid_scores &&
                       model::num_moe_layers(cfg) > 0;
      if (any || r.value == f.json_value) break;
      KS_FAIL(r.origin, ": ", k.prefix, r.key, "=", r.value, " differs from the ", what, ": ",
              f.json_value.empty() ? "its config.json has no " + f.json_key
                                   : "config.json's " + f.json_key + " gives " + f.json_value,
              ". Kestrel takes the routing from config.json: set ", k.prefix, r.key, "=",
              f.json_value.empty() ? "null" : f.json_value, " or leave it unset");
    }
  return k.train;
}

}  // namespace kestrel::cli
