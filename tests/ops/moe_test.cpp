// ops/moe.h: the CPU kernels against the double reference (f32 and bf16), the
// reference backwards against central finite differences, HF's routers on
// hand cases, Megatron's capacity rules, permutation round trips, and
// results that do not depend on the thread count.
#include "ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>

#include "backend/cpu/gemm.h"
#include "core/parallel_for.h"
#include "gemm_providers.h"
#include "op_harness.h"
#include "ops/linear.h"
#include "ops/ref/moe_ref.h"

namespace kestrel {
namespace {

using namespace testing;
using ops::MoeDropPolicy;
using ops::MoeGroupLimit;
using ops::MoeRouterConfig;
using ops::MoeScore;

std::vector<int32_t> ints(const Tensor& t) { return t.to_host<int32_t>(); }
Tensor i32_tensor(const std::vector<int32_t>& v, Shape shape) { return Tensor::from_host(v, std::move(shape)); }

MoeRouterConfig router_cfg(int64_t E, int64_t k, MoeScore score, MoeGroupLimit limit = MoeGroupLimit::None,
                           int64_t n_group = 1, int64_t topk_group = 1, bool norm = false, double scaling = 1.0) {
  MoeRouterConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.score = score;
  c.group_limit = limit;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.norm_topk_prob = norm;
  c.scaling_factor = scaling;
  return c;
}

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

// ---- routing and permutation ------------------------------------------------

// A routing of T tokens with k slots over E experts: expert 2 gets no token,
// every 5th slot is dropped; distinct experts per token (k <= 3, E = 7 or 4).
std::vector<int32_t> sample_routing(int64_t T, int64_t k, int64_t E) {
  std::vector<int32_t> idx(size_t(T * k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = int32_t((t * 3 + j * 5 + t / 4) % (E - 1));
      e = e >= 2 ? e + 1 : e;
      idx[size_t(t * k + j)] = (t * k + j) % 5 == 4 ? -1 : e;
    }
  return idx;
}

TEST(MoeRouting, LayoutMatchesReferenceAndConservesTokens) {
  for (int64_t k : {1, 3})
    for (int64_t pad : {0, 20}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " pad_to=" + std::to_string(pad));
      const int64_t T = 19, E = 7;
      const auto idx = sample_routing(T, k, E);
      const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, k}), E, pad);
      std::vector<int64_t> sizes;
      std::vector<int32_t> dest, source;
      ops::ref::moe_routing(idx.data(), T, k, E, pad, sizes, dest, source);
      EXPECT_EQ(r.group_sizes, sizes);
      EXPECT_EQ(ints(r.dest), dest);
      EXPECT_EQ(ints(r.source), source);
      EXPECT_EQ(r.group_sizes[2], pad);  // the empty expert
      const int64_t dropped = std::count(idx.begin(), idx.end(), -1);
      EXPECT_EQ(r.rows(), pad ? E * pad : T * k - dropped);
    }
  EXPECT_THROW_MSG(ops::moe_routing(i32_tensor(sample_routing(19, 3, 7), {19, 3}), 7, 4), "more than pad_to = 4");
  EXPECT_THROW_MSG(ops::moe_routing(i32_tensor({0, 7}, {2, 1}), 7), "topk_idx[1, 0] = 7 is not an expert");
}

