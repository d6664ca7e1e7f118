// One HF folder from a pipelined model (model/pipeline_save.h): the folder
// save_pipelined_model writes from the stages is byte-identical (every file)
// to CausalLM::save of the whole model, at PP2, PP2 interleaved, PP2xTP2 and
// PP4; f32 and bf16 on disk from f32 and bf16 weights; tied and untied
// embeddings; a value model with a score bias; and, with a small shard
// limit, to io::save_weights_dir's sharded folder (an oversized tensor
// alone in its shard, the index, a stale single file removed).
// Run by tests/scripts/mpi_pp_weights.sh with 2 and 4 ranks.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/safetensors.h"
#include "model/pipeline_save.h"
#include "pp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;
namespace fs = std::filesystem;

namespace {

// A folder every rank names alike: world rank 0's pid.
std::string shared_tmp(const std::string& name) {
  int64_t pid = world_group().rank() == 0 ? int64_t(::getpid()) : 0;
  world_group().all_reduce(&pid, 1, DType::I64, comm::ReduceOp::Max);
  std::string n = name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return (fs::temp_directory_path() / ("kestrel_pp_save_" + std::to_string(pid)) / n).string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Same file names, same bytes in each (cmp of every file).
void expect_same_folder(const std::string& got, const std::string& want, const std::string& what) {
  std::vector<std::string> g, w;
  for (const auto& e : fs::directory_iterator(got)) g.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(want)) w.push_back(e.path().filename().string());
  std::sort(g.begin(), g.end());
  std::sort(w.begin(), w.end());
  EXPECT_EQ(g, w) << what;
  EXPECT_FALSE(w.empty()) << what;
  for (const std::string& n : w) {
    if (std::find(g.begin(), g.end(), n) == g.end()) continue;
    EXPECT_TRUE(slurp(fs::path(got) / n) == slurp(fs::path(want) / n)) << what << ": " << n << " differs";
  }
}

struct Case {
  std::string kind;
  DType train = DType::F32, disk = DType::F32;
  bool value = false;
  size_t shard_bytes = model::kHfShardBytes;
  std::string name() const {
    return kind + (value ? " value" : "") + " " + dtype_name(train) + "->" + dtype_name(disk) +
           (shard_bytes == model::kHfShardBytes ? "" : " sharded");
  }
};

void check(const PpLayout& l, const Case& c) {
  const std::string what = l.name() + " " + c.name();
  SCOPED_TRACE(what);
  model::ModelOptions o;
  o.dtype = c.train;
  o.value_head = c.value;
  o.value_head_bias = c.value;
  auto stage = pp_stage(c.kind, l, o);
  auto whole = pp_model(c.kind, o, nullptr);
  for (auto& m : stage)  // a random value head (and its bias), the same as the whole model's
    for (const char* n : {"score.weight", "score.bias"})
      if (model::Param* p = m->find_param(n)) p->weight.copy_from(rand_full(p->full_shape, 900, 0.3f, c.train));
  for (const char* n : {"score.weight", "score.bias"})
    if (model::Param* p = whole->find_param(n)) p->weight.copy_from(rand_full(p->full_shape, 900, 0.3f, c.train));
  // The last stage's copy of a tied embedding drifts: the folder must take the first stage's.
  for (auto& m : stage)
    if (model::Param* e = m->find_param("model.embed_tokens.weight"); e && !m->has_embedding()) perturb(*e);

  const std::string base = shared_tmp(what), got = base + "/pp", want = base + "/whole";
  const bool rank0 = world_group().rank() == 0;  // pp rank 0 of tp rank 0: the writer
  if (rank0) {
    fs::remove_all(base);
    fs::create_directories(got);
    fs::create_directories(want);
    if (c.shard_bytes != model::kHfShardBytes)  // a stale single file the sharded save must remove
      for (const std::string& d : {got, want}) std::ofstream(d + "/model.safetensors") << "stale";
    // The reference: one process's CausalLM::save (and io's sharding of the same tensors).
    EXPECT_TRUE(whole->save(want, c.disk).is_ok());  // EXPECT: the other ranks wait at the barrier
    if (c.shard_bytes != model::kHfShardBytes) {
      std::vector<io::NamedTensor> ts;
      for (model::Param* p : whole->params()) ts.push_back({p->name, p->weight});
      EXPECT_TRUE(io::save_weights_dir(want, ts, c.disk, c.shard_bytes).is_ok());
      EXPECT_TRUE(fs::exists(want + "/model.safetensors.index.json"));
    }
  }
  world_group().barrier();
  const Status st = l.interleaved ? model::save_pipelined_model(chunk_ptrs(stage), got, c.disk, c.shard_bytes)
                                  : model::save_pipelined_model(*stage[0], got, c.disk, c.shard_bytes);
  EXPECT_TRUE(st.is_ok()) << st.message();
  world_group().barrier();
  if (rank0) {
    expect_same_folder(got, want, what);
    fs::remove_all(base);
  }
}

}  // namespace

TEST(PpSave, FolderEqualsWholeModelSave) {
  const std::vector<Case> cases = {
      {"llama", DType::F32, DType::F32},  {"llama", DType::F32, DType::BF16}, {"qwen3", DType::F32, DType::F32},
      {"qwen3", DType::F32, DType::BF16}, {"qwen3", DType::BF16, DType::BF16}, {"llama", DType::BF16, DType::F32},
      {"qwen3", DType::F32, DType::F32, /*value=*/true},
  };
  for (const PpLayout& l : pp_layouts())
    for (const Case& c : cases) check(l, c);
}

TEST(PpSave, ShardedFolderEqualsSaveWeightsDir) {
  // 20000 bytes: the f32 embedding (32 KiB) and lm_head get shards of their
  // own, the layers' tensors pack several to a shard.
  for (const PpLayout& l : pp_layouts()) {
    check(l, {"llama", DType::F32, DType::F32, false, 20000});
    check(l, {"qwen3", DType::F32, DType::BF16, false, 20000});
  }
}

TEST(PpSave, OnlyTheWriterTouchesTheFolder) {
  for (const PpLayout& l : pp_layouts()) {
    if (l.interleaved) continue;
    auto stage = pp_stage("llama", l);
    const std::string dir = shared_tmp("writer_" + l.name());
    const bool rank0 = world_group().rank() == 0;
    if (rank0) fs::remove_all(dir);
    world_group().barrier();
    EXPECT_TRUE(model::save_pipelined_model(*stage[0], dir, DType::F32).is_ok());
    world_group().barrier();
    if (rank0) {
      EXPECT_TRUE(fs::exists(dir + "/config.json"));
      EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
      // The saved folder loads as the whole model, with the whole model's values.
      auto back = model::CausalLM::load(dir);
      EXPECT_TRUE(back.is_ok()) << back.status().message();
      auto whole = pp_model("llama", {}, nullptr);
      if (back.is_ok())
        for (model::Param* p : whole->params()) {
          const model::Param* q = (*back)->find_param(p->name);
          EXPECT_TRUE(q) << p->name;
          if (!q) continue;
          EXPECT_EQ(to_double(q->weight), to_double(p->weight)) << p->name;
        }
      fs::remove_all(fs::path(dir).parent_path());
    }
    world_group().barrier();
  }
}
