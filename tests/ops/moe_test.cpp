// ops/moe.h, routing: the router, its losses and the capacity rules -- the
// CPU kernels against the double reference (f32 and bf16), the reference
// backwards against central finite differences, HF's routers and Megatron's
// helpers on hand cases. The experts' side (permutation, grouped GEMM, the
// shared-expert gate, composition and threads): moe_experts_test.cpp.
#include "ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "backend/cpu/gemm.h"
#include "core/parallel_for.h"
#include "gemm_providers.h"
#include "moe_testing.h"
#include "op_harness.h"
#include "ops/linear.h"
#include "ops/ref/moe_ref.h"

namespace kestrel {
namespace {

using namespace testing;
using namespace moe_testing;
using ops::MoeDropPolicy;
using ops::MoeGroupLimit;
using ops::MoeRouterConfig;
using ops::MoeScore;

struct RouterCase {
  const char* name;
  MoeRouterConfig cfg;
  bool bias;
};
// Every router the models use, at sizes that are not multiples of 8/16.
std::vector<RouterCase> router_cases() {
  return {
      {"qwen k=1", router_cfg(7, 1, MoeScore::Softmax), false},
      {"qwen k=4 norm", router_cfg(12, 4, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true), false},
      {"deepseek-v2 group max", router_cfg(16, 3, MoeScore::Softmax, MoeGroupLimit::Max, 4, 2, false, 2.5), false},
      {"deepseek-v3 sigmoid sumtop2", router_cfg(16, 4, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, true, 2.5),
       true},
      {"sigmoid bias k=2", router_cfg(9, 2, MoeScore::Sigmoid), true},
      {"megatron softmax sumtop2", router_cfg(20, 4, MoeScore::Softmax, MoeGroupLimit::SumTop2, 5, 2), false},
  };
}

// Router outputs of the kernel (run on logits of dtype dt) and the reference.
struct RouterRun {
  std::vector<int32_t> idx, ref_idx;
  std::vector<double> w, ref_w, scores, ref_scores;
};
RouterRun run_router(const RouterCase& rc, int64_t T, DType dt, uint64_t seed) {
  const int64_t E = rc.cfg.num_experts, k = rc.cfg.top_k;
  const auto logits = round_to(randn(T * E, seed, 2.0), dt);
  const auto bias = round_to(randn(E, seed + 1, 0.1), DType::F32);
  Tensor bt = make_tensor(bias, {E}, DType::F32);
  Tensor idx = Tensor::empty({T, k}, DType::I32), w = nan_tensor({T, k}, DType::F32),
         sc = nan_tensor({T, E}, DType::F32);
  ops::moe_router_fwd(make_tensor(logits, {T, E}, dt), rc.bias ? &bt : nullptr, rc.cfg, idx, w, sc);
  RouterRun r{ints(idx), std::vector<int32_t>(size_t(T * k)), values(w), std::vector<double>(size_t(T * k)),
              values(sc), std::vector<double>(size_t(T * E))};
  ops::ref::moe_router_fwd<double>(logits.data(), rc.bias ? bias.data() : nullptr, rc.cfg, T, r.ref_idx.data(),
                                   r.ref_w.data(), r.ref_scores.data());
  r.ref_w = round_to(r.ref_w, dt);  // the kernel rounds the weights to the logits' dtype
  return r;
}

// ---- router -----------------------------------------------------------------

TEST(MoeRouter, ForwardMatchesReference) {
  for (DType dt : float_dtypes())
    for (const auto& rc : router_cases()) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + rc.name);
      const RouterRun r = run_router(rc, 37, dt, 10);
      EXPECT_EQ(r.idx, r.ref_idx);
      EXPECT_TRUE(close_for(dt, r.w, r.ref_w, "topk_w"));
      EXPECT_TRUE(close_for(DType::F32, r.scores, r.ref_scores, "scores"));
    }
}