TEST(MoePermute, KernelsMatchReference) {
  const int64_t T = 19, E = 7, D = 21;
  for (DType dt : float_dtypes())
    for (int64_t k : {1, 3})
      for (int64_t pad : {0, 20}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " k=" + std::to_string(k) + " pad_to=" + std::to_string(pad));
        const auto idx = sample_routing(T, k, E);
        const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, k}), E, pad);
        const int64_t N = r.rows();
        const auto dest = ints(r.dest), source = ints(r.source);
        const auto x = round_to(randn(T * D, 90), dt), ys = round_to(randn(N * D, 91), dt),
                   dy = round_to(randn(T * D, 92), dt), dxs = round_to(randn(N * D, 93), dt);
        auto w = round_to(randn(T * k, 94), DType::F32);
        for (int64_t i = 0; i < T * k; ++i)
          if (idx[size_t(i)] < 0) w[size_t(i)] = 0;

        Tensor xs = nan_tensor({N, D}, dt);
        ops::moe_permute_fwd(make_tensor(x, {T, D}, dt), r, xs);
        std::vector<double> want(size_t(N * D));
        ops::ref::moe_permute_fwd<double>(x.data(), source.data(), N, D, want.data());
        EXPECT_EQ(values(xs), want);  // a copy: exact

        Tensor dx = nan_tensor({T, D}, DType::F32);
        ops::moe_permute_bwd(make_tensor(dxs, {N, D}, dt), r, dx);
        std::vector<double> want_dx(size_t(T * D));
        ops::ref::moe_permute_bwd<double>(dxs.data(), dest.data(), T, k, D, want_dx.data());
        EXPECT_TRUE(close_for(DType::F32, values(dx), want_dx, "dx"));

        Tensor wt = make_tensor(w, {T, k}, DType::F32), y = nan_tensor({T, D}, dt);
        ops::moe_unpermute_fwd(make_tensor(ys, {N, D}, dt), wt, r, y);
        std::vector<double> want_y(size_t(T * D));
        ops::ref::moe_unpermute_fwd<double>(ys.data(), w.data(), dest.data(), T, k, D, want_y.data());
        EXPECT_TRUE(close_for(dt, values(y), want_y, "y"));

        Tensor dys = nan_tensor({N, D}, DType::F32), dw = nan_tensor({T, k}, DType::F32);
        ops::moe_unpermute_bwd(make_tensor(ys, {N, D}, dt), wt, make_tensor(dy, {T, D}, dt), r, dys, dw);
        std::vector<double> want_dys(size_t(N * D)), want_dw(size_t(T * k));
        ops::ref::moe_unpermute_bwd<double>(ys.data(), w.data(), dy.data(), dest.data(), T, k, N, D, want_dys.data(),
                                            want_dw.data());
        EXPECT_TRUE(close_for(DType::F32, values(dys), want_dys, "dys"));
        EXPECT_TRUE(close_for(DType::F32, values(dw), want_dw, "dtopk_w"));
      }
}

TEST(MoePermute, UnpermuteOfPermuteIsIdentityForOneExpertPerToken) {
  const int64_t T = 23, E = 5, D = 13;
  for (DType dt : float_dtypes())
    for (int64_t pad : {0, 9}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " pad_to=" + std::to_string(pad));
      std::vector<int32_t> idx(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) idx[size_t(t)] = int32_t((t * 7) % 4);  // expert 4 empty
      const ops::MoeRouting r = ops::moe_routing(i32_tensor(idx, {T, 1}), E, pad);
      const auto x = round_to(randn(T * D, 100), dt);
      Tensor xs = Tensor::empty({r.rows(), D}, dt), y = nan_tensor({T, D}, dt);
      ops::moe_permute_fwd(make_tensor(x, {T, D}, dt), r, xs);
      ops::moe_unpermute_fwd(xs, make_tensor(std::vector<double>(size_t(T), 1.0), {T, 1}, DType::F32), r, y);
      EXPECT_EQ(values(y), x);
    }
}

