// The rollout's copy of the weights when the training model is a pipeline
// stage (rollout/reshard.h, pp > 1): the whole model, filled from the stages,
// equals one process's rollout copy of the whole model bit for bit (rollout
// tp 1, 2 and the world; f32 and a bf16 rollout dtype; tied and untied
// embeddings; PP2, PP2 interleaved, PP2xTP2, PP4), follows a training step
// after refresh(), counts the bytes it received over tp and pp, and greedy
// generation on it equals generation on the whole model.
// Run by tests/scripts/mpi_pp_weights.sh with 2 and 4 ranks.
#include <cstring>

#include "pp_testing.h"
#include "rollout/engine.h"
#include "rollout/reshard.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

std::shared_ptr<comm::ProcessGroup> world_ptr() { return comm::World::current()->group(); }

// The rollout tp groups to try: 1, adjacent pairs (across stages under PP4),
// the whole world (spanning every stage), and nullptr (the training tp group).
struct RolloutGroup {
  std::string name;
  std::shared_ptr<comm::ProcessGroup> tp;
};
std::vector<RolloutGroup> rollout_groups() {
  const int r = world_group().rank();
  std::vector<RolloutGroup> out = {{"rollout tp1", comm::local_group("rollout_tp")}};
  out.push_back({"rollout tp2 pairs", comm::World::current()->split(r / 2, r, "rollout_tp")});
  if (world_group().size() > 2) out.push_back({"rollout tp world", world_ptr()});
  out.push_back({"rollout = training tp", nullptr});
  return out;
}

// Every parameter of `got` equals `want`'s byte for byte (same layout).
void expect_same_weights(const model::CausalLM& got, const model::CausalLM& want, const std::string& what) {
  auto gp = const_cast<model::CausalLM&>(got).params();
  auto wp = const_cast<model::CausalLM&>(want).params();
  EXPECT_TRUE(got.is_whole_model()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(got.tp().size(), want.tp().size()) << what;
  ASSERT_EQ(gp.size(), wp.size()) << what;
  for (size_t i = 0; i < gp.size(); ++i) {
    ASSERT_EQ(gp[i]->name, wp[i]->name) << what;
    ASSERT_TRUE(gp[i]->weight.defined()) << what << ": " << gp[i]->name;
    ASSERT_EQ(gp[i]->weight.shape(), wp[i]->weight.shape()) << what << ": " << gp[i]->name;
    ASSERT_EQ(gp[i]->weight.dtype(), wp[i]->weight.dtype()) << what << ": " << gp[i]->name;
    EXPECT_EQ(std::memcmp(gp[i]->weight.raw(), wp[i]->weight.raw(), wp[i]->weight.nbytes()), 0)
        << what << ": " << gp[i]->name;
  }
}

// The pipeline rank that provides a whole-model parameter: the first chunk
// (in pipeline order) holding it.
int owner_of(const PpLayout& l, const std::string& name) {
  for (int r = 0; r < l.pp; ++r)
    for (const Slice& s : slices_of(l, r)) {
      if (name == "model.embed_tokens.weight" && s.embed) return r;
      if (name.rfind("model.layers.", 0) == 0) {
        const int64_t layer = std::stoll(name.substr(13));
        if (layer >= s.first && layer < s.first + s.n) return r;
      } else if (name != "model.embed_tokens.weight" && s.head) {
        return r;
      }
    }
  return -1;
}

// Bytes received: each tensor of another stage once over pp (in the smaller
// dtype), and this stage's sharded tensors from the tp - 1 other ranks.
int64_t expected_received(const PpLayout& l, const std::vector<std::unique_ptr<model::CausalLM>>& stage,
                          const model::CausalLM& whole, DType rollout_dtype) {
  const DType train = stage[0]->dtype();
  const size_t wire = std::min(dtype_size(train), dtype_size(rollout_dtype));
  int64_t n = 0;
  for (model::Param* p : const_cast<model::CausalLM&>(whole).params()) {
    const int o = owner_of(l, p->name);
    EXPECT_GE(o, 0) << p->name;
    if (o != l.pp_rank()) {
      n += shape_numel(p->full_shape) * int64_t(wire);
      continue;
    }
    const model::Param* mine = nullptr;
    for (const auto& c : stage)
      if (!mine) mine = c->find_param(p->name);
    EXPECT_TRUE(mine) << p->name;
    if (mine && l.tp > 1 && mine->shard.kind != parallel::ShardKind::Replicated)
      n += int64_t(l.tp - 1) * int64_t(mine->weight.nbytes());
  }
  return n;
}

rollout::EngineConfig engine_config() {
  rollout::EngineConfig c;
  c.block_size = 16;
  c.num_blocks = 64;
  c.max_num_batched_tokens = 64;  // chunked prefill of the longer prompts
  c.max_num_seqs = 64;
  c.enable_prefix_caching = true;
  return c;
}

std::vector<std::vector<int32_t>> greedy_tokens(const model::CausalLM& m) {
  std::vector<std::vector<int32_t>> toks;
  auto e = rollout::Engine::create(m, engine_config());
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return toks;  // every rank of the engine's group fails alike
  rollout::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 16;
  const auto prompts = rollout::testing::tiny_prompts();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], sp).is_ok());
  for (const auto& o : (*e)->run_to_completion()) toks.push_back(o.outputs.at(0).token_ids);
  return toks;
}

}  // namespace