TEST(MoeRouter, GroupLimitsBindAndChoicesAreDescending) {
  // The group-limited cases choose differently from a plain top-k on some
  // tokens (else the test above would not test the limit).
  for (const auto& rc : router_cases()) {
    if (rc.cfg.group_limit == MoeGroupLimit::None) continue;
    SCOPED_TRACE(rc.name);
    RouterCase plain = rc;
    plain.cfg.group_limit = MoeGroupLimit::None;
    const RouterRun limited = run_router(rc, 37, DType::F32, 10), free = run_router(plain, 37, DType::F32, 10);
    int differ = 0;
    for (size_t i = 0; i < limited.idx.size(); ++i) differ += limited.idx[i] != free.idx[i];
    EXPECT_GT(differ, 5);
  }
  // Descending choice, ties to the lower expert: equal logits choose 0, 1, 2.
  Tensor idx = Tensor::empty({2, 3}, DType::I32), w = Tensor::empty({2, 3}, DType::F32),
         sc = Tensor::empty({2, 6}, DType::F32);
  ops::moe_router_fwd(make_tensor({1, 1, 1, 1, 1, 1, 0, 2, 0, 2, 1, 3}, {2, 6}, DType::F32), nullptr,
                      router_cfg(6, 3, MoeScore::Softmax), idx, w, sc);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{0, 1, 2, 5, 1, 3}));
}