TEST(MoePermute, ReferenceBackwardsMatchFiniteDifferences) {
  const int64_t T = 5, E = 4, k = 2, D = 3;
  const auto idx = sample_routing(T, k, E);
  for (int64_t pad : {0, 4}) {
    std::vector<int64_t> sizes;
    std::vector<int32_t> dest, source;
    ops::ref::moe_routing(idx.data(), T, k, E, pad, sizes, dest, source);
    const int64_t N = int64_t(source.size());
    const auto x = randn(T * D, 110), ys = randn(N * D, 111), w = randn(T * k, 112), r1 = randn(N * D, 113),
               r2 = randn(T * D, 114);
    auto Lp = [&](const std::vector<double>& xv) {
      std::vector<double> out(size_t(N * D));
      ops::ref::moe_permute_fwd<double>(xv.data(), source.data(), N, D, out.data());
      return dot(r1, out);
    };
    std::vector<double> dx(size_t(T * D));
    ops::ref::moe_permute_bwd<double>(r1.data(), dest.data(), T, k, D, dx.data());
    EXPECT_TRUE(matches_finite_difference(Lp, x, dx, "permute dx"));
    auto Lu = [&](const std::vector<double>& p) {
      std::vector<double> out(size_t(T * D));
      ops::ref::moe_unpermute_fwd<double>(p.data(), p.data() + N * D, dest.data(), T, k, D, out.data());
      return dot(r2, out);
    };
    std::vector<double> dys(size_t(N * D)), dw(size_t(T * k));
    ops::ref::moe_unpermute_bwd<double>(ys.data(), w.data(), r2.data(), dest.data(), T, k, N, D, dys.data(),
                                        dw.data());
    EXPECT_TRUE(matches_finite_difference(Lu, concat({ys, w}), concat({dys, dw}), "unpermute d(ys, w)"));
  }
}

// ---- grouped GEMM -----------------------------------------------------------

// Empty groups, groups for the skinny kernel (<= 32 rows) and for the BLAS.
const std::vector<int64_t> kGroupSizes = {0, 5, 40, 0, 1, 33, 17};

TEST(MoeGroupedLinear, ForwardBackwardMatchReference) {
  const int64_t in = 37, out = 29, E = int64_t(kGroupSizes.size());
  const int64_t N = std::accumulate(kGroupSizes.begin(), kGroupSizes.end(), int64_t(0));
  for_each_gemm_provider([&] {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(dtype_name(dt));
      const auto x = round_to(randn(N * in, 120), dt), dy = round_to(randn(N * out, 121), dt);
      std::vector<std::vector<double>> wv, dw0;
      std::vector<Tensor> wt, dwt;
      for (int64_t e = 0; e < E; ++e) {
        wv.push_back(round_to(randn(out * in, 130 + uint64_t(e), 0.3), dt));
        dw0.push_back(round_to(randn(out * in, 150 + uint64_t(e)), DType::F32));
        wt.push_back(make_tensor(wv.back(), {out, in}, dt));
        dwt.push_back(make_tensor(dw0.back(), {out, in}, DType::F32));
      }
      std::vector<const Tensor*> wp;
      std::vector<Tensor*> dwp;
      std::vector<const double*> wref;
      std::vector<double*> dwref;
      for (int64_t e = 0; e < E; ++e) {
        wp.push_back(&wt[size_t(e)]);
        dwp.push_back(e == 2 ? nullptr : &dwt[size_t(e)]);  // expert 2 frozen
        wref.push_back(wv[size_t(e)].data());
        dwref.push_back(e == 2 ? nullptr : dw0[size_t(e)].data());
      }
      Tensor xt = make_tensor(x, {N, in}, dt), y = nan_tensor({N, out}, dt);
      ops::grouped_linear_fwd(xt, kGroupSizes, wp, y);
      std::vector<double> want_y(size_t(N * out));
      ops::ref::grouped_linear_fwd<double>(x.data(), kGroupSizes, wref, in, out, want_y.data());
      EXPECT_TRUE(close_for(dt, values(y), want_y, "y"));

      Tensor dx = nan_tensor({N, in}, dt);
      ops::grouped_linear_bwd(xt, kGroupSizes, wp, make_tensor(dy, {N, out}, dt), &dx, dwp);
      std::vector<double> want_dx(size_t(N * in));
      ops::ref::grouped_linear_bwd<double>(x.data(), kGroupSizes, wref, dy.data(), in, out, want_dx.data(), dwref);
      EXPECT_TRUE(close_for(dt, values(dx), want_dx, "dx"));
      for (int64_t e = 0; e < E; ++e)
        EXPECT_TRUE(
            close_for(DType::F32, values(dwt[size_t(e)]), dw0[size_t(e)], "dw[" + std::to_string(e) + "] (+=)"));
    }
  });
}

