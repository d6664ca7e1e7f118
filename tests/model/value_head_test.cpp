// The value model (ModelOptions::value_head, the PPO critic's network):
// values and every parameter gradient against transformers'
// *ForTokenClassification (tests/golden/critic/, written by
// make_critic_golden.py), against central finite differences, the head on
// the unchanged backbone, loading from an actor folder (lm_head dropped,
// score.weight drawn), and the save/load round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "core/files.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/transformer.h"

using namespace kestrel;
namespace fs = std::filesystem;
using kestrel::testing::rel_to_scale;
using kestrel::testing::to_double;

namespace {

std::string tmp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_value_head_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string critic_golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/critic/" + c); }
std::string actor_golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

model::ModelOptions value_opts(DType dt = DType::F32, uint64_t seed = 0) {
  model::ModelOptions o;
  o.dtype = dt;
  o.value_head = true;
  o.value_head_seed = seed;
  return o;
}

// Tiny Qwen2-like config (q/k/v biases) for the finite-difference checks.
io::ModelConfig tiny_config(bool tied) {
  io::ModelConfig c;
  c.arch = io::Arch::Qwen2;
  c.model_type = "qwen2";
  c.vocab_size = 24;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 32;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = tied;
  c.attention_bias = true;
  c.rope.head_dim = 4;
  c.rope.theta = 10000.0;
  return c;
}

model::PackedBatch tiny_batch() {
  return model::pack_sequences({{3, 7, 1, 22, 5}, {9, 2}, {11, 0, 4, 17, 8, 19, 6}});
}

std::vector<float> coefficients(int64_t n, uint64_t seed) {
  std::vector<float> c(static_cast<size_t>(n));
  Philox p{seed, 3};
  for (int64_t i = 0; i < n; ++i) c[size_t(i)] = 2 * p.uniform(uint64_t(i)) - 1;
  return c;
}

// J = sum_t c_t * values_t in double, forward only.
double objective(const model::CausalLM& m, const model::PackedBatch& b, const std::vector<float>& c) {
  Tensor v = m.forward_inference(b);
  double j = 0;
  for (int64_t t = 0; t < b.num_tokens; ++t) j += double(c[size_t(t)]) * double(v.get(t));
  return j;
}

model::PackedBatch golden_batch(const io::SafetensorsFile& g) {
  Tensor ids = g.get("input_ids").value().to(DType::I64), cu = g.get("cu_seqlens").value().to(DType::I64);
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t s = 0; s + 1 < cu.numel(); ++s) {
    std::vector<int32_t> q;
    for (int64_t t = cu.data<int64_t>()[s]; t < cu.data<int64_t>()[s + 1]; ++t) q.push_back(int32_t(ids.data<int64_t>()[t]));
    seqs.push_back(q);
  }
  return model::pack_sequences(seqs);
}

}  // namespace

// fp32: within 1e-4 of scale, values and every gradient (score head included).
class ValueHeadGolden : public ::testing::TestWithParam<std::string> {};
TEST_P(ValueHeadGolden, ValuesAndGradsMatchTransformersTokenClassification) {
  const std::string dir = critic_golden(GetParam());
  auto gf = io::SafetensorsFile::open(dir + "/golden.safetensors");
  ASSERT_TRUE(gf.is_ok()) << gf.status().message();
  const io::SafetensorsFile& g = *gf.value();
  auto loaded = model::CausalLM::load(dir, value_opts());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  model::CausalLM& m = *loaded.value();
  EXPECT_TRUE(m.is_value_model());
  EXPECT_EQ(m.value_head_bias().weight.defined(), g.contains("grad.score.bias"));
  m.enable_grads();

  const model::PackedBatch b = golden_batch(g);
  model::Activations acts;
  Tensor v = m.forward(b, acts);
  ASSERT_EQ(v.shape(), (Shape{b.num_tokens, 1}));
  EXPECT_LE(rel_to_scale(to_double(v), to_double(g.get("values").value())), 1e-4);

  Tensor dv = g.get("weights").value().clone(MemCategory::Activations).view({b.num_tokens, 1});
  m.backward(b, acts, dv);
  int checked = 0;
  for (model::Param* p : m.params()) {
    const std::string key = "grad." + p->name;
    ASSERT_TRUE(g.contains(key)) << key;
    EXPECT_LE(rel_to_scale(to_double(p->grad), to_double(g.get(key).value())), 1e-4) << key;
    ++checked;
  }
  // Every HF parameter has a Kestrel counterpart (no lm_head in either).
  int golden_grads = 0;
  for (const auto& info : g.tensors()) golden_grads += info.name.rfind("grad.", 0) == 0;
  EXPECT_EQ(checked, golden_grads);
}
INSTANTIATE_TEST_SUITE_P(Critic, ValueHeadGolden, ::testing::Values("qwen2", "llama_nobias"));

