// Built-in model configs and folders; the metrics file of a resumed run.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "core/files.h"
#include "model/transformer.h"
#include "train/builtin_model.h"
#include "train/logging.h"

namespace kestrel::train {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_builtin_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

TEST(BuiltinModel, ConfigsHaveTheDocumentedShapes) {
  const auto tiny = builtin_model_config("tiny", 512, 511).value();
  EXPECT_EQ(io::arch_name(tiny.arch), std::string("LlamaForCausalLM"));
  EXPECT_EQ(tiny.hidden_size, 128);
  EXPECT_EQ(tiny.num_hidden_layers, 4);
  EXPECT_TRUE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.eos_token_ids, std::vector<int64_t>{511});
  // 512*128 embedding + 4 * (attention 128*(128+64+64+128) + mlp 3*128*384 + 2 norms 128) + final norm 128
  EXPECT_EQ(tiny.num_parameters(), 512 * 128 + 4 * (128 * 384 + 3 * 128 * 384 + 2 * 128) + 128);
  const auto small = builtin_model_config("small", 512, 511).value();
  EXPECT_EQ(small.hidden_size, 512);
  EXPECT_EQ(small.num_hidden_layers, 8);
  EXPECT_EQ(small.num_attention_heads, 8);
  EXPECT_EQ(small.num_key_value_heads, 2);
  EXPECT_EQ(small.intermediate_size, 1536);
  EXPECT_GT(small.num_parameters(), 24'000'000);
  EXPECT_LT(small.num_parameters(), 32'000'000);
  auto bad = builtin_model_config("huge", 512, 511);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("tiny, small"), std::string::npos);
}

TEST(BuiltinModel, MaterializedFolderLoads) {
  const std::string dir = scratch("tiny");
  const auto cfg = builtin_model_config("tiny", 300, 299).value();
  ASSERT_TRUE(materialize_model(dir, cfg, {{"tokenizer.json", "{}"}}, 7).is_ok());
  EXPECT_EQ(read_file(dir + "/tokenizer.json").value(), "{}");
  auto m = model::CausalLM::load(dir).value();
  EXPECT_EQ(m->config().vocab_size, 300);
  // Same seed, same weights: the folder is a pure function of (config, seed).
  auto ref = model::CausalLM::init_random(cfg, {}, 7);
  EXPECT_EQ(m->params()[1]->weight.to_float_vector(), ref->params()[1]->weight.to_float_vector());
}

TEST(MetricsLogger, ResumedRunKeepsStepsUpToItsCheckpoint) {
  const std::string dir = scratch("metrics");
  MetricsOptions o;
  o.console = false;
  o.jsonl_path = dir + "/metrics.jsonl";
  {
    auto l = MetricsLogger::open(o).value();
    for (int s = 1; s <= 5; ++s) l->log(s, {{"train/loss", 1.0 / s}});
  }
  std::ofstream(o.jsonl_path, std::ios::app) << "{\"step\": 6, \"train/lo";  // torn by a kill
  {
    auto l = MetricsLogger::open(o, 3).value();
    l->log(4, {{"train/loss", 0.5}});
  }
  std::ifstream in(o.jsonl_path);
  std::string line;
  std::vector<int64_t> steps;
  while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(ProgressBar, Durations) {
  EXPECT_EQ(ProgressBar::format_duration(12.2), "12s");
  EXPECT_EQ(ProgressBar::format_duration(185), "3m05s");
  EXPECT_EQ(ProgressBar::format_duration(3720), "1h02m");
  EXPECT_EQ(ProgressBar::format_duration(-1), "?");
}

}  // namespace
}  // namespace kestrel::train