TEST(MoeRouter, MatchesHuggingFaceRouters) {
  // Expected values from transformers 5.24 / torch 2.15 (CPU), computed once with
  // Qwen3MoeTopKRouter, DeepseekV2TopkRouter and DeepseekV3TopkRouter whose
  // weight is eye(8) and hidden_size 8, so router_logits == the hidden states
  // below (bf16: hidden and weight in bf16). The DeepSeek routers return an
  // unsorted top-k; their rows are listed in Kestrel's order (descending
  // choice: scores, or scores + e_score_correction_bias for V3).
  const std::vector<double> logits = {
      0.50, -1.25, 2.00, 0.75, 1.90, -0.30, 0.10, 1.10,   // token 0
      -0.40, 0.80, 0.20, -2.10, 1.30, 1.35, -0.60, 0.05,  // token 1
      1.70, 1.60, -0.90, 0.30, -0.20, 0.40, 1.65, -1.00,  // token 2
  };
  const std::vector<double> bias = {0.10, -0.20, 0.00, 0.30, -0.10, 0.05, 0.20, -0.30};
  struct HfCase {
    const char* name;
    MoeRouterConfig cfg;
    DType dt;
    bool bias;
    std::vector<int32_t> idx;
    std::vector<double> w;
  };
  const std::vector<int32_t> qwen_idx = {2, 4, 5, 4, 0, 6};
  const HfCase cases[] = {
      {"qwen3 norm_topk_prob=False", router_cfg(8, 2, MoeScore::Softmax), DType::F32, false, qwen_idx,
       {0.321580261, 0.290977836, 0.288588524, 0.27451387, 0.272758782, 0.259456158}},
      {"qwen3 bf16 norm_topk_prob=False", router_cfg(8, 2, MoeScore::Softmax), DType::BF16, false, qwen_idx,
       {0.322265625, 0.291015625, 0.2890625, 0.2734375, 0.2734375, 0.259765625}},
      {"qwen3 norm_topk_prob=True", router_cfg(8, 2, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true), DType::F32,
       false, qwen_idx, {0.524979174, 0.475020766, 0.512497425, 0.487502605, 0.512497425, 0.487502575}},
      {"qwen3 bf16 norm_topk_prob=True", router_cfg(8, 2, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true),
       DType::BF16, false, qwen_idx, {0.5234375, 0.474609375, 0.51171875, 0.486328125, 0.51171875, 0.486328125}},
      {"deepseek-v2 greedy, routed_scaling_factor 2.5",
       router_cfg(8, 2, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, false, 2.5), DType::F32, false, qwen_idx,
       {0.803950667, 0.727444589, 0.72147131, 0.686284661, 0.681896925, 0.648640394}},
      // Binds: token 0's plain top-3 is {2, 4, 7}.
      {"deepseek-v2 group_limited_greedy n_group 4, topk_group 2, k 3, scaling 1.5",
       router_cfg(8, 3, MoeScore::Softmax, MoeGroupLimit::Max, 4, 2, false, 1.5), DType::F32, false,
       {2, 4, 3, 5, 4, 1, 0, 6, 1},
       {0.482370377, 0.436466753, 0.13820143, 0.432882786, 0.411770821, 0.249751657, 0.409138173, 0.389184237,
        0.370203525}},
      // Binds: with the bias but no groups token 1 would take {5, 4, 6}, token 2 {6, 0, 3}.
      {"deepseek-v3 norm_topk_prob=True, n_group 4, topk_group 2, k 3, scaling 2.5",
       router_cfg(8, 3, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, true, 2.5), DType::F32, true,
       {3, 2, 4, 5, 4, 0, 0, 3, 1},
       {0.698781669, 0.906219244, 0.894999027, 1.00204265, 0.991576433, 0.506380916, 0.938650608, 0.637703836,
        0.923645616}},
      {"deepseek-v3 norm_topk_prob=False, n_group 4, topk_group 2, k 3",
       router_cfg(8, 3, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, false, 1.0), DType::F32, true,
       {3, 2, 4, 5, 4, 0, 0, 3, 1},
       {0.679178715, 0.880797029, 0.869891584, 0.79412961, 0.785835028, 0.401312351, 0.845534801, 0.574442506,
        0.832018375}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t k = c.cfg.top_k;
    Tensor bt = make_tensor(bias, {8}, DType::F32);
    Tensor idx = Tensor::empty({3, k}, DType::I32), w = Tensor::empty({3, k}, DType::F32),
           sc = Tensor::empty({3, 8}, DType::F32);
    ops::moe_router_fwd(make_tensor(logits, {3, 8}, c.dt), c.bias ? &bt : nullptr, c.cfg, idx, w, sc);
    EXPECT_EQ(ints(idx), c.idx);
    // f32: PyTorch's and our f32 exp differ by an ulp or two; bf16: the same bf16 values.
    EXPECT_TRUE(all_close(values(w), c.w, c.dt == DType::BF16 ? Tolerance{0, 0} : Tolerance{1e-7, 1e-6}, "topk_w"));
  }
}

TEST(MoeRouter, MatchesMegatronHelpers) {
  // Expected values from Megatron-LM's own functions (megatron/core/transformer/
  // moe/moe_utils.py at the mirrored HEAD: topk_routing_with_score_function,
  // compute_routing_scores_for_aux_loss + switch_load_balancing_loss_func,
  // _apply_seq_aux_loss's reshape, z_loss_func, apply_router_token_dropping),
  // run once in torch 2.15 (CPU, f32) on these logits; gradients by autograd.
  const std::vector<double> logits = {
      0.50, -1.25, 2.00, 0.75, 1.90, -0.30, 0.10, 1.10,   // token 0 (sequence 0)
      -0.40, 0.80, 0.20, -2.10, 1.30, 1.35, -0.60, 0.05,  // token 1 (sequence 0)
      1.70, 1.60, -0.90, 0.30, -0.20, 0.40, 1.65, -1.00,  // token 2 (sequence 1)
      0.20, 0.90, -0.50, 1.20, 0.00, -1.10, 0.60, 0.35,   // token 3 (sequence 1)
  };
  const std::vector<double> bias = {0.10, -0.20, 0.00, 0.30, -0.10, 0.05, 0.20, -0.30};
  const int64_t T = 4, E = 8;
  Tensor lt = make_tensor(logits, {T, E}, DType::F32), bt = make_tensor(bias, {E}, DType::F32);
  // Routers with moe_router_num_groups 4, group_topk 2, k 4 (Megatron's group score: the sum of
  // the top k / group_topk = 2); Megatron lists a token's experts by index, so sort ours too.
  struct Case {
    MoeRouterConfig cfg;
    bool bias;
    std::vector<int32_t> idx;
    std::vector<double> w;
  };
  const Case routers[] = {
      {router_cfg(E, 4, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, true, 2.5), true,
       {2, 3, 4, 5, 0, 1, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3},
       {0.771161079, 0.594638944, 0.761613131, 0.372586846, 0.375584602, 0.645740867, 0.735455811, 0.74321866,
        0.831876695, 0.818578601, 0.28438139, 0.565163374, 0.571113884, 0.738465071, 0.392152429, 0.798268676}},
      {router_cfg(E, 4, MoeScore::Softmax, MoeGroupLimit::SumTop2, 4, 2), false,
       {2, 3, 4, 5, 0, 1, 4, 5, 0, 1, 6, 7, 0, 1, 2, 3},
       {0.321580261, 0.0921342894, 0.290977836, 0.0322412662, 0.0501491651, 0.166501105, 0.27451387, 0.288588524,
        0.272758782, 0.246802345, 0.259456158, 0.0183308925, 0.100265302, 0.201909482, 0.0497902706, 0.272549331}},
  };
  for (const auto& c : routers) {
    Tensor idx = Tensor::empty({T, 4}, DType::I32), w = Tensor::empty({T, 4}, DType::F32),
           sc = Tensor::empty({T, E}, DType::F32);
    ops::moe_router_fwd(lt, c.bias ? &bt : nullptr, c.cfg, idx, w, sc);
    auto ix = ints(idx);
    auto wv = values(w);
    for (int64_t t = 0; t < T; ++t) {  // by expert index within each token
      std::vector<std::pair<int32_t, double>> row;
      for (int64_t j = 0; j < 4; ++j) row.emplace_back(ix[size_t(t * 4 + j)], wv[size_t(t * 4 + j)]);
      std::sort(row.begin(), row.end());
      for (int64_t j = 0; j < 4; ++j) std::tie(ix[size_t(t * 4 + j)], wv[size_t(t * 4 + j)]) = row[size_t(j)];
    }
    EXPECT_EQ(ix, c.idx);
    EXPECT_TRUE(all_close(wv, c.w, {1e-7, 1e-6}, "probs"));
  }
  // Load-balancing losses, k = 2, coeff 0.01: one group (aux_loss, softmax and
  // sigmoid) and the two sequences as groups (seq_aux_loss); the z-loss, coeff 0.001.
  struct LossCase {
    std::vector<int32_t> cu;
    MoeScore score;
    double loss;
    std::vector<double> grad;
  };
  const LossCase losses[] = {
      {{0, 4}, MoeScore::Softmax, 0.0108604031,
       {-2.87435196e-05, -4.99487487e-06, -0.00012881952, -3.69074114e-05, 0.000610883872, -1.29152968e-05,
        -1.92673579e-05, -0.000379236037, -2.45560914e-05, -8.15290987e-05, -4.47441125e-05, -4.4859944e-06,
        0.000551865902, -0.000141310549, -2.0104826e-05, -0.000235135463, -1.53189994e-05, -1.38612031e-05,
        -1.13779697e-06, -3.7776183e-06, 9.96991294e-05, -4.17491401e-06, -1.45718814e-05, -4.68567523e-05,
        8.6231621e-06, 1.73649114e-05, 4.2821348e-06, 2.34401832e-05, 0.000212285726, 2.3500852e-06, 1.2864245e-05,
        -0.000281210436}},
      {{0, 4}, MoeScore::Sigmoid, 0.0102700256,
       {-2.83877898e-06, -2.09105724e-06, -1.26829354e-06, -2.63211018e-06, 5.54978797e-05, -2.95298787e-06,
        -3.01239265e-06, -9.64035062e-05, -9.32049534e-06, -8.2982524e-06, -9.60197303e-06, -3.77049901e-06,
        9.37197838e-05, -6.3422226e-06, -8.87528495e-06, -0.000158514289, -2.68128406e-06, -2.86929617e-06,
        -4.21884124e-06, -5.0186336e-06, 0.00012663989, -4.93245943e-06, -2.7746355e-06, -0.000108667671,
        2.78256562e-06, 2.31022159e-06, 2.64189657e-06, 1.99987767e-06, 0.0001452164, 2.10640019e-06,
        2.57197803e-06, -0.00013540611}},
      {{0, 2, 4}, MoeScore::Softmax, 0.0171767622,
       {-0.000335729972, -5.83411202e-05, 0.000103263912, -0.00043108582, 0.00154832623, 1.03531211e-05,
        -0.000225046533, -0.000611739873, -0.000232941369, -0.000773392618, 3.24418324e-05, -4.25545586e-05,
        0.00147002994, 0.000102457569, -0.000190716251, -0.000365324755, 0.000209644058, 0.00018969379,
        -8.57228442e-05, 5.16975815e-05, -0.000172624568, -0.0003145425, 0.000199419577, -7.75652225e-05,
        0.000138214542, 0.000278329855, -0.000180316041, 0.000375706062, -0.000297290884, -9.89595283e-05,
        0.000206191849, -0.000421875884}},
  };
  for (const auto& c : losses) {
    Tensor cu = i32_tensor(c.cu, {int64_t(c.cu.size())}), counts = Tensor::empty({E}, DType::I32),
           dl = Tensor::zeros({T, E}, DType::F32);
    EXPECT_NEAR(ops::moe_aux_loss_fwd(lt, cu, c.score, 2, 0.01, counts), c.loss, 1e-6 * c.loss);
    ops::moe_aux_loss_bwd(lt, cu, c.score, 2, 0.01, 1.0, dl);
    EXPECT_TRUE(all_close(values(dl), c.grad, {1e-10, 1e-5}, "d aux / d logits"));
  }
  EXPECT_NEAR(ops::moe_z_loss_fwd(lt, 0.001), 0.00794804934, 1e-6 * 0.00794804934);
  Tensor dz = Tensor::zeros({T, E}, DType::F32);
  ops::moe_z_loss_bwd(lt, 0.001, 1.0, dz);
  EXPECT_TRUE(all_close(
      values(dz),
      {0.000112457157, 1.95421235e-05, 0.000503998017, 0.000144397854, 0.000456036243, 5.05302596e-05, 7.53822824e-05,
       0.000204910291, 6.50122092e-05, 0.000215848151, 0.00011845999, 1.18766611e-05, 0.000355873402, 0.000374119467,
       5.32275044e-05, 0.000101959442, 0.000409024709, 0.000370100839, 3.03797224e-05, 0.000100864236, 6.11772484e-05,
       0.00011147224, 0.000389076304, 2.74887134e-05, 0.000125328399, 0.000252380385, 6.22362422e-05, 0.000340677943,
       0.000102610211, 3.41559789e-05, 0.000186968013, 0.000145610815},
      {1e-10, 1e-5}, "d z / d logits"));
  // Token dropping of a softmax top-2 router, capacity factor 0.5: get_capacity(8, 8, 0.5) = 1;
  // tokens 0 and 1 both route to expert 4 and "probs" keeps token 0's (the larger weight).
  Tensor idx = Tensor::empty({T, 2}, DType::I32), w = Tensor::empty({T, 2}, DType::F32),
         sc = Tensor::empty({T, E}, DType::F32);
  ops::moe_router_fwd(lt, nullptr, router_cfg(E, 2, MoeScore::Softmax), idx, w, sc);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{2, 4, 5, 4, 0, 6, 3, 1}));
  EXPECT_EQ(ops::moe_expert_capacity(T, 2, E, 0.5), 1);
  EXPECT_EQ(ops::moe_drop_to_capacity(idx, w, E, 1, MoeDropPolicy::Probs), 1);
  EXPECT_EQ(ints(idx), (std::vector<int32_t>{2, 4, 5, -1, 0, 6, 3, 1}));
  // (Megatron's "position" policy takes torch.topk of the 0/1 routing map, whose
  // choice among tied ones is unspecified; on the CPU it kept token 1 here. Kestrel
  // keeps the earliest tokens, as the policy's documentation says.)
}

