// Rank layouts against hand-written tables of Megatron's RankGenerator, and
// every validation message. Single process: pure rank arithmetic.
#include <gtest/gtest.h>

#include "comm/world.h"
#include "parallel/grid.h"

using namespace kestrel;
using namespace kestrel::parallel;
using Groups = std::vector<std::vector<int>>;

namespace {
std::string message_of(const Status& s) { return s.is_ok() ? "<ok>" : s.message(); }
#define EXPECT_HAS(status, text) EXPECT_NE(message_of(status).find(text), std::string::npos) << message_of(status)
}  // namespace

// World 8, tp2 pp2 (dp2 derived): rank = tp + 2*dp + 4*pp.
TEST(GridLayout, World8Tp2Pp2Dp2) {
  ParallelDims d;
  d.tp = 2;
  d.pp = 2;
  GridLayout g(d, 8);
  EXPECT_EQ(g.dp(), 2);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.ranks_of(GroupKind::Tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::DpCp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Cp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpCp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Mp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpDp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpDpCp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Embedding), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::PositionEmbedding), (Groups{{0}, {1}, {2}, {3}}));
  // Expert grid with etp = tp, ep = 1: the dense layout again.
  EXPECT_EQ(g.ranks_of(GroupKind::Ep), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Etp), g.ranks_of(GroupKind::Tp));
  EXPECT_EQ(g.ranks_of(GroupKind::Edp), g.ranks_of(GroupKind::Dp));
  EXPECT_EQ(g.ranks_of(GroupKind::EtpEpPp), g.ranks_of(GroupKind::Mp));

  const auto c = g.coords(6);  // 6 = 0 + 2*1 + 4*1
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(g.locate(GroupKind::Mp, 6).group, 1);
  EXPECT_EQ(g.locate(GroupKind::Mp, 6).index, 2);
  EXPECT_EQ(g.locate(GroupKind::PositionEmbedding, 6).group, -1);  // last stage holds no position embedding
}

// World 16, tp2 cp2 pp2 (dp2), ep2 with etp = tp = 2 (edp = 16/(2*2*2) = 2).
// Dense: rank = tp + 2*cp + 4*dp + 8*pp. Expert: rank = etp + 2*ep + 4*edp + 8*pp.
TEST(GridLayout, World16Tp2Cp2Dp2Pp2Ep2) {
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  d.pp = 2;
  d.ep = 2;
  GridLayout g(d, 16);
  EXPECT_EQ(g.dp(), 2);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.ranks_of(GroupKind::Tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Cp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::DpCp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Pp), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpCp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Mp), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpDp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}, {8, 9, 12, 13}, {10, 11, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::TpDpCp), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Embedding), g.ranks_of(GroupKind::Pp));
  EXPECT_EQ(g.ranks_of(GroupKind::PositionEmbedding), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));

  EXPECT_EQ(g.ranks_of(GroupKind::Ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Etp), g.ranks_of(GroupKind::Tp));
  EXPECT_EQ(g.ranks_of(GroupKind::Edp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::EtpEp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::EtpEpPp), (Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));

  const auto c = g.coords(13);  // dense 13 = 1 + 2*0 + 4*1 + 8*1; expert 13 = 1 + 2*0 + 4*1 + 8*1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.etp, 1);
  EXPECT_EQ(c.ep, 0);
  EXPECT_EQ(c.edp, 1);
}

