#include "model/parallel_setup.h"

#include "comm/hierarchical_a2a.h"

namespace kestrel::model {

ModelParallel model_parallel_for(const parallel::ProcessGrid& grid) {
  ModelParallel p;
  p.tp = grid.group(parallel::GroupKind::Tp);
  p.sequence_parallel = grid.layout().dims().sequence_parallel && p.tp->size() > 1;
  p.pp = grid.group(parallel::GroupKind::Pp);
  p.ep = grid.group(parallel::GroupKind::Ep);
  return p;
}

void set_context_parallel(ModelParallel& p, const comm::World& world, const parallel::ProcessGrid& grid,
                          parallel::CpAlgo algo, int ulysses_degree_in_cp) {
  const int cp = grid.layout().dims().cp;
  if (cp == 1) return;
  const int u = parallel::cp_ulysses_degree(algo, cp, ulysses_degree_in_cp);
  p.cp = std::make_shared<const parallel::CpGroups>(parallel::make_cp_groups(world, grid, u));
}

void set_pipeline_stage(ModelOptions& o, const std::vector<parallel::StageChunk>& mine) {
  KS_CHECK(!mine.empty(), "a pipeline stage holds at least one chunk");
  o.chunks.clear();
  for (const parallel::StageChunk& c : mine) o.chunks.push_back({c.first_layer, c.num_layers});
  o.has_embedding = mine.front().has_embedding;
  o.has_head = mine.back().has_head;
}

std::vector<parallel::DpParam> dp_params(CausalLM& m) {
  std::vector<parallel::DpParam> out;
  for (Param* p : m.params()) out.push_back({p->name, &p->weight, &p->grad, m.grad_stage(*p), p->norm_counted});
  return out;
}

parallel::ModelFacts model_facts(const io::ModelConfig& c, bool pipelined) {
  parallel::ModelFacts f;
  f.n_heads = c.num_attention_heads;
  f.n_kv_heads = c.num_key_value_heads;
  f.n_layers = pipelined ? 0 : c.num_hidden_layers;
  f.vocab = c.vocab_size;
  f.vocab_padded = true;  // CausalLM pads it for tp (ModelOptions::make_vocab_size_divisible_by)
  f.ffn = c.intermediate_size;
  return f;
}

void set_expert_dispatch(ModelParallel& p, const comm::World& world, const MoeTrainOptions& moe) {
  KS_CHECK(!(moe.hierarchical_alltoallv && moe.dispatcher == MoeDispatcher::AllGather),
           "moe_hierarchical_alltoallv=true exchanges the alltoall dispatcher's rows and "
           "moe_token_dispatcher_type=allgather has no all-to-all: set moe_token_dispatcher_type=alltoall or "
           "moe_hierarchical_alltoallv=false");
  p.ep_hier.reset();
  if (!moe.hierarchical_alltoallv || !p.ep || p.ep->size() == 1) return;
  p.ep_hier = std::make_shared<comm::HierarchicalA2a>(world, p.ep);
}

}  // namespace kestrel::model