TEST(MoeRouter, ReplayReadsTheGivenChoice) {
  const int64_t T = 11;
  for (const auto& rc : router_cases()) {
    SCOPED_TRACE(rc.name);
    const int64_t E = rc.cfg.num_experts, k = rc.cfg.top_k;
    const auto logits = randn(T * E, 20, 2.0);
    const auto bias = round_to(randn(E, 21, 0.1), DType::F32);
    // A recorded choice: any experts, some slots dropped (never every slot of
    // a row: such a row has no record and is routed, tests/ops/moe_balance_test.cpp).
    std::vector<int32_t> given(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) given[size_t(i)] = i % 5 == 3 && i % k != 0 ? -1 : int32_t((i * 7 + 3) % E);
    Tensor idx = i32_tensor(given, {T, k}), w = nan_tensor({T, k}, DType::F32), sc = nan_tensor({T, E}, DType::F32);
    Tensor bt = make_tensor(bias, {E}, DType::F32);
    ops::moe_router_fwd(make_tensor(logits, {T, E}, DType::F32), rc.bias ? &bt : nullptr, rc.cfg, idx, w, sc, true);
    EXPECT_EQ(ints(idx), given);
    std::vector<int32_t> ref_idx = given;
    std::vector<double> ref_w(size_t(T * k)), ref_s(size_t(T * E));
    const auto lr = round_to(logits, DType::F32);
    ops::ref::moe_router_fwd<double>(lr.data(), nullptr, rc.cfg, T, ref_idx.data(), ref_w.data(), ref_s.data(), true);
    EXPECT_TRUE(close_for(DType::F32, values(w), ref_w, "topk_w"));
    const auto wv = values(w);
    for (int64_t i = 0; i < T * k; ++i) {
      if (given[size_t(i)] < 0) {
        EXPECT_EQ(wv[size_t(i)], 0.0);
      }
    }
  }
}

