#include "model/recompute.h"

#include <algorithm>

namespace kestrel::model {

namespace {

// Blocks [first, first + count) clipped to [0, L); count -1 = through the last.
void mark(std::vector<BlockRecompute>& p, int64_t first, int64_t count, bool BlockRecompute::*flag) {
  const int64_t L = int64_t(p.size());
  const int64_t end = count < 0 ? L : std::min(L, first + count);
  for (int64_t i = std::max<int64_t>(first, 0); i < end; ++i) p[size_t(i)].*flag = true;
}

}  // namespace

Status RecomputePolicy::validate(const std::string& k) const {
  const bool full = granularity == RecomputeGranularity::Full;
  if (full && (method == RecomputeMethod::None || num_layers < 1))
    return KS_ERR(k, "recompute_granularity=full needs ", k, "recompute_method (uniform or block) and ", k,
                  "recompute_num_layers (>= 1) set (Megatron's rule); got recompute_method=",
                  method == RecomputeMethod::None ? "null" : method == RecomputeMethod::Uniform ? "uniform" : "block",
                  ", recompute_num_layers=", num_layers < 0 ? std::string("null") : std::to_string(num_layers));
  if (!full && (method != RecomputeMethod::None || num_layers >= 0))
    return KS_ERR(k, "recompute_method and ", k, "recompute_num_layers apply to recompute_granularity=full only (",
                  granularity == RecomputeGranularity::Selective ? "selective" : "null",
                  " here): set recompute_granularity=full, or leave both null (Megatron's rule)");
  if (granularity == RecomputeGranularity::Selective && !core_attn && !layernorm && !mlp)
    return KS_ERR(k, "recompute_granularity=selective with an empty ", k,
                  "recompute_modules: list at least one of core_attn, layernorm, mlp");
  if (full && method != RecomputeMethod::Block && (activation_function || norm))
    return KS_ERR(k, activation_function ? "recompute_activation_function" : "recompute_norm",
                  "=true combines with full recompute only with ", k,
                  "recompute_method=block (MindSpeed: the full-recompute layers come first, the others after): set "
                  "recompute_method=block or drop one of them");
  if (activation_function_num_layers < -1 || norm_num_layers < -1)
    return KS_ERR(k, activation_function_num_layers < -1 ? "recompute_activation_function_num_layers"
                                                         : "recompute_norm_num_layers",
                  " must be >= 0 or null (every layer)");
  return Status::ok();
}

std::vector<BlockRecompute> RecomputePolicy::plan(int64_t L) const {
  std::vector<BlockRecompute> p(size_t(std::max<int64_t>(L, 0)));
  int64_t after_full = 0;  // first block after the full-recompute ones (method block)
  if (granularity == RecomputeGranularity::Full) {
    const int64_t n = std::max<int64_t>(num_layers, 1);
    const int64_t covered = method == RecomputeMethod::Uniform ? L : std::min(L, n);
    const int64_t chunk = method == RecomputeMethod::Uniform ? n : 1;
    for (int64_t i = 0; i < covered; ++i) {
      BlockRecompute& b = p[size_t(i)];
      b.full = true;
      b.chunk_first = i / chunk * chunk;
      b.chunk_last = std::min(L, b.chunk_first + chunk) - 1;
    }
    after_full = covered;
  }
  if (granularity == RecomputeGranularity::Selective) {
    if (core_attn) mark(p, 0, -1, &BlockRecompute::core_attn);
    if (layernorm) mark(p, 0, -1, &BlockRecompute::norm);
    if (mlp) mark(p, 0, -1, &BlockRecompute::mlp);
  }
  if (activation_function) mark(p, after_full, activation_function_num_layers, &BlockRecompute::act);
  if (norm) mark(p, after_full, norm_num_layers, &BlockRecompute::norm);
  return p;
}

std::string RecomputePolicy::describe() const {
  std::string s;
  auto plus = [&](const std::string& part) { s += (s.empty() ? "" : "+") + part; };
  if (granularity == RecomputeGranularity::Full)
    plus(std::string("full/") + (method == RecomputeMethod::Uniform ? "uniform/" : "block/") +
         std::to_string(num_layers));
  if (granularity == RecomputeGranularity::Selective) {
    std::string m;
    for (auto [on, name] : {std::pair{core_attn, "core_attn"}, {layernorm, "layernorm"}, {mlp, "mlp"}})
      if (on) m += (m.empty() ? "" : ",") + std::string(name);
    plus("selective[" + m + "]");
  }
  if (activation_function)
    plus("act" + (activation_function_num_layers >= 0 ? "/" + std::to_string(activation_function_num_layers) : ""));
  if (norm) plus("norm" + (norm_num_layers >= 0 ? "/" + std::to_string(norm_num_layers) : ""));
  return s.empty() ? "none" : s;
}

Result<RecomputePolicy> make_recompute_policy(const std::string& granularity, const std::string& method,
                                              int64_t num_layers, const std::vector<std::string>& modules,
                                              bool activation_function, int64_t activation_function_num_layers,
                                              bool norm, int64_t norm_num_layers, const std::string& k) {
  RecomputePolicy p;
  if (granularity == "full") p.granularity = RecomputeGranularity::Full;
  else if (granularity == "selective") p.granularity = RecomputeGranularity::Selective;
  else if (!granularity.empty() && granularity != "null")
    return KS_ERR(k, "recompute_granularity=", granularity, ": use full, selective or null");
  if (method == "uniform") p.method = RecomputeMethod::Uniform;
  else if (method == "block") p.method = RecomputeMethod::Block;
  else if (!method.empty() && method != "null")
    return KS_ERR(k, "recompute_method=", method, ": use uniform, block or null");
  p.num_layers = num_layers;
  if (p.granularity == RecomputeGranularity::Selective) {
    for (const std::string& m : modules) {
      if (m == "core_attn") p.core_attn = true;
      else if (m == "layernorm") p.layernorm = true;
      else if (m == "mlp") p.mlp = true;
      else if (m == "moe_act" || m == "moe" || m == "shared_experts" || m == "mla_up_proj")
        return KS_ERR("not supported yet: ", k, "recompute_modules entry ", m,
                      " (MoE/MLA are not built; the dense modules are core_attn, layernorm, mlp)");
      else
        return KS_ERR(k, "recompute_modules entry ", m, ": use core_attn, layernorm or mlp");
    }
  }
  p.activation_function = activation_function;
  p.activation_function_num_layers = activation_function_num_layers;
  p.norm = norm;
  p.norm_num_layers = norm_num_layers;
  if (Status s = p.validate(k); !s.is_ok()) return s;
  return p;
}

}  // namespace kestrel::model