// The head sits on the unchanged backbone: same seed, same final hidden state
// as the causal LM, and value = normf . score (+ bias).
TEST(ValueHead, IsALinearScoreOfTheCausalLmsFinalHiddenState) {
  for (bool tied : {true, false}) {
    model::ModelOptions plain;
    auto lm = model::CausalLM::init_random(tiny_config(tied), plain, 5, 0.3);
    auto vm = model::CausalLM::init_random(tiny_config(tied), value_opts(), 5, 0.3);
    std::vector<std::string> names;
    for (model::Param* p : vm->params()) names.push_back(p->name);
    EXPECT_EQ(names.back(), "score.weight");
    EXPECT_EQ(vm->find_param("lm_head.weight"), nullptr);
    EXPECT_EQ(vm->num_parameters(), lm->num_parameters() - (tied ? 0 : 24 * 16) + 16);
    const model::PackedBatch b = tiny_batch();
    model::Activations a_lm, a_vm;
    lm->forward(b, a_lm);
    Tensor v = vm->forward(b, a_vm);
    ASSERT_EQ(a_lm.normf.nbytes(), a_vm.normf.nbytes());
    EXPECT_EQ(std::memcmp(a_lm.normf.raw(), a_vm.normf.raw(), a_vm.normf.nbytes()), 0) << "backbone changed";
    const int64_t D = 16;
    for (int64_t t = 0; t < b.num_tokens; ++t) {
      double want = 0;
      for (int64_t d = 0; d < D; ++d) want += double(a_vm.normf.get(t * D + d)) * vm->value_head().weight.get(d);
      EXPECT_NEAR(v.get(t), want, 1e-5 * (1 + std::abs(want))) << "row " << t;
    }
    EXPECT_THROW(vm->lm_head(), Error);
  }
}