TEST(MoeRouter, BackwardMatchesReference) {
  const int64_t T = 29;
  for (DType dt : float_dtypes())
    for (const auto& rc : router_cases()) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + rc.name);
      const int64_t E = rc.cfg.num_experts, k = rc.cfg.top_k;
      const auto logits = round_to(randn(T * E, 30, 2.0), dt);
      Tensor idx = Tensor::empty({T, k}, DType::I32), w = Tensor::empty({T, k}, DType::F32),
             sc = Tensor::empty({T, E}, DType::F32);
      ops::moe_router_fwd(make_tensor(logits, {T, E}, dt), nullptr, rc.cfg, idx, w, sc);
      std::vector<int32_t> ix = ints(idx);
      for (int64_t t = 0; t < T; t += 4) ix[size_t(t * k)] = -1;  // dropped slots carry no gradient
      const auto dw = round_to(randn(T * k, 31), DType::F32), d0 = round_to(randn(T * E, 32), DType::F32);
      Tensor dl = make_tensor(d0, {T, E}, DType::F32);  // accumulated into
      ops::moe_router_bwd(sc, i32_tensor(ix, {T, k}), w, make_tensor(dw, {T, k}, DType::F32), rc.cfg, dl);
      std::vector<double> want = d0;
      ops::ref::moe_router_bwd<double>(values(sc).data(), ix.data(), dw.data(), rc.cfg, T, want.data());
      EXPECT_TRUE(close_for(DType::F32, values(dl), want, "dlogits (+=)"));
    }
}

