// The rollout's copy of the weights when the training model is a pipeline
// stage (rollout/reshard.h, pp > 1): the whole model, filled from the stages,
// equals one process's rollout copy of the whole model bit for bit (rollout
// tp 1, 2 and the world; f32 and a bf16 rollout dtype; tied and untied
// embeddings; PP2, PP2 interleaved, PP2xTP2, PP4), follows a training step
// after refresh(), counts the bytes it received over tp and pp, and greedy
// generation on it equals generation on the whole model. A MoE/MLA model
// (a 4-layer DeepSeek-V3) carries its f32 e_score_correction_bias buffers into
// the copy (also bf16) and into save_pipelined_model's folder (f32 on disk),
// and follows their training updates.
// Run by tests/scripts/mpi_pp_weights.sh with 2 and 4 ranks.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/pipeline_save.h"
#include "pp_testing.h"
#include "rollout/engine.h"
#include "rollout/moe_models.h"
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

// Every state tensor (parameters, then buffers) of `got` equals `want`'s
// byte for byte (same layout).
void expect_same_weights(const model::CausalLM& got, const model::CausalLM& want, const std::string& what) {
  auto gp = const_cast<model::CausalLM&>(got).state_tensors();
  auto wp = const_cast<model::CausalLM&>(want).state_tensors();
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
// dtype; a buffer in f32), and this stage's sharded tensors from the tp - 1 other ranks.
int64_t expected_received(const PpLayout& l, const std::vector<std::unique_ptr<model::CausalLM>>& stage,
                          const model::CausalLM& whole, DType rollout_dtype) {
  const DType train = stage[0]->dtype();
  const size_t wire = std::min(dtype_size(train), dtype_size(rollout_dtype));
  const auto buffers = const_cast<model::CausalLM&>(whole).buffers();
  int64_t n = 0;
  for (model::Param* p : const_cast<model::CausalLM&>(whole).state_tensors()) {
    const bool buffer = std::find(buffers.begin(), buffers.end(), p) != buffers.end();
    const int o = owner_of(l, p->name);
    EXPECT_GE(o, 0) << p->name;
    if (o != l.pp_rank()) {
      n += shape_numel(p->full_shape) * int64_t(buffer ? sizeof(float) : wire);
      continue;
    }
    const model::Param* mine = nullptr;
    for (const auto& c : stage)
      for (model::Param* q : c->state_tensors())
        if (!mine && q->name == p->name) mine = q;
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

namespace {

// A 4-layer DeepSeek-V3 (the golden's config: MLA, layer 0 dense, MoE with
// the correction bias) whose biases get random values keyed by name, the same
// in every layout.
std::unique_ptr<model::CausalLM> moe_model(model::ModelOptions o, const Slice* s) {
  auto cfg = io::load_model_config(source_path("tests/golden/models/deepseek_v3/config.json"));
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().message();
  io::ModelConfig c = cfg.value();
  c.num_hidden_layers = 4;
  if (s) {
    o.first_layer = s->first;
    o.num_layers = s->n;
    o.has_embedding = s->embed;
    o.has_head = s->head;
  }
  auto m = model::CausalLM::init_random(c, o, 7, 0.2);
  for (model::Param* b : m->buffers())
    b->weight.copy_from(rand_full(b->full_shape, 500 + std::hash<std::string>{}(b->name) % 1000, 0.1f));
  return m;
}

std::vector<std::unique_ptr<model::CausalLM>> moe_stage(const PpLayout& l, model::ModelOptions o = {}) {
  o.parallel.tp = l.tp_group;
  o.parallel.pp = l.pp_group;
  std::vector<std::unique_ptr<model::CausalLM>> out;
  for (const Slice& s : slices_of(l, l.pp_rank())) out.push_back(moe_model(o, &s));
  return out;
}

// A step's expert loads, the same for every layout (the training engine sums them over dp).
model::MoeStepStats moe_loads(const io::ModelConfig& c, int64_t salt) {
  model::MoeStepStats s;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (!c.is_moe_layer(layer)) continue;
    model::MoeLayerStats ls;
    ls.layer = layer;
    for (int64_t e = 0; e < c.moe.num_experts; ++e) ls.tokens_per_expert.push_back((3 * e + salt + layer) % 7);
    s.layers.push_back(ls);
  }
  return s;
}

struct MoeGen {
  std::vector<std::vector<int32_t>> tokens, routing;
};
MoeGen moe_generate(const model::CausalLM& m) {
  MoeGen g;
  rollout::EngineConfig c = engine_config();
  c.block_size = 8;
  c.record_routing = true;
  auto e = rollout::Engine::create(m, c);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (!e.is_ok()) return g;
  rollout::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 8;
  sp.ignore_eos = true;
  const auto prompts = rollout::testing::moe_prompts();
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_TRUE((*e)->add_request("r" + std::to_string(i), prompts[i], sp).is_ok());
  for (auto& o : (*e)->run_to_completion()) {
    g.tokens.push_back(o.outputs.at(0).token_ids);
    g.routing.push_back(o.outputs.at(0).routed_experts);
  }
  return g;
}

// A folder every rank names alike: world rank 0's pid.
std::string shared_tmp(const std::string& name) {
  int64_t pid = world_group().rank() == 0 ? int64_t(::getpid()) : 0;
  world_group().all_reduce(&pid, 1, DType::I64, comm::ReduceOp::Max);
  std::string n = name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return (std::filesystem::temp_directory_path() / ("kestrel_pp_weights_" + std::to_string(pid)) / n).string();
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// save_pipelined_model of the stages writes the whole model's CausalLM::save
// folder byte for byte (the biases f32 on disk), also sharded by io's rule.
void expect_moe_save_equals_whole(const PpLayout& l, const std::vector<std::unique_ptr<model::CausalLM>>& stage,
                                  const model::CausalLM& whole, DType disk, size_t shard_bytes, const std::string& what) {
  namespace fs = std::filesystem;
  const std::string base = shared_tmp(what), got = base + "/pp", want = base + "/whole";
  const bool rank0 = world_group().rank() == 0;  // the writer: pp rank 0, tp rank 0
  if (rank0) {
    fs::remove_all(base);
    fs::create_directories(want);
    EXPECT_TRUE(whole.save(want, disk).is_ok()) << what;
    if (shard_bytes != model::kHfShardBytes) {
      std::vector<io::NamedTensor> ts;
      for (model::Param* p : const_cast<model::CausalLM&>(whole).params()) ts.push_back({p->name, p->weight});
      for (model::Param* p : const_cast<model::CausalLM&>(whole).buffers()) ts.push_back({p->name, p->weight, true});
      EXPECT_TRUE(io::save_weights_dir(want, ts, disk, shard_bytes).is_ok()) << what;
    }
  }
  world_group().barrier();
  const Status st = l.interleaved ? model::save_pipelined_model(chunk_ptrs(stage), got, disk, shard_bytes)
                                  : model::save_pipelined_model(*stage[0], got, disk, shard_bytes);
  EXPECT_TRUE(st.is_ok()) << what << ": " << st.message();
  world_group().barrier();
  if (rank0) {
    std::vector<std::string> g, w;
    for (const auto& e : fs::directory_iterator(got)) g.push_back(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(want)) w.push_back(e.path().filename().string());
    std::sort(g.begin(), g.end());
    std::sort(w.begin(), w.end());
    EXPECT_EQ(g, w) << what;
    for (const std::string& n : w) {
      if (std::find(g.begin(), g.end(), n) == g.end()) continue;
      EXPECT_TRUE(slurp(fs::path(got) / n) == slurp(fs::path(want) / n)) << what << ": " << n << " differs";
    }
    // The saved biases load back with the whole model's f32 values (and an
    // f32 folder all of it).
    auto back = model::CausalLM::load(got, {});
    EXPECT_TRUE(back.is_ok()) << what << ": " << back.status().message();
    if (back.is_ok() && disk == DType::F32) expect_same_weights(**back, whole, what + " loaded back");
    if (back.is_ok()) {
      const auto bb = (*back)->buffers(), wb = const_cast<model::CausalLM&>(whole).buffers();
      ASSERT_EQ(bb.size(), wb.size()) << what;
      for (size_t i = 0; i < bb.size(); ++i)
        EXPECT_EQ(to_double(bb[i]->weight), to_double(wb[i]->weight)) << what << ": " << wb[i]->name;
    }
    fs::remove_all(base);
  }
  world_group().barrier();
}

}  // namespace

TEST(PpWeights, MoeCopyAndSaveCarryTheCorrectionBias) {
  for (const PpLayout& l : pp_layouts()) {
    if (l.tp > 1) continue;  // MoE and MLA models refuse tp > 1 (expert parallelism is not built)
    for (DType rdt : {DType::F32, DType::BF16}) {
      const std::string what = l.name() + " deepseek_v3 " + dtype_name(rdt);
      SCOPED_TRACE(what);
      auto stage = moe_stage(l);
      auto whole = moe_model({}, nullptr);
      ASSERT_EQ(whole->buffers().size(), 3u);  // layers 1..3 are MoE
      rollout::RolloutWeightsOptions o;
      o.tp = comm::local_group("rollout_tp");
      o.dtype = rdt;
      auto ref = rollout::RolloutWeights::create(*whole, o);  // one process (in place when f32)
      auto w = l.interleaved ? rollout::RolloutWeights::create(chunk_ptrs(stage), o)
                             : rollout::RolloutWeights::create(*stage[0], o);
      expect_same_weights(w->model(), ref->model(), what);
      for (model::Param* b : const_cast<model::CausalLM&>(w->model()).buffers())
        EXPECT_EQ(b->weight.dtype(), DType::F32) << b->name;
      EXPECT_EQ(w->last().tensors, int64_t(whole->state_tensors().size()));
      EXPECT_EQ(w->last().bytes_received, expected_received(l, stage, *whole, rdt));
      const MoeGen a = moe_generate(w->model()), b = moe_generate(ref->model());
      EXPECT_EQ(a.tokens, b.tokens) << what;
      EXPECT_EQ(a.routing, b.routing) << what;

      // Aux-loss-free balancing moves the biases on every stage as on the
      // whole model; the copy follows after release() and refresh().
      const model::MoeStepStats step = moe_loads(whole->config(), rdt == DType::F32 ? 1 : 2);
      for (auto& c : stage) c->update_moe_correction_bias(step, 0.5);
      whole->update_moe_correction_bias(step, 0.5);
      w->release();
      ref->refresh();
      w->refresh();
      expect_same_weights(w->model(), ref->model(), what + " after a bias update");
      const MoeGen a2 = moe_generate(w->model()), b2 = moe_generate(ref->model());
      EXPECT_EQ(a2.routing, b2.routing) << what << " after a bias update";
      EXPECT_NE(a2.routing, a.routing) << what << ": the bias update should change some routing";

      // The HF folder: the biases in f32 whatever the disk dtype.
      expect_moe_save_equals_whole(l, stage, *whole, rdt, model::kHfShardBytes, what + " save");
      expect_moe_save_equals_whole(l, stage, *whole, rdt, 20000, what + " sharded save");
    }
  }
}
