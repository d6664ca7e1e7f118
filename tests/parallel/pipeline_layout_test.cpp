// Pipeline layer layout (parallel/pipeline_layout.h): Megatron-Core's even
// and uneven splits with virtual pipeline chunks, MindSpeed's noop layers,
// and every error naming its config keys and numbers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/pipeline_layout.h"

using namespace kestrel;
using namespace kestrel::parallel;

namespace {

// One chunk as {first_slot, num_slots, first_layer, num_layers}.
struct Want {
  int64_t first_slot, num_slots, first_layer, num_layers;
};

void expect_chunk(const StageChunk& c, const Want& w, const std::string& where) {
  EXPECT_EQ(c.first_slot, w.first_slot) << where;
  EXPECT_EQ(c.num_slots, w.num_slots) << where;
  EXPECT_EQ(c.first_layer, w.first_layer) << where;
  EXPECT_EQ(c.num_layers, w.num_layers) << where;
}

std::vector<std::vector<StageChunk>> chunks_ok(const PipelineSpec& s, int64_t layers) {
  auto r = pipeline_chunks(s, layers);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : std::vector<std::vector<StageChunk>>{};
}

// The error message of a layout that must fail; each of `parts` must appear.
void expect_error(const PipelineSpec& s, int64_t layers, const std::vector<std::string>& parts) {
  auto r = pipeline_chunks(s, layers);
  ASSERT_FALSE(r.is_ok()) << "pp=" << s.pp << " vpp=" << s.vpp << " layers=" << layers;
  for (const auto& p : parts) EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message()
                                                                                          << "\n  lacks: " << p;
}

// Invariants of any layout: virtual stages tile the slots in order c*pp + r,
// real layers tile [0, L) in the same order, embedding/head on the ends.
void expect_tiles(const std::vector<std::vector<StageChunk>>& ch, int64_t layers, int64_t slots) {
  const size_t pp = ch.size(), vpp = ch.empty() ? 0 : ch[0].size();
  int64_t slot = 0, layer = 0;
  for (size_t c = 0; c < vpp; ++c)
    for (size_t r = 0; r < pp; ++r) {
      const StageChunk& k = ch[r][c];
      EXPECT_EQ(k.first_slot, slot);
      EXPECT_EQ(k.first_layer, layer);
      EXPECT_GT(k.num_slots, 0);
      EXPECT_EQ(k.has_embedding, r == 0 && c == 0);
      EXPECT_EQ(k.has_head, r == pp - 1 && c == vpp - 1);
      slot += k.num_slots;
      layer += k.num_layers;
    }
  EXPECT_EQ(slot, slots);
  EXPECT_EQ(layer, layers);
}

}  // namespace

TEST(PipelineLayout, NoPipelineIsOneChunkWithEverything) {
  auto ch = chunks_ok({}, 24);
  ASSERT_EQ(ch.size(), 1u);
  ASSERT_EQ(ch[0].size(), 1u);
  expect_chunk(ch[0][0], {0, 24, 0, 24}, "pp1");
  EXPECT_TRUE(ch[0][0].has_embedding);
  EXPECT_TRUE(ch[0][0].has_head);
}

TEST(PipelineLayout, EvenSplit) {
  PipelineSpec s;
  s.pp = 4;
  auto ch = chunks_ok(s, 24);
  ASSERT_EQ(ch.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ch[size_t(r)].size(), 1u);
    expect_chunk(ch[size_t(r)][0], {6 * r, 6, 6 * r, 6}, "rank " + std::to_string(r));
  }
  expect_tiles(ch, 24, 24);
  EXPECT_EQ(pipeline_stage_slots(s, 24).value(), (std::vector<int64_t>{6, 6, 6, 6}));
}

