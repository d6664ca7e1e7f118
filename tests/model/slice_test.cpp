// A model split into slices (pipeline stages): layers [0, 1) with the
// embedding and [1, L) with the head, chained through forward_hidden /
// backward_hidden, give the whole model's logits (or values) and every
// parameter gradient (fp32, 1e-6 relative). Also: a slice loads and saves only
// its tensors, and init_random of a slice draws the whole model's values.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "common/testing.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/transformer.h"

using namespace kestrel;
namespace fs = std::filesystem;
using kestrel::testing::rel_to_scale;
using kestrel::testing::to_double;

namespace {

std::string golden(const std::string& c) { return kestrel::testing::source_path("tests/golden/models/" + c); }

std::string tmp_dir(const std::string& name) {
  const auto d = fs::temp_directory_path() / ("kestrel_slice_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

model::PackedBatch test_batch(int64_t V) {
  std::vector<std::vector<int32_t>> seqs = {{}, {}, {}};
  Philox rng{7, 1};
  uint64_t k = 0;
  const int lens[] = {9, 5, 12};
  for (int s = 0; s < 3; ++s)
    for (int i = 0; i < lens[s]; ++i) seqs[size_t(s)].push_back(int32_t(rng.uniform(k++) * double(V)) % int32_t(V));
  return model::pack_sequences(seqs);
}

Tensor rand_f32(Shape s, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(s), DType::F32);
  Philox rng{seed, 3};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, float(rng.normal(uint64_t(i))));
  return t;
}

model::ModelOptions slice_opts(model::ModelOptions o, int64_t first, int64_t n, bool embed, bool head) {
  o.first_layer = first;
  o.num_layers = n;
  o.has_embedding = embed;
  o.has_head = head;
  return o;
}

std::unique_ptr<model::CausalLM> load(const std::string& dir, const model::ModelOptions& o) {
  auto r = model::CausalLM::load(dir, o);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

constexpr double kTol = 1e-6;

void check_chain(const std::string& name, model::ModelOptions base) {
  SCOPED_TRACE(name);
  const std::string dir = golden(name);
  auto whole = load(dir, base);
  ASSERT_TRUE(whole);
  const int64_t L = whole->config().num_hidden_layers;
  ASSERT_GE(L, 2);
  auto first = load(dir, slice_opts(base, 0, 1, true, false));
  auto last = load(dir, slice_opts(base, 1, -1, false, true));
  ASSERT_TRUE(first && last);
  EXPECT_EQ(first->num_blocks(), 1);
  EXPECT_EQ(last->num_blocks(), L - 1);
  for (auto* m : {whole.get(), first.get(), last.get()}) m->enable_grads();

  const model::PackedBatch b = test_batch(whole->config().vocab_size);
  model::Activations aw, a1, a2;
  const Tensor out_w = whole->forward(b, aw);
  const Tensor h = first->forward_hidden(b, Tensor(), a1);  // [T, D] residual after layer 0
  ASSERT_EQ(h.size(0), first->hidden_rows(b));
  const Tensor out_s = last->forward_hidden(b, h, a2);
  ASSERT_EQ(out_s.shape(), out_w.shape());
  EXPECT_LE(rel_to_scale(to_double(out_s), to_double(out_w)), kTol) << "outputs";
  // Inference chain too.
  const Tensor hi = first->forward_hidden_inference(b, Tensor());
  EXPECT_LE(rel_to_scale(to_double(last->forward_hidden_inference(b, hi)), to_double(out_w)), kTol);

  const Tensor dout = rand_f32(out_w.shape(), 11);
  whole->backward(b, aw, dout);
  const Tensor dh = last->backward_hidden(b, a2, dout);
  ASSERT_TRUE(dh.defined());
  EXPECT_EQ(dh.shape(), h.shape());
  EXPECT_FALSE(first->backward_hidden(b, a1, dh).defined());

  // Every whole-model parameter is in exactly one slice, except a tied
  // embedding, which the head slice keeps a copy of: its grads add up.
  size_t seen = 0;
  for (model::Param* p : whole->params()) {
    SCOPED_TRACE(p->name);
    model::Param* p1 = first->find_param(p->name);
    model::Param* p2 = last->find_param(p->name);
    ASSERT_TRUE(p1 || p2);
    std::vector<double> g(size_t(p->grad.numel()), 0.0);
    for (model::Param* q : {p1, p2}) {
      if (!q) continue;
      ++seen;
      EXPECT_EQ(to_double(q->weight), to_double(p->weight));
      const auto qg = to_double(q->grad);
      for (size_t i = 0; i < g.size(); ++i) g[i] += qg[i];
    }
    EXPECT_LE(rel_to_scale(g, to_double(p->grad)), kTol);
  }
  EXPECT_EQ(seen, first->params().size() + last->params().size());

  // Backward stages: a slice reports its own layers (global indices).
  std::vector<int64_t> stages;
  last->set_grad_ready_hook([&](int64_t s) { stages.push_back(s); });
  last->zero_grads();
  model::Activations a3;
  last->forward_hidden(b, h, a3);
  last->backward_hidden(b, a3, dout);
  std::vector<int64_t> want = {L};
  for (int64_t i = L - 1; i >= 1; --i) want.push_back(i);
  EXPECT_EQ(stages, want);
}

}  // namespace

TEST(ModelSlice, ChainEqualsWholeQwen2BiasesTied) { check_chain("qwen2", {}); }
TEST(ModelSlice, ChainEqualsWholeQwen3QkNorm) { check_chain("qwen3", {}); }
TEST(ModelSlice, ChainEqualsWholeLlamaTied) { check_chain("llama_tied", {}); }

TEST(ModelSlice, ChainEqualsWholeValueModel) {
  model::ModelOptions o;
  o.value_head = true;
  o.value_head_seed = 5;
  check_chain("qwen3", o);
  check_chain("qwen2", o);  // a value model is untied: the head slice holds no embedding
}

TEST(ModelSlice, SliceLoadsSavesAndInitsOnlyItsTensors) {
  const std::string dir = golden("qwen3");
  auto whole = load(dir, {});
  ASSERT_TRUE(whole);
  auto last = load(dir, slice_opts({}, 1, -1, false, true));
  ASSERT_TRUE(last);
  EXPECT_EQ(last->find_param("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(last->find_param("model.layers.0.input_layernorm.weight"), nullptr);
  ASSERT_NE(last->find_param("model.layers.1.input_layernorm.weight"), nullptr);
  ASSERT_NE(last->find_param("lm_head.weight"), nullptr);

  const std::string out = tmp_dir("last");
  ASSERT_TRUE(last->save(out, DType::F32).is_ok());
  auto src = io::WeightSource::open_dir(out);
  ASSERT_TRUE(src.is_ok()) << src.status().message();
  size_t n = 0;
  for (model::Param* p : whole->params()) {
    const bool mine = last->find_param(p->name) != nullptr;
    EXPECT_EQ(src.value().contains(p->name), mine) << p->name;
    n += mine;
  }
  EXPECT_EQ(n, last->params().size());
  // The saved slice loads back as the same slice, bit for bit.
  auto again = load(out, slice_opts({}, 1, -1, false, true));
  ASSERT_TRUE(again);
  for (model::Param* p : last->params())
    EXPECT_EQ(to_double(again->find_param(p->name)->weight), to_double(p->weight)) << p->name;

  // init_random: each tensor of a slice has the whole model's values.
  auto rw = model::CausalLM::init_random(whole->config(), {}, 42);
  for (auto o : {slice_opts({}, 0, 1, true, false), slice_opts({}, 1, -1, false, true)}) {
    auto rs = model::CausalLM::init_random(whole->config(), o, 42);
    for (model::Param* p : rs->params())
      EXPECT_EQ(to_double(p->weight), to_double(rw->find_param(p->name)->weight)) << p->name;
  }

  // Bad slices are refused with the reason.
  EXPECT_THROW(model::CausalLM::init_random(whole->config(), slice_opts({}, 1, 1, true, true), 1), Error);
  EXPECT_THROW(model::CausalLM::init_random(whole->config(), slice_opts({}, 0, 1, true, true), 1), Error);
  EXPECT_THROW(model::CausalLM::init_random(whole->config(), slice_opts({}, 1, 5, false, true), 1), Error);
  model::Activations a;
  EXPECT_THROW(last->forward(test_batch(whole->config().vocab_size), a), Error);
}
