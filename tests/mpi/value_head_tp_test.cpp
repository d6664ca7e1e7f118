// Scratch: value head under TP2 (+SP) vs one process: values, all reassembled grads.
#include <gtest/gtest.h>
#include "comm/world.h"
#include "model/parallel_setup.h"
#include "parallel/setup.h"
#include "mpi/tp_testing.h"
using namespace kestrel;
using namespace kestrel::testing;
static io::ModelConfig cfg() {
  io::ModelConfig c; c.arch = io::Arch::Qwen2; c.model_type = "qwen2"; c.vocab_size = 128; c.hidden_size = 64;
  c.intermediate_size = 128; c.num_hidden_layers = 2; c.num_attention_heads = 4; c.num_key_value_heads = 2;
  c.head_dim = 16; c.max_position_embeddings = 64; c.rms_norm_eps = 1e-6; c.tie_word_embeddings = true;
  c.attention_bias = true; c.rope.head_dim = 16; c.rope.theta = 10000.0; return c;
}
static void run(bool sp) {
  comm::World& world = *comm::World::current();
  const std::vector<std::vector<int32_t>> seqs = {{1,5,9,3,7,2,8}, {4,4,6}, {11,12,13,14,15,16,17,18,19}};
  model::PackedBatch b = model::pack_sequences(seqs);  // 19 tokens: odd, SP pads
  std::vector<float> c(19); for (int i = 0; i < 19; ++i) c[i] = float((i * 7) % 5) - 2.0f;
  model::ModelOptions ro; ro.value_head = true; ro.value_head_bias = true;
  auto ref = model::CausalLM::init_random(cfg(), ro, 99, 0.1);
  ref->find_param("score.bias")->weight.fill_(0.3f);
  ref->enable_grads();
  model::Activations ra; Tensor rv = ref->forward(b, ra);
  ref->backward(b, ra, Tensor::from_vector(c, {19, 1}));
  auto grid = parallel::make_process_grid(world, parallel::dims_for(2, sp), model::model_facts(cfg())).value();
  model::ModelOptions o = ro; o.parallel = model::model_parallel_for(*grid);
  auto m = model::CausalLM::init_random(cfg(), o, 99, 0.1);
  m->find_param("score.bias")->weight.fill_(0.3f);
  m->enable_grads();
  model::Activations a; Tensor v = m->forward(b, a);
  EXPECT_CLOSE(v, rv, "values");
  m->backward(b, a, Tensor::from_vector(c, {19, 1}));
  int n = 0;
  for (model::Param* p : m->params()) {
    Tensor full = parallel::gather_tensor(m->tp(), p->grad, p->shard, p->full_shape);
    EXPECT_CLOSE(full, ref->find_param(p->name)->grad, p->name);
    ++n;
  }
  EXPECT_GT(n, 20);
}
TEST(TpValueHead, Tp2) { run(false); }
TEST(TpValueHead, Tp2Sp) { run(true); }