TEST(MoeRouter, ReferenceBackwardMatchesFiniteDifferences) {
  const int64_t T = 3;
  for (const auto& rc : router_cases()) {
    SCOPED_TRACE(rc.name);
    const int64_t E = rc.cfg.num_experts, k = rc.cfg.top_k;
    const auto logits = randn(T * E, 40, 1.5), r = randn(T * k, 41);
    std::vector<int32_t> idx(size_t(T * k));
    std::vector<double> w(size_t(T * k)), s(size_t(T * E));
    ops::ref::moe_router_fwd<double>(logits.data(), nullptr, rc.cfg, T, idx.data(), w.data(), s.data());
    if (k > 1) idx[1] = -1;  // a dropped slot
    // L = <r, topk_w> with the selection fixed (replay), as autograd through topk sees it.
    auto L = [&](const std::vector<double>& l) {
      std::vector<int32_t> ix = idx;
      std::vector<double> ww(size_t(T * k)), ss(size_t(T * E));
      ops::ref::moe_router_fwd<double>(l.data(), nullptr, rc.cfg, T, ix.data(), ww.data(), ss.data(), true);
      return dot(r, ww);
    };
    std::vector<double> grad(size_t(T * E), 0.0);
    ops::ref::moe_router_bwd<double>(s.data(), idx.data(), r.data(), rc.cfg, T, grad.data());
    EXPECT_TRUE(matches_finite_difference(L, logits, grad, "dlogits"));
  }
}

// ---- load balancing ---------------------------------------------------------

struct AuxCase {
  MoeScore score;
  int64_t E, k;
  std::vector<int32_t> cu;
};
const AuxCase kAuxCases[] = {
    {MoeScore::Softmax, 13, 3, {0, 31}},                // Megatron's aux_loss: one group
    {MoeScore::Softmax, 16, 1, {0, 5, 5, 17, 31}},      // packed sequences, one empty
    {MoeScore::Sigmoid, 9, 2, {0, 12, 31}},             // DeepSeek-V3's normalised sigmoid
};