// Megatron's docstring: 16 layers, pp 4, vpp 2: GPU0 [1,2][9,10], GPU1 [3,4][11,12], ... (1-based).
TEST(PipelineLayout, VirtualChunksInterleave) {
  PipelineSpec s;
  s.pp = 4;
  s.vpp = 2;
  auto ch = chunks_ok(s, 16);
  ASSERT_EQ(ch.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ch[size_t(r)].size(), 2u);
    expect_chunk(ch[size_t(r)][0], {2 * r, 2, 2 * r, 2}, "chunk 0");
    expect_chunk(ch[size_t(r)][1], {8 + 2 * r, 2, 8 + 2 * r, 2}, "chunk 1");
  }
  expect_tiles(ch, 16, 16);
  // transformer_block.py's example: 8 layers, 2 stages, 4 chunks: stage 0 [0] [2] [4] [6].
  s.pp = 2;
  s.vpp = 4;
  ch = chunks_ok(s, 8);
  for (int c = 0; c < 4; ++c) {
    expect_chunk(ch[0][size_t(c)], {2 * c, 1, 2 * c, 1}, "stage 0");
    expect_chunk(ch[1][size_t(c)], {2 * c + 1, 1, 2 * c + 1, 1}, "stage 1");
  }
}

TEST(PipelineLayout, UnevenFirstAndLast) {
  PipelineSpec s;
  s.pp = 4;
  s.first_stage_layers = 2;
  s.last_stage_layers = 2;
  auto ch = chunks_ok(s, 16);  // [2, 6, 6, 2]
  expect_chunk(ch[0][0], {0, 2, 0, 2}, "first");
  expect_chunk(ch[1][0], {2, 6, 2, 6}, "middle 1");
  expect_chunk(ch[2][0], {8, 6, 8, 6}, "middle 2");
  expect_chunk(ch[3][0], {14, 2, 14, 2}, "last");
  expect_tiles(ch, 16, 16);

  // With vpp 2 every stage halves: Megatron's get_transformer_layer_offset gives
  // rank 1 chunk 1 the offset 8 + 1 + 0 * 3 = 9 and rank 2 chunk 1 8 + 1 + 3 = 12.
  s.vpp = 2;
  ch = chunks_ok(s, 16);
  expect_chunk(ch[0][0], {0, 1, 0, 1}, "r0c0");
  expect_chunk(ch[1][0], {1, 3, 1, 3}, "r1c0");
  expect_chunk(ch[2][0], {4, 3, 4, 3}, "r2c0");
  expect_chunk(ch[3][0], {7, 1, 7, 1}, "r3c0");
  expect_chunk(ch[0][1], {8, 1, 8, 1}, "r0c1");
  expect_chunk(ch[1][1], {9, 3, 9, 3}, "r1c1");
  expect_chunk(ch[2][1], {12, 3, 12, 3}, "r2c1");
  expect_chunk(ch[3][1], {15, 1, 15, 1}, "r3c1");
  expect_tiles(ch, 16, 16);
}

TEST(PipelineLayout, UnevenOnlyOneEnd) {
  PipelineSpec s;
  s.pp = 2;
  s.first_stage_layers = 3;  // pp 2: the last rank is the one "middle" rank and takes the rest
  EXPECT_EQ(pipeline_stage_slots(s, 10).value(), (std::vector<int64_t>{3, 7}));
  s.first_stage_layers = -1;
  s.last_stage_layers = 4;
  s.pp = 3;
  EXPECT_EQ(pipeline_stage_slots(s, 10).value(), (std::vector<int64_t>{3, 3, 4}));
  // pp 1: the only stage is first and last; Megatron accepts a size equal to
  // all layers (no effect) and rejects anything else.
  s.pp = 1;
  s.last_stage_layers = 10;
  EXPECT_EQ(pipeline_stage_slots(s, 10).value(), (std::vector<int64_t>{10}));
}

// MindSpeed's example: 126 real layers, noop 0 and 127: 128 slots.
TEST(PipelineLayout, NoopLayersPp4) {
  PipelineSpec s;
  s.pp = 4;
  s.noop_layers = {127, 0};  // any order
  auto ch = chunks_ok(s, 126);
  expect_chunk(ch[0][0], {0, 32, 0, 31}, "rank 0 (noop slot 0)");
  expect_chunk(ch[1][0], {32, 32, 31, 32}, "rank 1");
  expect_chunk(ch[2][0], {64, 32, 63, 32}, "rank 2");
  expect_chunk(ch[3][0], {96, 32, 95, 31}, "rank 3 (noop slot 127)");
  expect_tiles(ch, 126, 128);
}

