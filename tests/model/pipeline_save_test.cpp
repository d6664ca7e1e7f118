// The single-process parts of the pipelined export and weight copy
// (model/pipeline_params.h, model/pipeline_save.h; the multi-rank tests are
// tests/mpi/pp_save_test.cpp and pp_weights_test.cpp): the whole model's
// state tensor list from the config equals CausalLM::state_tensors() of the
// whole model (the MoE goldens' buffers after the parameters), at pp 1 every
// tensor is owned by rank 0, and the streaming writer at pp 1 writes what
// CausalLM::save and io::save_weights_dir write (DeepSeek-V3's correction
// bias in f32 whatever the disk dtype).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/testing.h"
#include "io/safetensors.h"
#include "model/pipeline_params.h"
#include "model/pipeline_save.h"

using namespace kestrel;
namespace fs = std::filesystem;

namespace {

std::string golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

std::string tmp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_pipeline_save_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void expect_same_folder(const std::string& got, const std::string& want) {
  std::vector<std::string> g, w;
  for (const auto& e : fs::directory_iterator(got)) g.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(want)) w.push_back(e.path().filename().string());
  std::sort(g.begin(), g.end());
  std::sort(w.begin(), w.end());
  ASSERT_EQ(g, w);
  for (const std::string& n : w) EXPECT_TRUE(slurp(fs::path(got) / n) == slurp(fs::path(want) / n)) << n;
}

}  // namespace

TEST(PipelineParams, WholeModelListEqualsParams) {
  for (const char* name : {"qwen2", "qwen3", "llama_tied"}) {
    for (bool value : {false, true}) {
      SCOPED_TRACE(std::string(name) + (value ? " value" : ""));
      model::ModelOptions o;
      o.value_head = value;
      auto m = model::CausalLM::load(golden(name), o);
      ASSERT_TRUE(m.is_ok()) << m.status().message();
      const auto list = model::whole_model_params((*m)->config(), (*m)->options());
      const auto ps = (*m)->params();
      ASSERT_EQ(list.size(), ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ(list[i].name, ps[i]->name);
        EXPECT_EQ(list[i].full_shape, ps[i]->full_shape) << ps[i]->name;
      }
      // pp 1: rank 0 owns everything, the local copies are the model's own.
      auto pipe = model::pipeline_params({m->get()});
      ASSERT_TRUE(pipe.is_ok()) << pipe.status().message();
      ASSERT_EQ(pipe->size(), ps.size());
      for (size_t i = 0; i < ps.size(); ++i) {
        EXPECT_EQ((*pipe)[i].owner, 0);
        EXPECT_EQ((*pipe)[i].local, ps[i]);
      }
    }
  }
}

TEST(PipelineParams, WholeModelListCarriesTheBuffers) {
  for (const char* name : {"qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(dt));
      model::ModelOptions o;
      o.dtype = dt;
      auto m = model::CausalLM::load(golden(name), o);
      ASSERT_TRUE(m.is_ok()) << m.status().message();
      const auto list = model::whole_model_params((*m)->config(), (*m)->options());
      const auto st = (*m)->state_tensors();
      const size_t n_params = (*m)->params().size(), n_buffers = (*m)->buffers().size();
      EXPECT_EQ(n_buffers, std::string(name) == "deepseek_v3" ? 2u : 0u);  // one bias per MoE layer
      ASSERT_EQ(list.size(), st.size());
      for (size_t i = 0; i < st.size(); ++i) {
        EXPECT_EQ(list[i].name, st[i]->name);
        EXPECT_EQ(list[i].full_shape, st[i]->full_shape) << st[i]->name;
        EXPECT_EQ(list[i].buffer, i >= n_params) << st[i]->name;
      }
      auto pipe = model::pipeline_params({m->get()});
      ASSERT_TRUE(pipe.is_ok()) << pipe.status().message();
      ASSERT_EQ(pipe->size(), st.size());
      for (size_t i = 0; i < st.size(); ++i) {
        EXPECT_EQ((*pipe)[i].owner, 0);
        EXPECT_EQ((*pipe)[i].local, st[i]);
        EXPECT_EQ((*pipe)[i].buffer, i >= n_params);
        if (i >= n_params) {
          EXPECT_EQ(st[i]->weight.dtype(), DType::F32) << "buffers stay f32 in every precision";
        }
      }
    }
  }
}

TEST(PipelineSave, StreamingWriterAtPp1EqualsSave) {
  model::ModelOptions vo;
  vo.value_head = true;
  vo.value_head_bias = true;
  for (const auto& [name, opts] : std::vector<std::pair<std::string, model::ModelOptions>>{
           {"qwen2", {}}, {"llama_tied", {}}, {"qwen3", vo}, {"deepseek_v3", {}}}) {
    auto m = model::CausalLM::load(golden(name), opts);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    for (DType disk : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(name + " " + dtype_name(disk));
      // The default limit at pp 1 is CausalLM::save itself; a limit of one
      // byte past the whole model takes the streaming path and must agree.
      int64_t total = 0;
      for (model::Param* p : (*m)->params()) total += p->weight.numel() * int64_t(dtype_size(disk));
      for (model::Param* p : (*m)->buffers()) total += p->weight.numel() * 4;  // f32 on disk
      const std::string want = tmp_dir("want"), got = tmp_dir("got");
      ASSERT_TRUE((*m)->save(want, disk).is_ok());
      ASSERT_TRUE(model::save_pipelined_model(**m, got, disk, size_t(total)).is_ok());
      expect_same_folder(got, want);
      // Sharded: a third of the model per shard, and 1 byte (every tensor alone).
      for (size_t limit : {size_t(total / 3), size_t(1)}) {
        const std::string w2 = tmp_dir("want_sharded"), g2 = tmp_dir("got_sharded");
        std::ofstream(g2 + "/model.safetensors") << "stale";  // removed by both
        std::ofstream(w2 + "/model.safetensors") << "stale";
        ASSERT_TRUE((*m)->save(w2, disk).is_ok());
        std::vector<io::NamedTensor> ts;
        for (model::Param* p : (*m)->params()) ts.push_back({p->name, p->weight});
        for (model::Param* p : (*m)->buffers()) ts.push_back({p->name, p->weight, /*own_dtype=*/true});
        ASSERT_TRUE(io::save_weights_dir(w2, ts, disk, limit).is_ok());
        ASSERT_TRUE(model::save_pipelined_model(**m, g2, disk, limit).is_ok());
        EXPECT_TRUE(fs::exists(g2 + "/model.safetensors.index.json"));
        EXPECT_FALSE(fs::exists(g2 + "/model.safetensors"));
        expect_same_folder(g2, w2);
      }
    }
  }
  fs::remove_all(fs::temp_directory_path() / ("kestrel_pipeline_save_test_" + std::to_string(::getpid())));
}

TEST(PipelineSave, UnwritableFolderIsAnError) {
  auto m = model::CausalLM::load(golden("qwen2"));
  ASSERT_TRUE(m.is_ok());
  const std::string d = tmp_dir("blocked");
  std::ofstream(d + "/file") << "x";
  const Status st = model::save_pipelined_model(**m, d + "/file/sub", DType::F32, 1000);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cannot create model folder"), std::string::npos) << st.message();
  fs::remove_all(fs::path(d).parent_path());
}