TEST(MoeGroupedLinear, ReferenceBackwardMatchesFiniteDifferences) {
  const std::vector<int64_t> sizes = {2, 0, 3};
  const int64_t in = 3, out = 2, N = 5;
  const auto x = randn(N * in, 160), w = randn(3 * out * in, 161), r = randn(N * out, 162);
  auto ptrs = [&](const std::vector<double>& p) {
    return std::vector<const double*>{p.data() + N * in, p.data() + N * in + out * in,
                                      p.data() + N * in + 2 * out * in};
  };
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> y(size_t(N * out));
    ops::ref::grouped_linear_fwd<double>(p.data(), sizes, ptrs(p), in, out, y.data());
    return dot(r, y);
  };
  const auto p0 = concat({x, w});
  std::vector<double> dx(size_t(N * in)), dw(size_t(3 * out * in), 0.0);
  ops::ref::grouped_linear_bwd<double>(x.data(), sizes, ptrs(p0), r.data(), in, out, dx.data(),
                                       {dw.data(), dw.data() + out * in, dw.data() + 2 * out * in});
  EXPECT_TRUE(matches_finite_difference(L, p0, concat({dx, dw}), "d(x, w)"));
}

// ---- shared-expert gate -----------------------------------------------------

TEST(MoeSigmoidGate, MatchesReferenceAndHfRounding) {
  const int64_t T = 9, D = 19;
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    const auto g = round_to(randn(T, 170, 2.0), dt), s = round_to(randn(T * D, 171), dt),
               y0 = round_to(randn(T * D, 172), dt), dy = round_to(randn(T * D, 173), dt);
    Tensor y = make_tensor(y0, {T, D}, dt);
    ops::sigmoid_gate_add_fwd(make_tensor(g, {T, 1}, dt), make_tensor(s, {T, D}, dt), y);
    std::vector<double> want = y0;
    ops::ref::sigmoid_gate_add_fwd<double>(g.data(), s.data(), T, D, want.data());
    EXPECT_TRUE(close_for(dt, values(y), want, "y (+=)"));
    if (dt == DType::BF16) {  // HF: bf16(bf16(sigmoid(g)) * s), then bf16(y + that)
      std::vector<double> hf(size_t(T * D));
      for (int64_t t = 0; t < T; ++t) {
        const double sg = round_to(1.0 / (1.0 + std::exp(-double(float(g[size_t(t)])))), dt);
        for (int64_t d = 0; d < D; ++d)
          hf[size_t(t * D + d)] = round_to(y0[size_t(t * D + d)] + round_to(sg * s[size_t(t * D + d)], dt), dt);
      }
      EXPECT_EQ(values(y), hf);
    }
    Tensor ds = nan_tensor({T, D}, DType::F32), dg = nan_tensor({T, 1}, DType::F32);
    ops::sigmoid_gate_add_bwd(make_tensor(g, {T, 1}, dt), make_tensor(s, {T, D}, dt), make_tensor(dy, {T, D}, dt), ds,
                              dg);
    std::vector<double> want_ds(size_t(T * D)), want_dg(static_cast<size_t>(T));
    ops::ref::sigmoid_gate_add_bwd<double>(g.data(), s.data(), dy.data(), T, D, want_ds.data(), want_dg.data());
    EXPECT_TRUE(close_for(DType::F32, values(ds), want_ds, "ds"));
    EXPECT_TRUE(close_for(DType::F32, values(dg), want_dg, "dg"));
  }
  const int64_t n = 3, d = 4;
  const auto g = randn(n, 180), s = randn(n * d, 181), r = randn(n * d, 182);
  auto L = [&](const std::vector<double>& p) {
    std::vector<double> y(size_t(n * d), 0.0);
    ops::ref::sigmoid_gate_add_fwd<double>(p.data(), p.data() + n, n, d, y.data());
    return dot(r, y);
  };
  std::vector<double> ds(size_t(n * d)), dg(static_cast<size_t>(n));
  ops::ref::sigmoid_gate_add_bwd<double>(g.data(), s.data(), r.data(), n, d, ds.data(), dg.data());
  EXPECT_TRUE(matches_finite_difference(L, concat({g, s}), concat({dg, ds}), "d(g, s)"));
}