TEST(MoeAuxLoss, ForwardBackwardMatchReference) {
  for (DType dt : float_dtypes())
    for (const auto& c : kAuxCases) {
      const int64_t T = c.cu.back(), E = c.E, G = int64_t(c.cu.size()) - 1;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " E=" + std::to_string(E) + " G=" + std::to_string(G));
      const auto logits = round_to(randn(T * E, 50, 2.0), dt);
      const double coeff = 0.01, scale = 3.0;
      Tensor lt = make_tensor(logits, {T, E}, dt), cu = i32_tensor(c.cu, {G + 1}),
             counts = Tensor::empty({E}, DType::I32);
      const double loss = ops::moe_aux_loss_fwd(lt, cu, c.score, c.k, coeff, counts);
      std::vector<int32_t> ref_counts(static_cast<size_t>(E));
      const double want = ops::ref::moe_aux_loss_fwd<double>(logits.data(), c.cu.data(), G, E, c.score, c.k, coeff,
                                                             ref_counts.data());
      EXPECT_NEAR(loss, want, 1e-6 * std::abs(want));
      EXPECT_EQ(ints(counts), ref_counts);
      EXPECT_EQ(std::accumulate(ref_counts.begin(), ref_counts.end(), int64_t(0)), T * c.k);
      const auto d0 = round_to(randn(T * E, 51), DType::F32);
      Tensor dl = make_tensor(d0, {T, E}, DType::F32);
      ops::moe_aux_loss_bwd(lt, cu, c.score, c.k, coeff, scale, dl);
      std::vector<double> wantd = d0;
      ops::ref::moe_aux_loss_bwd<double>(logits.data(), c.cu.data(), G, E, c.score, c.k, coeff, scale, wantd.data());
      EXPECT_TRUE(close_for(DType::F32, values(dl), wantd, "dlogits (+=)"));
    }
}

TEST(MoeAuxLoss, EqualGroupsAreMegatronsSeqAuxLoss) {
  // Megatron's _apply_seq_aux_loss folds [S, B] into B*E experts:
  // switch_load_balancing_loss_func(probs [S, B*E], tokens_per_expert [B*E], S) / B.
  const int64_t S = 7, B = 3, E = 5, k = 2;
  const double coeff = 0.1;
  const auto logits = randn(S * B * E, 55);
  std::vector<int32_t> cu = {0, 7, 14, 21}, counts(static_cast<size_t>(E));
  const double ours = ops::ref::moe_aux_loss_fwd<double>(logits.data(), cu.data(), B, E, MoeScore::Softmax, k, coeff,
                                                         counts.data());
  double folded = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < E; ++e) {
      double P = 0;
      int64_t c = 0;
      for (int64_t s = 0; s < S; ++s) {
        const double* l = logits.data() + (b * S + s) * E;
        std::vector<double> p(l, l + E);
        const double mx = *std::max_element(p.begin(), p.end());
        double z = 0;
        for (double& v : p) z += v = std::exp(v - mx);
        for (double& v : p) v /= z;
        P += p[size_t(e)];
        std::vector<int64_t> order(static_cast<size_t>(E));
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int64_t a, int64_t bb) { return p[size_t(a)] > p[size_t(bb)]; });
        c += std::count(order.begin(), order.begin() + k, e);
      }
      folded += P * double(c);
    }
  folded *= double(E) * coeff / (double(k) * S * S) / double(B);
  EXPECT_NEAR(ours, folded, 1e-12);
}

TEST(MoeAuxLoss, ReferenceBackwardMatchesFiniteDifferences) {
  for (const auto& c : kAuxCases) {
    const int64_t T = c.cu.back(), E = c.E, G = int64_t(c.cu.size()) - 1;
    const auto logits = randn(T * E, 60, 1.5);
    std::vector<int32_t> counts(static_cast<size_t>(E));
    auto L = [&](const std::vector<double>& l) {
      return ops::ref::moe_aux_loss_fwd<double>(l.data(), c.cu.data(), G, E, c.score, c.k, 0.3, counts.data());
    };
    std::vector<double> grad(size_t(T * E), 0.0);
    ops::ref::moe_aux_loss_bwd<double>(logits.data(), c.cu.data(), G, E, c.score, c.k, 0.3, 1.0, grad.data());
    EXPECT_TRUE(matches_finite_difference(L, logits, grad, "d aux / d logits"));
  }
}

TEST(MoeZLoss, MatchesReferenceAndFiniteDifferences) {
  const int64_t T = 23, E = 11;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const auto logits = round_to(randn(T * E, 70, 3.0), dt);
    Tensor lt = make_tensor(logits, {T, E}, dt);
    const double want = ops::ref::moe_z_loss_fwd<double>(logits.data(), T, E, 1e-3);
    EXPECT_NEAR(ops::moe_z_loss_fwd(lt, 1e-3), want, 1e-6 * want);
    const auto d0 = round_to(randn(T * E, 71), DType::F32);
    Tensor dl = make_tensor(d0, {T, E}, DType::F32);
    ops::moe_z_loss_bwd(lt, 1e-3, 2.0, dl);
    std::vector<double> wantd = d0;
    ops::ref::moe_z_loss_bwd<double>(logits.data(), T, E, 1e-3, 2.0, wantd.data());
    EXPECT_TRUE(close_for(DType::F32, values(dl), wantd, "dlogits (+=)"));
  }
  const auto logits = randn(4 * 5, 72, 2.0);
  auto L = [&](const std::vector<double>& l) { return ops::ref::moe_z_loss_fwd<double>(l.data(), 4, 5, 0.5); };
  std::vector<double> grad(20, 0.0);
  ops::ref::moe_z_loss_bwd<double>(logits.data(), 4, 5, 0.5, 1.0, grad.data());
  EXPECT_TRUE(matches_finite_difference(L, logits, grad, "d z / d logits"));
  EXPECT_EQ(ops::moe_z_loss_fwd(Tensor::zeros({0, 5}, DType::F32), 1.0), 0.0);
}

