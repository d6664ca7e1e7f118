#include "model/pipeline_params.h"

#include <climits>
#include <map>
#include <set>

#include "model/ep_state.h"

namespace kestrel::model {

std::vector<ParamInfo> whole_model_params(const io::ModelConfig& cfg, const ModelOptions& opts) {
  const int64_t D = cfg.hidden_size, V = cfg.vocab_size;
  std::vector<ParamInfo> out;
  out.push_back({"model.embed_tokens.weight", {V, D}});
  // The names and shapes come from the block itself (one body for every
  // layer): a factory that records them and allocates nothing.
  BlockDims dims;
  dims.D = D;
  dims.F = cfg.intermediate_size;
  dims.hd = cfg.head_dim;
  dims.heads = parallel::tp_heads(cfg.num_attention_heads, cfg.num_key_value_heads, 0, 1);
  dims.eps = float(cfg.rms_norm_eps);
  dims.dtype = opts.dtype;
  const ParamFactory record = [](std::string name, Shape shape, bool) {
    Param p;
    p.name = std::move(name);
    p.full_shape = std::move(shape);
    return p;
  };
  std::vector<ParamInfo> buffers;  // after every parameter, as CausalLM::state_tensors() lists them
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    Block b(cfg, dims, i, record);
    for (Param* p : b.params()) out.push_back({p->name, p->full_shape});
    for (Param* p : b.buffers()) buffers.push_back({p->name, p->full_shape, /*buffer=*/true});
  }
  out.push_back({"model.norm.weight", {D}});
  if (opts.value_head) {
    out.push_back({"score.weight", {1, D}});
    if (opts.value_head_bias) out.push_back({"score.bias", {1}});
  } else if (!cfg.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {V, D}});
  }
  out.insert(out.end(), buffers.begin(), buffers.end());
  return out;
}

Result<std::vector<PipelineParam>> pipeline_params(const std::vector<const CausalLM*>& chunks) {
  KS_CHECK(!chunks.empty() && chunks[0], "pipeline_params: no model chunk given");
  const CausalLM& first = *chunks[0];
  comm::ProcessGroup& pp = first.pp();
  // The local copies by name; every chunk of a rank in the same groups.
  std::map<std::string, std::pair<const Param*, const CausalLM*>> mine;
  for (const CausalLM* c : chunks) {
    KS_CHECK(c && &c->pp() == &pp && &c->tp() == &first.tp() && c->dtype() == first.dtype() &&
                 c->is_value_model() == first.is_value_model(),
             "pipeline_params: the chunks of one rank must share the pp and tp groups, the dtype and the head kind");
    for (Param* p : const_cast<CausalLM*>(c)->state_tensors()) mine.emplace(p->name, std::make_pair(p, c));
  }
  // score.bias is listed as a candidate: the last stage alone knows whether
  // the model has one, and the owners below tell everyone.
  ModelOptions o = first.options();
  o.value_head_bias = o.value_head;
  const std::vector<ParamInfo> all = whole_model_params(first.config(), o);

  // Expert parallelism: a stage holds a routed expert of its layers on one of
  // its ep ranks; the others hold the layer (its router) but not the expert.
  const int64_t ep = first.ep().size(), E = first.config().moe.num_experts;
  std::set<std::string> my_layers;  // "model.layers.<i>." prefixes this rank's chunks hold
  if (ep > 1)
    for (const auto& [name, held] : mine)
      if (name.rfind("model.layers.", 0) == 0) my_layers.insert(name.substr(0, name.find('.', 13) + 1));
  std::vector<PipelineParam> out;
  out.reserve(all.size());
  int64_t bad = 0, found = 0;
  std::string first_bad;
  for (const ParamInfo& info : all) {
    PipelineParam p;
    p.name = info.name;
    p.full_shape = info.full_shape;
    p.buffer = info.buffer;
    const int64_t e = ep > 1 ? routed_expert_index(info.name) : -1;
    if (e >= 0) p.ep_owner = int(e / (E / ep));
    auto it = mine.find(info.name);
    if (it != mine.end()) {
      ++found;
      p.local = it->second.first;
      p.chunk = it->second.second;
      if (p.local->full_shape != info.full_shape && !bad++)
        first_bad = "'" + info.name + "' is " + shape_str(p.local->full_shape) + ", the config says " +
                    shape_str(info.full_shape);
    }
    out.push_back(std::move(p));
  }
  if (found != int64_t(mine.size()) && !bad++) first_bad = "a parameter of this rank is not in the whole model";
  // The stages must agree on the list (its length and the dtype, as the
  // transfers size their buffers from them) before the owners' all-reduce.
  int64_t agree[5] = {int64_t(all.size()), -int64_t(all.size()), int64_t(first.dtype()), -int64_t(first.dtype()),
                      bad};
  pp.all_reduce(agree, 5, DType::I64, comm::ReduceOp::Max);
  if (agree[0] != -agree[1] || agree[2] != -agree[3])
    return KS_ERR("pipeline stages disagree on the model: ", agree[0] == -agree[1] ? "dtypes" : "parameter counts",
                  " differ over the pp group (", pp.name(), ", size ", pp.size(),
                  "); every stage must be built from the same config.json and dtype");
  if (agree[4] > 0)
    return KS_ERR("pipeline stage mismatch on pp rank ", pp.rank(), ": ",
                  first_bad.empty() ? "another stage's parameters do not match the whole model" : first_bad,
                  "; every stage must be a slice of the same model");

  std::vector<int32_t> owner(out.size());
  auto holds = [&](const PipelineParam& p) {
    if (p.local) return true;
    return p.ep_owner >= 0 && my_layers.count(p.name.substr(0, p.name.find('.', 13) + 1)) > 0;
  };
  for (size_t i = 0; i < out.size(); ++i) owner[i] = holds(out[i]) ? pp.rank() : INT32_MAX;
  pp.all_reduce(owner.data(), int64_t(owner.size()), DType::I32, comm::ReduceOp::Min);
  std::vector<PipelineParam> held;
  held.reserve(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (owner[i] == INT32_MAX) {
      if (out[i].name == "score.bias") continue;  // a value head without a bias
      return KS_ERR("no pipeline stage holds '", out[i].name, "' (pp group ", pp.name(), ", size ", pp.size(),
                    "): the stages' layer ranges must cover every layer, with the embedding on the first and the "
                    "head on the last");
    }
    out[i].owner = owner[i];
    held.push_back(std::move(out[i]));
  }
  return held;
}

}  // namespace kestrel::model