// ---- composition, threads, errors -------------------------------------------

TEST(MoePipeline, RoutedExpertsEqualTheDenseMixture) {
  // router -> drop -> routing -> permute -> grouped GEMM -> unpermute against
  // y[t] = sum over kept slots of w * (x[t] @ W[e]^T), computed per token.
  const int64_t T = 45, D = 17, F = 11, E = 6, k = 2;
  const auto x = round_to(randn(T * D, 190), DType::F32), logits = randn(T * E, 191);
  const MoeRouterConfig cfg = router_cfg(E, k, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true);
  Tensor idx = Tensor::empty({T, k}, DType::I32), w = Tensor::empty({T, k}, DType::F32),
         sc = Tensor::empty({T, E}, DType::F32);
  ops::moe_router_fwd(make_tensor(logits, {T, E}, DType::F32), nullptr, cfg, idx, w, sc);
  const int64_t dropped =
      ops::moe_drop_to_capacity(idx, w, E, ops::moe_expert_capacity(T, k, E, 1.0), MoeDropPolicy::Probs);
  const ops::MoeRouting r = ops::moe_routing(idx, E);
  EXPECT_EQ(r.rows(), T * k - dropped);
  std::vector<std::vector<double>> wv;
  std::vector<Tensor> wt;
  std::vector<const Tensor*> wp;
  for (int64_t e = 0; e < E; ++e) {
    wv.push_back(round_to(randn(F * D, 200 + uint64_t(e)), DType::F32));
    wt.push_back(make_tensor(wv.back(), {F, D}, DType::F32));
  }
  for (auto& t : wt) wp.push_back(&t);
  Tensor xs = Tensor::empty({r.rows(), D}, DType::F32), ys = Tensor::empty({r.rows(), F}, DType::F32),
         y = nan_tensor({T, F}, DType::F32);
  ops::moe_permute_fwd(make_tensor(x, {T, D}, DType::F32), r, xs);
  ops::grouped_linear_fwd(xs, r.group_sizes, wp, ys);
  ops::moe_unpermute_fwd(ys, w, r, y);
  const auto ix = ints(idx);
  const auto wvals = values(w);
  std::vector<double> want(size_t(T * F), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ix[size_t(t * k + j)];
      if (e < 0) continue;
      for (int64_t f = 0; f < F; ++f) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += x[size_t(t * D + d)] * wv[size_t(e)][size_t(f * D + d)];
        want[size_t(t * F + f)] += wvals[size_t(t * k + j)] * acc;
      }
    }
  EXPECT_TRUE(close_for(DType::F32, values(y), want, "y"));
}