// ---- capacity ---------------------------------------------------------------

TEST(MoeCapacity, ExpertCapacityIsMegatrons) {
  // get_capacity(num_tokens = T * k, E, factor) = ceil(T * k / E * factor).
  EXPECT_EQ(ops::moe_expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(ops::moe_expert_capacity(10, 2, 4, 1.25), 7);   // ceil(6.25)
  EXPECT_EQ(ops::moe_expert_capacity(7, 3, 5, 0.5), 3);     // ceil(2.1)
  EXPECT_EQ(ops::moe_expert_capacity(512, 4, 16, 1.0), 128);
  EXPECT_THROW_MSG(ops::moe_expert_capacity(8, 2, 4, 0.0), "capacity_factor must be a positive number");
}

TEST(MoeCapacity, DropPoliciesOnAHandCase) {
  // Five tokens, k = 1, all on expert 0, capacity 2.
  const std::vector<double> w = {0.1, 0.5, 0.3, 0.5, 0.2};
  for (MoeDropPolicy policy : {MoeDropPolicy::Probs, MoeDropPolicy::Position}) {
    Tensor idx = i32_tensor({0, 0, 0, 0, 0}, {5, 1}), wt = make_tensor(w, {5, 1}, DType::F32);
    EXPECT_EQ(ops::moe_drop_to_capacity(idx, wt, 3, 2, policy), 3);
    if (policy == MoeDropPolicy::Probs) {  // the largest weights, ties to the lower token
      EXPECT_EQ(ints(idx), (std::vector<int32_t>{-1, 0, -1, 0, -1}));
      EXPECT_EQ(values(wt), (std::vector<double>{0, 0.5, 0, 0.5, 0}));
    } else {  // the earliest tokens
      EXPECT_EQ(ints(idx), (std::vector<int32_t>{0, 0, -1, -1, -1}));
    }
  }
}

TEST(MoeCapacity, DropMatchesReference) {
  const int64_t T = 41;
  const RouterCase rc{"qwen k=3", router_cfg(6, 3, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true), false};
  for (MoeDropPolicy policy : {MoeDropPolicy::Probs, MoeDropPolicy::Position})
    for (double factor : {0.5, 1.0, 4.0}) {
      SCOPED_TRACE(std::string(policy == MoeDropPolicy::Probs ? "probs" : "position") + " factor " +
                   std::to_string(factor));
      const RouterRun r = run_router(rc, T, DType::F32, 80);
      std::vector<int32_t> ix = r.idx;
      ix[7] = -1;  // already dropped entries are left alone
      std::vector<double> w = r.w;
      w[7] = 0;
      const int64_t cap = ops::moe_expert_capacity(T, 3, 6, factor);
      Tensor idx = i32_tensor(ix, {T, 3}), wt = make_tensor(w, {T, 3}, DType::F32);
      const int64_t dropped = ops::moe_drop_to_capacity(idx, wt, 6, cap, policy);
      const int64_t want = ops::ref::moe_drop_to_capacity<double>(ix.data(), w.data(), T, 3, 6, cap, policy);
      EXPECT_EQ(dropped, want);
      EXPECT_EQ(ints(idx), ix);
      EXPECT_EQ(values(wt), w);
      if (factor == 0.5) {
        EXPECT_GT(dropped, 0);
      }
      if (factor == 4.0) {
        EXPECT_EQ(dropped, 0);
      }
      std::vector<int64_t> per(6, 0);
      for (int32_t e : ix)
        if (e >= 0) ++per[size_t(e)];
      EXPECT_LE(*std::max_element(per.begin(), per.end()), cap);
    }
}

}  // namespace
}  // namespace kestrel