TEST(PipelineLayout, NoopLayersPp8Vpp2) {
  PipelineSpec s;
  s.pp = 8;
  s.vpp = 2;
  s.noop_layers = {0, 127};
  auto ch = chunks_ok(s, 126);
  ASSERT_EQ(ch.size(), 8u);
  expect_chunk(ch[0][0], {0, 8, 0, 7}, "virtual stage 0");
  expect_chunk(ch[1][0], {8, 8, 7, 8}, "virtual stage 1");
  expect_chunk(ch[7][0], {56, 8, 55, 8}, "virtual stage 7");
  expect_chunk(ch[0][1], {64, 8, 63, 8}, "virtual stage 8");
  expect_chunk(ch[6][1], {112, 8, 111, 8}, "virtual stage 14");
  expect_chunk(ch[7][1], {120, 8, 119, 7}, "virtual stage 15");
  expect_tiles(ch, 126, 128);
}

TEST(PipelineLayout, AllNoopChunkHoldsNoRealLayer) {
  PipelineSpec s;
  s.pp = 2;
  s.noop_layers = {0, 1};  // 2 real + 2 noop: rank 0 holds only noop slots
  auto ch = chunks_ok(s, 2);
  expect_chunk(ch[0][0], {0, 2, 0, 0}, "all noop");
  expect_chunk(ch[1][0], {2, 2, 0, 2}, "all real");
  EXPECT_TRUE(ch[0][0].has_embedding);
}

TEST(PipelineLayout, SizeErrors) {
  PipelineSpec s;
  s.pp = 0;
  expect_error(s, 8, {"pipeline_model_parallel_size=0", ">= 1"});
  s.pp = 2;
  s.vpp = 0;
  expect_error(s, 8, {"virtual_pipeline_model_parallel_size=0", ">= 1"});
  s.pp = 1;
  s.vpp = 2;
  expect_error(s, 8, {"virtual_pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1",
                      "pipeline-model-parallel size should be greater than 1 with interleaved schedule", ">= 2"});
  s = {};
  expect_error(s, 0, {"num_hidden_layers=0"});
  s.microbatch_group_size = -1;
  expect_error(s, 8, {"microbatch_group_size_per_vp_stage=-1"});
}

TEST(PipelineLayout, EvenSplitErrors) {
  PipelineSpec s;
  s.pp = 4;
  expect_error(s, 30, {"30 layers (num_hidden_layers)", "pipeline_model_parallel_size=4",
                       "virtual_pipeline_model_parallel_size=1", "add 2 noop layers",
                       "override_transformer_config.noop_layers", "reach 32",
                       "override_transformer_config.num_layers_in_first_pipeline_stage"});
  s.vpp = 4;
  expect_error(s, 24, {"24 layers", "pipeline_model_parallel_size=4", "virtual_pipeline_model_parallel_size=4",
                       "= 16 pipeline stages", "add 8 noop layers"});
  s.vpp = 1;
  s.noop_layers = {0};
  expect_error(s, 30, {"31 slots (num_hidden_layers 30 + 1 noop_layers)", "add 1 noop layers"});
}

TEST(PipelineLayout, UnevenErrors) {
  const std::string first = "override_transformer_config.num_layers_in_first_pipeline_stage";
  const std::string last = "override_transformer_config.num_layers_in_last_pipeline_stage";
  PipelineSpec s;
  s.pp = 4;
  s.first_stage_layers = 0;
  expect_error(s, 16, {first + "=0", "must be larger than 0"});
  s.first_stage_layers = 3;
  s.vpp = 2;
  expect_error(s, 16, {first + "=3", "divisible by virtual_pipeline_model_parallel_size=2"});
  s.vpp = 1;
  s.first_stage_layers = 10;
  s.last_stage_layers = 8;
  expect_error(s, 16, {first + "=10", last + "=8", "more than the 16 layers", "at most 16"});
  s.first_stage_layers = 3;
  s.last_stage_layers = 2;
  expect_error(s, 16, {first + "=3", last + "=2", "leaves 11", "2 middle stages",
                       "pipeline_model_parallel_size=4", "multiple of 2"});
  s.first_stage_layers = 2;
  s.vpp = 2;
  expect_error(s, 18, {"leaves 7 slots on each middle stage", "virtual_pipeline_model_parallel_size=2",
                       "multiple of 4"});
  s.vpp = 1;
  s.pp = 2;
  s.first_stage_layers = 6;
  s.last_stage_layers = 6;
  expect_error(s, 16, {first + "=6", last + "=6", "leaves 4", "0 middle stage(s)",
                       "pipeline_model_parallel_size=2", "sum to 16"});
  s.pp = 3;
  s.first_stage_layers = 8;
  s.last_stage_layers = 8;
  expect_error(s, 16, {"leaves 0", "1 middle stage(s)", "less than 16"});
  s.pp = 1;
  expect_error(s, 16, {first + "=8", last + "=8", "pipeline_model_parallel_size=1", "unset both"});
  s.last_stage_layers = -1;
  s.first_stage_layers = 5;
  expect_error(s, 16, {first + "=5", "leaves 11", "0 middle stage(s)", "sum to 16"});
}