TEST(MoeThreads, SameResultsAtAnyThreadCount) {
  const int64_t T = 3000, E = 16, k = 4, D = 40;  // past the parallel thresholds
  const MoeRouterConfig cfg = router_cfg(E, k, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 2, true, 2.5);
  const auto logits = randn(T * E, 210, 2.0), x = randn(T * D, 211), dy = randn(T * D, 212);
  std::vector<int32_t> cu = {0, 1000, 1700, 3000};
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<std::vector<double>> out;
    Tensor lt = make_tensor(logits, {T, E}, DType::BF16), idx = Tensor::empty({T, k}, DType::I32),
           w = Tensor::empty({T, k}, DType::F32), sc = Tensor::empty({T, E}, DType::F32),
           dl = Tensor::zeros({T, E}, DType::F32), counts = Tensor::empty({E}, DType::I32);
    ops::moe_router_fwd(lt, nullptr, cfg, idx, w, sc);
    ops::moe_router_bwd(sc, idx, w, w, cfg, dl);
    Tensor cut = i32_tensor(cu, {4});
    out.push_back({ops::moe_aux_loss_fwd(lt, cut, MoeScore::Sigmoid, k, 0.01, counts),
                   ops::moe_z_loss_fwd(lt, 0.001)});
    ops::moe_aux_loss_bwd(lt, cut, MoeScore::Sigmoid, k, 0.01, 1.0, dl);
    ops::moe_z_loss_bwd(lt, 0.001, 1.0, dl);
    ops::moe_drop_to_capacity(idx, w, E, ops::moe_expert_capacity(T, k, E, 0.8), MoeDropPolicy::Probs);
    const ops::MoeRouting r = ops::moe_routing(idx, E);
    Tensor xs = Tensor::empty({r.rows(), D}, DType::BF16), y = Tensor::empty({T, D}, DType::F32),
           dx = Tensor::empty({T, D}, DType::F32), dys = Tensor::empty({r.rows(), D}, DType::F32),
           dw = Tensor::empty({T, k}, DType::F32);
    ops::moe_permute_fwd(make_tensor(x, {T, D}, DType::BF16), r, xs);
    ops::moe_unpermute_fwd(xs, w, r, y);
    ops::moe_unpermute_bwd(xs, w, make_tensor(dy, {T, D}, DType::F32), r, dys, dw);
    ops::moe_permute_bwd(dys, r, dx);
    for (const Tensor* t : {&w, &sc, &dl, &y, &dx, &dys, &dw}) out.push_back(values(*t));
    const auto ix = ints(idx);
    out.emplace_back(ix.begin(), ix.end());
    // Groups small enough for the skinny kernel: one thread per group, or the
    // team inside each group's call; the same bits either way.
    const std::vector<int64_t> sizes = {3, 1, 0, 5, 2, 4, 1, 1, 2, 3};
    const int64_t rows = 22, in = 300, out_f = 200;
    std::vector<Tensor> ws;
    std::vector<const Tensor*> wp;
    for (size_t e = 0; e < sizes.size(); ++e)
      ws.push_back(make_tensor(randn(out_f * in, 220 + e), {out_f, in}, DType::BF16));
    for (const Tensor& t : ws) wp.push_back(&t);
    Tensor gy = Tensor::empty({rows, out_f}, DType::F32);
    ops::grouped_linear_fwd(make_tensor(randn(rows * in, 219), {rows, in}, DType::F32), sizes, wp, gy);
    out.push_back(values(gy));
    return out;
  };
  const int saved = num_threads();
  const auto one = run(1), two = run(2);
  set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(MoeOps, EmptyBatchesAndFullyDroppedRows) {
  // No tokens (an empty micro-batch shard): every op runs and writes nothing.
  const MoeRouterConfig cfg = router_cfg(4, 2, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true);
  Tensor idx = Tensor::empty({0, 2}, DType::I32), w = Tensor::empty({0, 2}, DType::F32),
         sc = Tensor::empty({0, 4}, DType::F32), dl = Tensor::empty({0, 4}, DType::F32);
  ops::moe_router_fwd(Tensor::empty({0, 4}, DType::BF16), nullptr, cfg, idx, w, sc);
  ops::moe_router_bwd(sc, idx, w, w, cfg, dl);
  const ops::MoeRouting r = ops::moe_routing(idx, 4);
  EXPECT_EQ(r.rows(), 0);
  Tensor x = Tensor::empty({0, 6}, DType::BF16), xs = Tensor::empty({0, 6}, DType::BF16),
         ys = Tensor::empty({0, 5}, DType::BF16), y = Tensor::empty({0, 5}, DType::BF16);
  ops::moe_permute_fwd(x, r, xs);
  Tensor w0 = Tensor::zeros({5, 6}, DType::BF16);
  ops::grouped_linear_fwd(xs, r.group_sizes, {&w0, &w0, &w0, &w0}, ys);
  ops::moe_unpermute_fwd(ys, w, r, y);
  EXPECT_EQ(ops::moe_drop_to_capacity(idx, w, 4, 0, MoeDropPolicy::Probs), 0);
  // A row whose slots are all dropped (by capacity, after routing): weights 0 (not 0/0), no gradient.
  Tensor given = i32_tensor({-1, -1, 1, 3}, {2, 2}), w2 = nan_tensor({2, 2}, DType::F32),
         sc2 = Tensor::empty({2, 4}, DType::F32), dl2 = Tensor::zeros({2, 4}, DType::F32);
  ops::moe_router_fwd(make_tensor(randn(8, 230), {2, 4}, DType::F32), nullptr, cfg, given, w2, sc2, true);
  Tensor dropped = i32_tensor({-1, -1, 1, 3}, {2, 2});
  ops::moe_drop_to_capacity(dropped, w2, 4, 4, MoeDropPolicy::Probs);  // capacity 4: keeps what is there
  w2 = nan_tensor({2, 2}, DType::F32);
  ops::moe_router_fwd(make_tensor(randn(8, 230), {2, 4}, DType::F32), nullptr, cfg, given, w2, sc2, true);
  EXPECT_NE(ints(given)[0], -1) << "a replayed row of -1s only has no record: it is routed";
  ops::moe_router_bwd(sc2, dropped, w2, make_tensor({1, 1, 1, 1}, {2, 2}, DType::F32), cfg, dl2);
  for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(values(dl2)[size_t(e)], 0.0);
}

