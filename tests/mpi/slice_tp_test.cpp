// Model slices (pipeline stages) under tensor parallelism, with and without
// sequence parallelism: layers [0, 1) with the embedding chained into [1, L)
// with the head, through forward_hidden / backward_hidden on this rank's
// residual rows, give the whole TP model's logits and every gradient shard.
// The vocabulary (201) does not divide by tp, so the padded head is sliced too.
// Runs in mpi_tp_dp.sh (filter Tp*) under -np 2 and 4.
#include "comm/world.h"
#include "model/parallel_setup.h"
#include "parallel/setup.h"
#include "tp_testing.h"

using namespace kestrel;
using namespace kestrel::testing;

namespace {

io::ModelConfig config() {
  io::ModelConfig c;
  c.arch = io::Arch::Qwen3;
  c.model_type = "qwen3";
  c.vocab_size = 201;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-6;
  c.tie_word_embeddings = true;
  c.qk_norm = true;
  c.rope.head_dim = 8;
  c.rope.theta = 10000.0;
  return c;
}

void run(bool sp) {
  comm::World& world = *comm::World::current();
  const io::ModelConfig cfg = config();
  auto grid = parallel::make_process_grid(world, parallel::dims_for(world.size(), sp), model::model_facts(cfg));
  ASSERT_TRUE(grid.is_ok()) << grid.status().message();
  model::ModelOptions o;
  o.parallel = model::model_parallel_for(*grid.value());
  model::ModelOptions o1 = o, o2 = o;
  o1.num_layers = 1;
  o1.has_head = false;
  o2.first_layer = 1;
  o2.has_embedding = false;
  auto whole = model::CausalLM::init_random(cfg, o, 5, 0.1);
  auto first = model::CausalLM::init_random(cfg, o1, 5, 0.1);
  auto last = model::CausalLM::init_random(cfg, o2, 5, 0.1);
  for (auto* m : {whole.get(), first.get(), last.get()}) m->enable_grads();

  // 21 tokens: odd, so SP pads the residual rows.
  const model::PackedBatch b = model::pack_sequences({{1, 5, 9, 200, 7, 2, 8, 3}, {4, 4, 6, 199}, {11, 12, 13, 14, 15, 16, 17, 18, 19}});
  model::Activations aw, a1, a2;
  const Tensor lw = whole->forward(b, aw);  // [T, V/tp] this rank's columns
  const Tensor h = first->forward_hidden(b, Tensor(), a1);
  EXPECT_EQ(h.size(0), first->hidden_rows(b));
  const Tensor ls = last->forward_hidden(b, h, a2);
  EXPECT_CLOSE(ls, lw, "logits");

  const Tensor dl = rand_full(lw.shape(), 900 + uint64_t(whole->tp().rank()), 0.5f);  // this rank's dlogits
  whole->backward(b, aw, dl);
  const Tensor dh = last->backward_hidden(b, a2, dl);
  first->backward_hidden(b, a1, dh);
  for (model::Param* p : whole->params()) {
    model::Param* p1 = first->find_param(p->name);
    model::Param* p2 = last->find_param(p->name);
    ASSERT_TRUE(p1 || p2) << p->name;
    Tensor g = (p1 ? p1 : p2)->grad.clone();
    if (p1 && p2)  // the tied embedding: the head slice's copy adds its grad
      for (int64_t i = 0; i < g.numel(); ++i) g.set(i, g.get(i) + p2->grad.get(i));
    EXPECT_CLOSE(g, p->grad, "grad of " + p->name);
  }
}

}  // namespace

TEST(TpSlice, ChainEqualsWhole) { run(false); }
TEST(TpSlice, ChainEqualsWholeSp) { run(true); }