// Analytic gradients of J = sum c_t v_t against central differences of the
// f32 model (a few elements of every parameter, head and bias included).
TEST(ValueHead, BackwardMatchesFiniteDifferences) {
  model::ModelOptions o = value_opts();
  o.value_head_bias = true;
  auto m = model::CausalLM::init_random(tiny_config(true), o, 11, 0.3);
  m->find_param("score.bias")->weight.fill_(0.25f);
  m->enable_grads();
  const model::PackedBatch b = tiny_batch();
  const std::vector<float> c = coefficients(b.num_tokens, 2);
  model::Activations acts;
  m->forward(b, acts);
  Tensor dv = Tensor::from_vector(c, {b.num_tokens, 1});
  m->backward(b, acts, dv);

  const double h = 1e-3;
  int checked = 0;
  for (model::Param* p : m->params()) {
    const int64_t n = p->weight.numel();
    for (int64_t i : {int64_t(0), n / 2, n - 1}) {
      const float w0 = p->weight.get(i);
      p->weight.set(i, float(w0 + h));
      const double fp = objective(*m, b, c);
      p->weight.set(i, float(w0 - h));
      const double fm = objective(*m, b, c);
      p->weight.set(i, w0);
      const double fd = (fp - fm) / (2 * h), an = p->grad.get(i);
      EXPECT_NEAR(an, fd, 2e-3 + 1e-2 * std::abs(fd)) << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
  EXPECT_THROW(m->backward(b, acts, Tensor::zeros({b.num_tokens, 24}, DType::F32)), Error);
}

// An actor folder (causal LM): backbone loaded as is, lm_head ignored, the
// head drawn N(0, initializer_range) from the seed, no bias.
TEST(ValueHead, LoadsFromAnActorFolder) {
  for (const char* actor : {"qwen2", "llama3_untied_rope"}) {
    auto lm = model::CausalLM::load(actor_golden(actor));
    ASSERT_TRUE(lm.is_ok()) << lm.status().message();
    auto vm = model::CausalLM::load(actor_golden(actor), value_opts(DType::F32, 42));
    ASSERT_TRUE(vm.is_ok()) << vm.status().message();
    model::CausalLM& v = *vm.value();
    EXPECT_EQ(v.find_param("lm_head.weight"), nullptr);
    EXPECT_FALSE(v.value_head_bias().weight.defined());
    for (model::Param* p : v.params()) {
      if (p->name == "score.weight") continue;
      model::Param* q = lm.value()->find_param(p->name);
      ASSERT_NE(q, nullptr) << p->name;
      EXPECT_EQ(std::memcmp(p->weight.raw(), q->weight.raw(), p->weight.nbytes()), 0) << p->name;
    }
    const Tensor& s = v.value_head().weight;  // [1, D]
    const int64_t D = v.config().hidden_size;
    ASSERT_EQ(s.shape(), (Shape{1, D}));
    Philox rng{42, 0};
    for (int64_t i = 0; i < D; ++i) EXPECT_EQ(s.get(i), float(0.02 * rng.normal(uint64_t(i))));
    auto other = model::CausalLM::load(actor_golden(actor), value_opts(DType::F32, 43));
    ASSERT_TRUE(other.is_ok());
    EXPECT_NE(std::memcmp(s.raw(), other.value()->value_head().weight.raw(), s.nbytes()), 0);
  }
}

TEST(ValueHead, SaveLoadRoundTripWritesATokenClassificationFolder) {
  for (const char* c : {"qwen2", "llama_nobias"}) {
    auto src = model::CausalLM::load(critic_golden(c), value_opts());
    ASSERT_TRUE(src.is_ok()) << src.status().message();
    const std::string dir = tmp_dir(std::string("roundtrip_") + c);
    ASSERT_TRUE(src.value()->save(dir, DType::F32).is_ok());
    const auto cfg = nlohmann::json::parse(read_file(dir + "/config.json").value());
    const std::string arch = cfg["architectures"][0];
    EXPECT_EQ(arch, std::string(c) == "qwen2" ? "Qwen2ForTokenClassification" : "LlamaForTokenClassification");
    EXPECT_EQ(cfg["num_labels"], 1);
    EXPECT_EQ(cfg["classifier_dropout"], 0.0);
    const bool bias = std::string(c) == "qwen2";
    EXPECT_EQ(cfg["token_classification_bias"], bias);
    auto w = io::WeightSource::open_dir(dir);
    ASSERT_TRUE(w.is_ok());
    EXPECT_TRUE(w->contains("score.weight"));
    EXPECT_EQ(w->contains("score.bias"), bias);
    EXPECT_FALSE(w->contains("lm_head.weight"));

    auto back = model::CausalLM::load(dir, value_opts());
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    auto a = src.value()->params(), b = back.value()->params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i]->name, b[i]->name);
      EXPECT_EQ(std::memcmp(a[i]->weight.raw(), b[i]->weight.raw(), a[i]->weight.nbytes()), 0) << a[i]->name;
    }
    const model::PackedBatch pb = tiny_batch();
    Tensor v1 = src.value()->forward_inference(pb), v2 = back.value()->forward_inference(pb);
    EXPECT_EQ(std::memcmp(v1.raw(), v2.raw(), v1.nbytes()), 0);

    // A value folder is not a causal LM.
    auto as_lm = model::CausalLM::load(dir);
    ASSERT_FALSE(as_lm.is_ok());
    EXPECT_NE(as_lm.status().message().find("value model"), std::string::npos) << as_lm.status().message();
    EXPECT_NE(as_lm.status().message().find("config.json"), std::string::npos) << as_lm.status().message();
    fs::remove_all(dir);
  }
}

TEST(ValueHead, RejectsMoreThanOneLabel) {
  const std::string dir = tmp_dir("two_labels");
  auto cfg = nlohmann::json::parse(read_file(critic_golden("llama_nobias") + "/config.json").value());
  cfg["id2label"] = {{"0", "A"}, {"1", "B"}};
  cfg.erase("label2id");
  ASSERT_TRUE(write_file_atomic(dir + "/config.json", cfg.dump(2)).is_ok());
  fs::copy_file(critic_golden("llama_nobias") + "/model.safetensors", dir + "/model.safetensors");
  auto r = model::CausalLM::load(dir, value_opts());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("num_labels"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos) << r.status().message();
}

// bf16 compute: values [T, 1] in bf16, close to the f32 model's.
TEST(ValueHead, Bf16ValuesTrackF32) {
  auto f32 = model::CausalLM::load(critic_golden("qwen2"), value_opts());
  auto b16 = model::CausalLM::load(critic_golden("qwen2"), value_opts(DType::BF16));
  ASSERT_TRUE(f32.is_ok() && b16.is_ok());
  const model::PackedBatch b = tiny_batch();
  Tensor v32 = f32.value()->forward_inference(b), v16 = b16.value()->forward_inference(b);
  EXPECT_EQ(v16.dtype(), DType::BF16);
  EXPECT_LE(rel_to_scale(to_double(v16), to_double(v32)), 3e-2);
}