TEST(MoeOps, BadArgumentsFailWithAMessage) {
  Tensor logits = Tensor::zeros({4, 8}, DType::F32), idx = Tensor::zeros({4, 2}, DType::I32),
         w = Tensor::zeros({4, 2}, DType::F32), sc = Tensor::zeros({4, 8}, DType::F32);
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(6, 2, MoeScore::Softmax), idx, w, sc),
                   "logits have 8 expert columns, the config num_experts = 6");
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(8, 2, MoeScore::Softmax, MoeGroupLimit::Max, 3, 1),
                                       idx, w, sc),
                   "n_group = 3 must divide num_experts = 8");
  Tensor idx3 = Tensor::zeros({4, 3}, DType::I32), w3 = Tensor::zeros({4, 3}, DType::F32);
  EXPECT_THROW_MSG(
      ops::moe_router_fwd(logits, nullptr, router_cfg(8, 3, MoeScore::Sigmoid, MoeGroupLimit::SumTop2, 4, 1), idx3,
                          w3, sc),
      "top_k = 3 exceeds the 2 experts");
  Tensor bad = i32_tensor({0, 1, 2, 9, 0, 1, 2, 3}, {4, 2});
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, router_cfg(8, 2, MoeScore::Softmax), bad, w, sc, true),
                   "topk_idx[1, 1] = 9 is not an expert in [0, 8)");
  Tensor counts = Tensor::zeros({8}, DType::I32);
  EXPECT_THROW_MSG(ops::moe_aux_loss_fwd(logits, i32_tensor({0, 3}, {2}), MoeScore::Softmax, 2, 0.1, counts),
                   "cu_groups must run from 0 to the 4 rows");
  const ops::MoeRouting r = ops::moe_routing(i32_tensor({0, 1, 1, 2, 2, 3, 3, 4}, {4, 2}), 8);
  Tensor xs = Tensor::zeros({8, 5}, DType::BF16);
  EXPECT_THROW_MSG(ops::moe_permute_fwd(Tensor::zeros({4, 5}, DType::F32), r, xs), "xs must have the dtype of x");
  Tensor x8 = Tensor::zeros({8, 5}, DType::F32), y8 = Tensor::zeros({8, 3}, DType::F32),
         w35 = Tensor::zeros({3, 5}, DType::F32), w34 = Tensor::zeros({3, 4}, DType::F32);
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {3, 4}, {&w35, &w35}, y8), "group_sizes sum to 7 rows");
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {4, 4}, {&w35, &w34}, y8), "w[1] must have shape [3, 5]");
  EXPECT_THROW_MSG(ops::grouped_linear_fwd(x8, {4, 4}, {&w35}, y8), "one weight per group (2)");
}

}  // namespace
}  // namespace kestrel