// The example the reference verified by running Megatron's own function:
// world 16, t2 c2 d2 p2, expert grid ETP=1, e=4, EDP=2 (EP folds over tp-cp).
TEST(GridLayout, MegatronVerifiedExpertFolding) {
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  d.pp = 2;
  d.ep = 4;
  d.etp = 1;
  GridLayout g(d, 16);
  EXPECT_EQ(g.edp(), 2);
  EXPECT_EQ(g.ranks_of(GroupKind::Ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Edp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Etp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Pp), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
}

// --use-tp-pp-dp-mapping: order tp-cp-ep-pp-dp puts dp outermost.
TEST(GridLayout, PpBeforeDpOrder) {
  ParallelDims d;
  d.tp = 2;
  d.pp = 2;
  d.order = "tp-cp-ep-pp-dp";
  GridLayout g(d, 8);
  EXPECT_EQ(g.ranks_of(GroupKind::Pp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Embedding), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(GridLayout, PipelineOfFourEmbeddingTakesFirstAndLast) {
  ParallelDims d;
  d.pp = 4;
  GridLayout g(d, 4);
  EXPECT_EQ(g.ranks_of(GroupKind::Pp), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(g.ranks_of(GroupKind::Embedding), (Groups{{0, 3}}));
  EXPECT_EQ(g.ranks_of(GroupKind::PositionEmbedding), (Groups{{0}}));
  EXPECT_EQ(g.locate(GroupKind::Embedding, 2).group, -1);
}

TEST(GridLayout, EveryPartitionCoversEachRankOnce) {
  ParallelDims d;
  d.tp = 2;
  d.cp = 2;
  d.pp = 3;
  d.ep = 2;
  d.etp = 1;
  GridLayout g(d, 24);
  for (GroupKind k : kAllGroupKinds) {
    if (k == GroupKind::Embedding || k == GroupKind::PositionEmbedding) continue;
    std::vector<int> seen(24, 0);
    for (const auto& grp : g.ranks_of(k))
      for (int r : grp) seen[r]++;
    for (int r = 0; r < 24; ++r) EXPECT_EQ(seen[r], 1) << group_kind_name(k) << " rank " << r;
  }
}

TEST(GridLayout, InvalidSizesThrowTheValidationMessage) {
  ParallelDims d;
  d.tp = 2;
  d.pp = 2;
  try {
    GridLayout g(d, 6);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible by tp*cp*pp = 4 (tp=2, cp=1, pp=2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Validate, WorldDivisibility) {
  ParallelDims d;
  d.tp = 2;
  d.pp = 2;
  EXPECT_TRUE(validate(d, 8).is_ok());
  EXPECT_HAS(validate(d, 6), "world size 6 is not divisible by tp*cp*pp = 4 (tp=2, cp=1, pp=2)");
  d.dp = 3;
  EXPECT_HAS(validate(d, 8), "data_parallel_size=3 does not match world size 8 / (tp*cp*pp = 4) = 2");
  d.dp = 2;
  EXPECT_TRUE(validate(d, 8).is_ok());
}

TEST(Validate, ExpertGridDivisibility) {
  ParallelDims d;
  d.tp = 2;
  d.ep = 4;
  d.pp = 2;
  EXPECT_HAS(validate(d, 8), "world size 8 is not divisible by etp*ep*pp = 16 (etp=2, ep=4, pp=2)");
  d.etp = 1;
  EXPECT_TRUE(validate(d, 8).is_ok());
  // pp not outermost: the expert and dense dp sizes must agree.
  d.order = "tp-cp-ep-pp-dp";
  EXPECT_HAS(validate(d, 8),
             "expert data-parallel size 1 (world / etp*ep*pp) must equal data-parallel size 2 when the order "
             "'tp-cp-ep-pp-dp' does not end in pp and pp=2 > 1");
}

TEST(Validate, SizesAndOrder) {
  ParallelDims d;
  d.tp = 0;
  d.etp = -1;
  d.order = "tp-dp-pp";
  const Status s = validate(d, 4);
  EXPECT_HAS(s, "tensor_model_parallel_size=0 must be >= 1");
  EXPECT_HAS(s, "expert_tensor_parallel_size=-1 must be >= 0 (0 = derive it)");
  EXPECT_HAS(s, "order 'tp-dp-pp' must list each of tp, cp, ep, dp, pp exactly once");
  EXPECT_HAS(validate(ParallelDims{}, 0), "world size 0 must be >= 1");
}

TEST(Validate, SequenceParallelNeedsTp) {
  ParallelDims d;
  d.sequence_parallel = true;
  EXPECT_HAS(validate(d, 2), "sequence_parallel requires tensor_model_parallel_size > 1");
  d.tp = 2;
  EXPECT_TRUE(validate(d, 2).is_ok());
}

TEST(Validate, ModelFacts) {
  ParallelDims d;
  d.tp = 4;
  ModelFacts m;
  m.n_heads = 14;
  EXPECT_HAS(validate(d, 4, m), "num_attention_heads=14 is not divisible by tensor_model_parallel_size=4");
  m.n_heads = 16;
  m.n_kv_heads = 2;  // tp divisible by kv heads: KV heads are replicated, allowed
  EXPECT_TRUE(validate(d, 4, m).is_ok()) << message_of(validate(d, 4, m));
  m.n_kv_heads = 3;
  EXPECT_HAS(validate(d, 4, m),
             "num_key_value_heads=3 and tensor_model_parallel_size=4: kv heads must be divisible by tp or tp by kv heads");
  m.n_kv_heads = 8;
  m.ffn = 4862;
  EXPECT_HAS(validate(d, 4, m), "intermediate_size=4862 is not divisible by tensor_model_parallel_size=4");
  m.ffn = 4864;
  m.vocab = 151643;
  EXPECT_HAS(validate(d, 4, m), "vocab_size=151643 is not divisible by tensor_model_parallel_size=4");
  m.vocab = 151936;
  EXPECT_TRUE(validate(d, 4, m).is_ok());

  ParallelDims p;
  p.pp = 4;
  ModelFacts layers;
  layers.n_layers = 30;
  EXPECT_HAS(validate(p, 4, layers), "num_hidden_layers=30 is not divisible by pipeline_model_parallel_size=4");

  ParallelDims e;
  e.ep = 4;
  e.tp = 2;
  e.etp = 1;
  ModelFacts moe;
  moe.n_experts = 6;
  const Status s = validate(e, 8, moe);
  EXPECT_HAS(s, "num_experts=6 is not divisible by expert_model_parallel_size=4");
  EXPECT_HAS(s, "MoE with tensor_model_parallel_size=2 > 1 requires sequence_parallel");
}

TEST(Validate, ReportsEveryProblemAtOnce) {
  ParallelDims d;
  d.tp = 4;
  d.sequence_parallel = false;
  ModelFacts m;
  m.n_heads = 14;
  m.ffn = 10;
  const Status s = validate(d, 6, m);
  EXPECT_HAS(s, "parallel config: world size 6 is not divisible by tp*cp*pp = 4");
  EXPECT_HAS(s, "; num_attention_heads=14");
  EXPECT_HAS(s, "; intermediate_size=10");
}

TEST(CheckSupported, EpRunsWithTensorDataAndPipelineParallelism) {
  ParallelDims d;
  d.tp = 2;
  d.dp = 2;
  d.sequence_parallel = true;
  EXPECT_TRUE(check_supported(d).is_ok());
  d.cp = 2;  // context parallelism runs (parallel/cp_attention.h, model/cp_batch.h)
  EXPECT_TRUE(check_supported(d).is_ok());
  d.ep = 2;
  EXPECT_HAS(check_supported(d), "not supported yet: expert_model_parallel_size=2 with context_parallel_size=2 "
             "(expert parallelism runs with tensor, data and pipeline parallelism: set context_parallel_size=1)");
  d.cp = 1;  // EP x TP (model/moe_mlp.h; tests/mpi/ep_tp_test.cpp)
  EXPECT_TRUE(check_supported(d).is_ok());
  ParallelDims e;  // EP x DP (the experts over ep, everything else data parallel), and with PP
  e.ep = 2;
  e.dp = 2;
  EXPECT_TRUE(check_supported(e).is_ok());
  e.pp = 2;
  EXPECT_TRUE(check_supported(e).is_ok());
  d.ep = 1;
  d.pp = 2;  // pipeline parallelism runs (train/pipeline.h)
  EXPECT_TRUE(check_supported(d).is_ok());
  d.pp = 1;
  d.etp = 1;  // expert tensor parallelism other than tp runs (model/moe_mlp.h, parallel/etp_dispatch.h)
  EXPECT_TRUE(check_supported(d).is_ok());
}

TEST(ProcessGrid, SingleProcessGroupsAreLocal) {
  comm::World world;  // not launched by mpirun: the size-1 local world
  ProcessGrid grid(world, ParallelDims{});
  for (GroupKind k : kAllGroupKinds) {
    ASSERT_NE(grid.group(k), nullptr) << group_kind_name(k);
    EXPECT_EQ(grid.group(k)->size(), 1);
    EXPECT_EQ(grid.group(k)->name(), group_kind_name(k));
  }
  EXPECT_TRUE(grid.is_first_stage());
  EXPECT_TRUE(grid.is_last_stage());
  EXPECT_EQ(grid.layout().dp(), 1);
  ParallelDims tp2;
  tp2.tp = 2;
  EXPECT_THROW(ProcessGrid(world, tp2), Error);
}
