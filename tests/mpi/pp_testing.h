// Pipeline layouts for the multi-rank tests of the rollout weights and the HF
// export under pipeline parallelism (pp_weights_test.cpp, pp_save_test.cpp).
// The grid is built here from world splits (parallel::check_supported still
// refuses pp > 1): Megatron's order, tp fastest, so world rank r is tp rank
// r % tp of pipeline rank r / tp. Stages hold contiguous layer ranges of a
// 4-layer tiny model; the interleaved layout gives each of 2 pp ranks two
// chunks (rank 0: layers 0 with the embedding and 2; rank 1: 1 and 3 with
// the head).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/world.h"
#include "model/transformer.h"
#include "rollout/tiny_model.h"
#include "tp_testing.h"

namespace kestrel::testing {

struct PpLayout {
  int pp = 1, tp = 1;
  bool interleaved = false;  // two chunks per pp rank (pp 2 only)
  std::shared_ptr<comm::ProcessGroup> pp_group, tp_group;
  std::string name() const {
    return "pp" + std::to_string(pp) + "xtp" + std::to_string(tp) + (interleaved ? " interleaved" : "");
  }
  int pp_rank() const { return pp_group->rank(); }
};

// Every layout whose size is the world's (collective: every rank builds the
// same list in the same order). 2 ranks: PP2 and PP2 interleaved; 4 ranks:
// PP2xTP2, PP4 and PP2xTP2 interleaved.
inline std::vector<PpLayout> pp_layouts() {
  const int n = world_group().size(), r = world_group().rank();
  std::vector<PpLayout> out;
  for (int pp : {2, 4}) {
    if (n % pp != 0) continue;
    for (bool inter : {false, true}) {
      if (inter && pp != 2) continue;
      PpLayout l;
      l.pp = pp;
      l.tp = n / pp;
      l.interleaved = inter;
      l.tp_group = comm::World::current()->split(r / l.tp, r, "tp");
      l.pp_group = comm::World::current()->split(r % l.tp, r, "pp");
      out.push_back(l);
    }
  }
  return out;
}

// The tiny rollout model with 4 layers. llama: q/k/v, o_proj and MLP biases,
// untied lm_head. qwen3: per-head q/k norms, tied embeddings.
inline io::ModelConfig pp_config(const std::string& kind) {
  io::ModelConfig c = rollout::testing::tiny_config(kind == "qwen3");
  c.num_hidden_layers = 4;
  c.tie_word_embeddings = kind == "qwen3";
  c.attention_bias = kind == "llama";
  c.o_proj_bias = kind == "llama";
  c.mlp_bias = kind == "llama";
  return c;
}

struct Slice {
  int64_t first = 0, n = 0;
  bool embed = false, head = false;
};

// The chunks pipeline rank `rank` holds.
inline std::vector<Slice> slices_of(const PpLayout& l, int rank) {
  if (l.interleaved) return {{rank, 1, rank == 0, false}, {rank + 2, 1, false, rank == 1}};
  if (l.pp == 2) return {rank == 0 ? Slice{0, 1, true, false} : Slice{1, 3, false, true}};  // uneven on purpose
  return {{rank, 1, rank == 0, rank == l.pp - 1}};
}

// init_random gives every tensor the whole model's values; the biases (zero
// after init) get random values keyed by name, the same in every layout.
inline std::unique_ptr<model::CausalLM> pp_model(const std::string& kind, model::ModelOptions o, const Slice* s) {
  if (s) {
    o.first_layer = s->first;
    o.num_layers = s->n;
    o.has_embedding = s->embed;
    o.has_head = s->head;
  }
  auto m = model::CausalLM::init_random(pp_config(kind), o, 7, 0.1);
  for (model::Param* p : m->params()) {
    if (p->name.find(".bias") == std::string::npos) continue;
    Tensor full = rand_full(p->full_shape, 300 + std::hash<std::string>{}(p->name) % 100000, 0.05f, o.dtype);
    p->weight = parallel::shard_tensor(full, p->shard, m->tp().rank(), m->tp().size(), p->name);
  }
  return m;
}

// This rank's chunks of `kind` in layout l.
inline std::vector<std::unique_ptr<model::CausalLM>> pp_stage(const std::string& kind, const PpLayout& l,
                                                              model::ModelOptions o = {}) {
  o.parallel.tp = l.tp_group;
  o.parallel.pp = l.pp_group;
  std::vector<std::unique_ptr<model::CausalLM>> out;
  for (const Slice& s : slices_of(l, l.pp_rank())) out.push_back(pp_model(kind, o, &s));
  return out;
}

inline std::vector<const model::CausalLM*> chunk_ptrs(const std::vector<std::unique_ptr<model::CausalLM>>& v) {
  std::vector<const model::CausalLM*> out;
  for (const auto& m : v) out.push_back(m.get());
  return out;
}

// Stand-in for an optimizer step, identical in every layout: w <- 1.5 w + 0.01.
inline void perturb(model::Param& p) {
  for (int64_t i = 0; i < p.weight.numel(); ++i) p.weight.set(i, 1.5f * p.weight.get(i) + 0.01f);
}
inline void perturb(model::CausalLM& m) {
  for (model::Param* p : m.params()) perturb(*p);
}

}  // namespace kestrel::testing