TEST(PpWeights, CopyFromStagesEqualsOneProcessCopy) {
  for (const PpLayout& l : pp_layouts()) {
    for (const std::string kind : {"llama", "qwen3"}) {
      for (const RolloutGroup& g : rollout_groups()) {
        for (DType rdt : {DType::F32, DType::BF16}) {
          const std::string what = l.name() + " " + kind + " " + g.name + " " + dtype_name(rdt);
          SCOPED_TRACE(what);
          auto stage = pp_stage(kind, l);
          auto whole = pp_model(kind, {}, nullptr);
          rollout::RolloutWeightsOptions o;
          o.tp = g.tp;
          o.dtype = rdt;
          // One process's copy of the whole model, over the same rollout group.
          rollout::RolloutWeightsOptions ro = o;
          if (!ro.tp) ro.tp = l.tp_group;
          auto ref = rollout::RolloutWeights::create(*whole, ro);
          auto w = l.interleaved ? rollout::RolloutWeights::create(chunk_ptrs(stage), o)
                                 : rollout::RolloutWeights::create(*stage[0], o);
          EXPECT_FALSE(w->in_place());
          EXPECT_EQ(w->model().tp().size(), ro.tp->size());
          expect_same_weights(w->model(), ref->model(), what);
          EXPECT_EQ(w->last().tensors, int64_t(whole->params().size()));
          EXPECT_EQ(w->last().bytes_received, expected_received(l, stage, *whole, rdt));
          int64_t copy_bytes = 0;  // every shard of the rollout copy is written once
          for (model::Param* p : const_cast<model::CausalLM&>(ref->model()).params())
            copy_bytes += int64_t(p->weight.nbytes());
          EXPECT_EQ(w->last().bytes_copied, copy_bytes);

          // A training step applied alike to the stages and the whole model;
          // the last stage's copy of a tied embedding moves differently (it is
          // never the source: the first stage's is).
          for (auto& c : stage) perturb(*c);
          perturb(*whole);
          for (auto& c : stage)  // the last stage's tied copy drifts: it must not be the source
            if (model::Param* e = c->find_param("model.embed_tokens.weight"); e && !c->has_embedding()) perturb(*e);
          w->release();
          EXPECT_TRUE(w->released());
          ref->refresh();
          w->refresh();
          EXPECT_FALSE(w->released());
          expect_same_weights(w->model(), ref->model(), what + " after a step");
        }
      }
    }
  }
}

TEST(PpWeights, GreedyGenerationEqualsWholeModel) {
  for (const PpLayout& l : pp_layouts()) {
    for (const std::string kind : {"llama", "qwen3"}) {
      auto groups = rollout_groups();
      for (const RolloutGroup& g : {groups.front(), groups.back()}) {  // tp1, and the training tp group
        const std::string what = l.name() + " " + kind + " " + g.name;
        SCOPED_TRACE(what);
        auto stage = pp_stage(kind, l);
        auto whole = pp_model(kind, {}, nullptr);
        rollout::RolloutWeightsOptions o;
        o.tp = g.tp;
        auto w = rollout::RolloutWeights::create(chunk_ptrs(stage), o);
        const auto want = greedy_tokens(*whole);
        EXPECT_EQ(greedy_tokens(w->model()), want) << what;
        for (auto& c : stage) perturb(*c);
        perturb(*whole);
        w->refresh();
        EXPECT_EQ(greedy_tokens(w->model()), greedy_tokens(*whole)) << what << " after a step";
      }
    }
  }
}

TEST(PpWeights, MissingLayersFailOnEveryRank) {
  // A pipeline whose stages leave a layer out: every rank gets the error.
  for (const PpLayout& l : pp_layouts()) {
    if (l.interleaved) continue;
    model::ModelOptions o;
    o.parallel.tp = l.tp_group;
    o.parallel.pp = l.pp_group;
    Slice s = slices_of(l, l.pp_rank())[0];
    if (l.pp_rank() == 0) s.n = 0;  // layer 0 held by nobody
    auto m = pp_model("llama", o, &s);
    try {
      rollout::RolloutWeights::create(*m, {});
      ADD_FAILURE() << l.name() << ": a missing layer was not detected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no pipeline stage holds 'model.layers.0."), std::string::npos) << e.what();
    }
  }
}