TEST(PipelineLayout, NoopErrors) {
  PipelineSpec s;
  s.pp = 4;
  s.noop_layers = {0, 128};
  expect_error(s, 126, {"override_transformer_config.noop_layers", "128", "outside [0, 128)",
                        "128 slots (num_hidden_layers 126 + 2 noop_layers)"});
  s.noop_layers = {-1, 127};
  expect_error(s, 126, {"override_transformer_config.noop_layers", "-1", "outside [0, 128)"});
  s.noop_layers = {5, 5};
  expect_error(s, 126, {"override_transformer_config.noop_layers", "lists 5 twice"});
}

TEST(PipelineLayout, InterleavedMicroBatchConstraint) {
  PipelineSpec s;
  s.pp = 4;
  EXPECT_TRUE(check_interleaved_microbatches(s, 3).is_ok());  // vpp 1: plain 1F1B runs any m
  s.vpp = 2;
  EXPECT_EQ(microbatch_group_size(s), 4);
  for (int64_t m : {4, 8, 12, 16}) EXPECT_TRUE(check_interleaved_microbatches(s, m).is_ok()) << m;
  auto msg = [&](int64_t m) { return check_interleaved_microbatches(s, m).message(); };
  auto has = [](const std::string& m, const std::string& part) { return m.find(part) != std::string::npos; };
  std::string e = msg(3);
  EXPECT_TRUE(has(e, "should range in [PP=4, M=3]")) << e;
  EXPECT_TRUE(has(e, "microbatch_group_size_per_vp_stage (null: pipeline_model_parallel_size=4)")) << e;
  EXPECT_TRUE(has(e, "virtual_pipeline_model_parallel_size=2")) << e;
  EXPECT_TRUE(has(e, "at least 4 micro-batches")) << e;
  e = msg(6);
  EXPECT_TRUE(has(e, "remainder of M=6")) << e;
  EXPECT_TRUE(has(e, "N=4")) << e;
  EXPECT_TRUE(has(e, "but it is 2")) << e;
  EXPECT_TRUE(has(e, "dependency bubbles")) << e;
  // Megatron's docstring case PP2 N3 M5: 5 % 3 = 2 >= 2.
  s.pp = 2;
  s.microbatch_group_size = 3;
  EXPECT_TRUE(check_interleaved_microbatches(s, 5).is_ok());
  e = msg(2);
  EXPECT_TRUE(has(e, "microbatch_group_size_per_vp_stage=3")) << e;
  EXPECT_TRUE(has(e, "[PP=2, M=2]")) << e;
  e = msg(4);  // 4 % 3 = 1 < 2
  EXPECT_TRUE(has(e, "but it is 1")) << e;
  s.pp = 4;
  e = msg(8);  // N 3 < PP 4
  EXPECT_TRUE(has(e, "[PP=4, M=8]")) << e;
  EXPECT_TRUE(has(e, "between 4 and 8")) << e;
  s.microbatch_group_size = 5;
  EXPECT_TRUE(check_interleaved_microbatches(s, 9).is_ok());  // 9 % 5 = 4 >= 4
  EXPECT_TRUE(check_interleaved_microbatches(s, 10).is_ok());
  s.pp = 1;  // interleaving needs two stages (the layout's rule)
  EXPECT_TRUE(has(msg(8), "should be greater than 1 with interleaved schedule")) << msg(8);
}
