// The mixture-of-experts ops (ops/moe.h) on the device against the CPU from
// the same inputs (the harness of backend_consistency.h): the router forward
// (softmax and sigmoid, correction bias, both group limits, replay) and
// backward, the aux and z-losses, capacity dropping, the expert-bias update,
// the permutation and unpermutation, the grouped GEMM and the shared-expert
// gate. Choices and integer outputs must match bit for bit (top-k ties go to
// the lower index on both backends), floats within the output's tolerance.
// Skipped without a device unless KESTREL_TEST_CONSISTENCY_ON_CPU=1.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "backend_consistency.h"
#include "common/testing.h"
#include "moe_testing.h"
#include "op_harness.h"
#include "ops/moe.h"

namespace kestrel {
namespace {

using moe_testing::router_cfg;
using ops::MoeDropPolicy;
using ops::MoeGroupLimit;
using ops::MoeScore;
using testing::make_tensor;
using testing::randn;

class BackendConsistencyMoe : public testing::BackendConsistency {
 protected:
  Tensor dev_zeros(Shape shape, DType dtype) const {
    return Tensor::zeros(std::move(shape), dtype, MemCategory::Other, dev_);
  }
};

struct RouterCase {
  const char* name;
  ops::MoeRouterConfig cfg;
  bool bias;
};
// Every router the models use (tests/ops/moe_test.cpp's cases).
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

TEST_P(BackendConsistencyMoe, RouterForwardReplayAndBackward) {
  const int64_t T = 157;  // more rows than one block of the one-thread-per-token kernels
  uint64_t seed = 1000;
  for (const auto& rc : router_cases()) {
    SCOPED_TRACE(rc.name);
    const int64_t E = rc.cfg.num_experts, k = rc.cfg.top_k;
    Tensor logits = host({T, E}, dt(), ++seed, 2.0), bias = host({E}, DType::F32, ++seed, 0.1);
    Tensor logitsd = on_dev(logits), biasd = on_dev(bias);
    const Tensor* bp = rc.bias ? &bias : nullptr;
    const Tensor* bpd = rc.bias ? &biasd : nullptr;
    Tensor idx = Tensor::zeros({T, k}, DType::I32), w = Tensor::zeros({T, k}, DType::F32),
           sc = Tensor::zeros({T, E}, DType::F32);
    Tensor idxd = dev_zeros({T, k}, DType::I32), wd = dev_zeros({T, k}, DType::F32),
           scd = dev_zeros({T, E}, DType::F32);
    ops::moe_router_fwd(logits, bp, rc.cfg, idx, w, sc);
    ops::moe_router_fwd(logitsd, bpd, rc.cfg, idxd, wd, scd);
    expect_bits(idxd, idx, "topk_idx");
    // The weights hold values of the logits' dtype: compared at its tolerance.
    EXPECT_TRUE(agree(wd.to(dt()), w.to(dt()), "topk_w"));
    EXPECT_TRUE(agree(scd, sc, "scores"));

    // Replay: some slots dropped (-1), row 2 without a record (all -1: routed).
    std::vector<int32_t> given(size_t(T * k));
    for (int64_t i = 0; i < T * k; ++i) given[size_t(i)] = i % 5 == 3 && i % k != 0 ? -1 : int32_t((i * 7 + 3) % E);
    for (int64_t j = 0; j < k; ++j) given[size_t(2 * k + j)] = -1;
    Tensor ridx = Tensor::from_host(given, {T, k}), ridxd = on_dev(ridx);
    Tensor rw = Tensor::zeros({T, k}, DType::F32), rwd = dev_zeros({T, k}, DType::F32);
    ops::moe_router_fwd(logits, bp, rc.cfg, ridx, rw, sc, /*replay=*/true);
    ops::moe_router_fwd(logitsd, bpd, rc.cfg, ridxd, rwd, scd, /*replay=*/true);
    expect_bits(ridxd, ridx, "replayed topk_idx");
    EXPECT_TRUE(agree(rwd.to(dt()), rw.to(dt()), "replayed topk_w"));

    // Backward from the CPU's forward (both sides from the same scores and choice), some slots dropped.
    std::vector<int32_t> ix = idx.to_host<int32_t>();
    for (int64_t t = 0; t < T; t += 4) ix[size_t(t * k)] = -1;  // dropped slots carry no gradient
    Tensor bidx = Tensor::from_host(ix, {T, k});
    Tensor dtw = host({T, k}, DType::F32, ++seed), dl = host({T, E}, DType::F32, ++seed), dld = on_dev(dl);
    ops::moe_router_bwd(sc, bidx, w, dtw, rc.cfg, dl);
    ops::moe_router_bwd(on_dev(sc), on_dev(bidx), on_dev(w), on_dev(dtw), rc.cfg, dld);
    EXPECT_TRUE(agree(dld, dl, "router_bwd dlogits (+=)", 2));
  }
}

TEST_P(BackendConsistencyMoe, AuxAndZLosses) {
  struct AuxCase {
    MoeScore score;
    int64_t E, k;
    std::vector<int32_t> cu;
  };
  const AuxCase cases[] = {
      {MoeScore::Softmax, 13, 3, {0, 31}},               // Megatron's aux_loss: one group
      {MoeScore::Softmax, 16, 1, {0, 5, 5, 17, 31}},     // packed sequences, one empty
      {MoeScore::Sigmoid, 9, 2, {0, 12, 31}},            // DeepSeek-V3's normalised sigmoid
      {MoeScore::Softmax, 16, 2, {0, 100, 100, 250}},    // rows past one block
  };
  const double coeff = 0.5, scale = 3.0;  // gradients well above the tolerance's atol
  uint64_t seed = 2000;
  for (const auto& c : cases) {
    const int64_t T = c.cu.back(), E = c.E, G = int64_t(c.cu.size()) - 1;
    SCOPED_TRACE(std::string(c.score == MoeScore::Sigmoid ? "sigmoid" : "softmax") + " E=" + std::to_string(E) +
                 " G=" + std::to_string(G));
    Tensor logits = host({T, E}, dt(), ++seed, 2.0), logitsd = on_dev(logits);
    Tensor cu = Tensor::from_host(c.cu, {G + 1}), cud = on_dev(cu);
    Tensor counts = Tensor::zeros({E}, DType::I32), countsd = dev_zeros({E}, DType::I32);
    const double loss = ops::moe_aux_loss_fwd(logits, cu, c.score, c.k, coeff, counts);
    const double lossd = ops::moe_aux_loss_fwd(logitsd, cud, c.score, c.k, coeff, countsd);
    EXPECT_NEAR(lossd, loss, 1e-5 * std::abs(loss));
    expect_bits(countsd, counts, "aux counts");
    Tensor dl = host({T, E}, DType::F32, ++seed, 0.1), dld = on_dev(dl);
    ops::moe_aux_loss_bwd(logits, cu, c.score, c.k, coeff, scale, dl);
    ops::moe_aux_loss_bwd(logitsd, cud, c.score, c.k, coeff, scale, dld);
    EXPECT_TRUE(agree(dld, dl, "aux dlogits (+=)", 2));
  }
  const int64_t T = 23, E = 11;
  Tensor logits = host({T, E}, dt(), ++seed, 3.0), logitsd = on_dev(logits);
  const double z = ops::moe_z_loss_fwd(logits, 0.1), zd = ops::moe_z_loss_fwd(logitsd, 0.1);
  EXPECT_NEAR(zd, z, 1e-5 * std::abs(z));
  Tensor dl = host({T, E}, DType::F32, ++seed, 0.1), dld = on_dev(dl);
  ops::moe_z_loss_bwd(logits, 0.1, 2.0, dl);
  ops::moe_z_loss_bwd(logitsd, 0.1, 2.0, dld);
  EXPECT_TRUE(agree(dld, dl, "z dlogits (+=)", 2));
  EXPECT_EQ(ops::moe_z_loss_fwd(dev_zeros({0, 5}, DType::F32), 1.0), 0.0);
}

TEST_P(BackendConsistencyMoe, DropToCapacityAndExpertBias) {
  // A router's choice from logits of the parameter's dtype (bf16 logits give
  // bf16-valued weights: ties between tokens, which "probs" breaks by token).
  const int64_t T = 41, E = 6, k = 3;
  Tensor logits = host({T, E}, dt(), 3001, 2.0);
  Tensor idx0 = Tensor::zeros({T, k}, DType::I32), w0 = Tensor::zeros({T, k}, DType::F32),
         sc = Tensor::zeros({T, E}, DType::F32);
  ops::moe_router_fwd(logits, nullptr, router_cfg(E, k, MoeScore::Softmax, MoeGroupLimit::None, 1, 1, true), idx0, w0,
                      sc);
  idx0.set(7, -1.f);  // already dropped entries are left alone
  w0.set(7, 0.f);
  for (MoeDropPolicy policy : {MoeDropPolicy::Probs, MoeDropPolicy::Position})
    for (double factor : {0.5, 1.0, 4.0}) {
      SCOPED_TRACE(std::string(policy == MoeDropPolicy::Probs ? "probs" : "position") + " factor " +
                   std::to_string(factor));
      const int64_t cap = ops::moe_expert_capacity(T, k, E, factor);
      Tensor idx = idx0.clone(), w = w0.clone(), idxd = on_dev(idx0), wd = on_dev(w0);
      const int64_t dropped = ops::moe_drop_to_capacity(idx, w, E, cap, policy);
      EXPECT_EQ(ops::moe_drop_to_capacity(idxd, wd, E, cap, policy), dropped);
      expect_bits(idxd, idx, "topk_idx after dropping");
      expect_bits(wd, w, "topk_w after dropping");
      if (factor == 0.5) {
        EXPECT_GT(dropped, 0);
      }
    }
  // Ties: five tokens on expert 0 (tests/ops/moe_test.cpp's hand case); capacity 1 cuts between the two 0.5s.
  for (MoeDropPolicy policy : {MoeDropPolicy::Probs, MoeDropPolicy::Position})
    for (int64_t cap : {1, 2}) {
      Tensor idx = Tensor::from_host(std::vector<int32_t>{0, 0, 0, 0, 0}, {5, 1});
      Tensor w = make_tensor({0.1, 0.5, 0.3, 0.5, 0.2}, {5, 1}, DType::F32);
      Tensor idxd = on_dev(idx), wd = on_dev(w);
      EXPECT_EQ(ops::moe_drop_to_capacity(idxd, wd, 3, cap, policy), ops::moe_drop_to_capacity(idx, w, 3, cap, policy));
      expect_bits(idxd, idx, "tied topk_idx after dropping to " + std::to_string(cap));
      expect_bits(wd, w, "tied topk_w after dropping to " + std::to_string(cap));
    }
  // The aux-loss-free bias update: an f32 add of the same steps, bit for bit.
  const int64_t nE = 13;
  std::vector<int64_t> load(static_cast<size_t>(nE));
  for (int64_t e = 0; e < nE; ++e) load[size_t(e)] = (e * 7919) % 23;
  load[3] = load[4];  // some experts at the same load
  Tensor bias = host({nE}, DType::F32, 3002, 0.1), biasd = on_dev(bias);
  ops::moe_update_expert_bias(bias, load, 2.5e-3);
  ops::moe_update_expert_bias(biasd, load, 2.5e-3);
  expect_bits(biasd, bias, "expert bias");
}

// A routing of T tokens with k slots over E experts: expert 2 gets no token,
// every 5th slot is dropped (tests/ops/moe_experts_test.cpp's sample).
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

TEST_P(BackendConsistencyMoe, PermuteAndUnpermute) {
  const int64_t T = 19, E = 7;
  uint64_t seed = 4000;
  for (int64_t D : {21, 300})  // within one block and past it (the dot products' block loop)
    for (int64_t k : {1, 3})
      for (int64_t pad : {0, 20}) {
        SCOPED_TRACE("D=" + std::to_string(D) + " k=" + std::to_string(k) + " pad_to=" + std::to_string(pad));
        const std::vector<int32_t> ix = sample_routing(T, k, E);
        Tensor idx = Tensor::from_host(ix, {T, k});
        const ops::MoeRouting r = ops::moe_routing(idx, E, pad), rd = ops::moe_routing(on_dev(idx), E, pad);
        EXPECT_EQ(rd.group_sizes, r.group_sizes);
        expect_bits(rd.dest, r.dest, "routing dest");
        expect_bits(rd.source, r.source, "routing source");
        const int64_t N = r.rows();

        Tensor x = host({T, D}, dt(), ++seed), xs = Tensor::zeros({N, D}, dt()), xsd = dev_zeros({N, D}, dt());
        ops::moe_permute_fwd(x, r, xs);
        ops::moe_permute_fwd(on_dev(x), rd, xsd);
        expect_bits(xsd, xs, "permute_fwd");

        Tensor dxs = host({N, D}, dt(), ++seed), dx = Tensor::zeros({T, D}, DType::F32),
               dxd = dev_zeros({T, D}, DType::F32);
        ops::moe_permute_bwd(dxs, r, dx);
        ops::moe_permute_bwd(on_dev(dxs), rd, dxd);
        EXPECT_TRUE(agree(dxd, dx, "permute_bwd"));

        std::vector<double> wv = randn(T * k, ++seed);
        for (int64_t i = 0; i < T * k; ++i)
          if (ix[size_t(i)] < 0) wv[size_t(i)] = 0;
        Tensor wt = make_tensor(wv, {T, k}, DType::F32), wtd = on_dev(wt);
        Tensor ys = host({N, D}, dt(), ++seed), ysd = on_dev(ys);
        for (DType out_dt : {dt(), DType::F32}) {  // the output's dtype may differ from ys'
          Tensor y = Tensor::zeros({T, D}, out_dt), yd = dev_zeros({T, D}, out_dt);
          ops::moe_unpermute_fwd(ys, wt, r, y);
          ops::moe_unpermute_fwd(ysd, wtd, rd, yd);
          EXPECT_TRUE(agree(yd, y, std::string("unpermute_fwd to ") + dtype_name(out_dt)));
        }

        Tensor dy = host({T, D}, dt(), ++seed);
        Tensor dys = Tensor::zeros({N, D}, DType::F32), dysd = dev_zeros({N, D}, DType::F32);
        Tensor dtw = Tensor::zeros({T, k}, DType::F32), dtwd = dev_zeros({T, k}, DType::F32);
        ops::moe_unpermute_bwd(ys, wt, dy, r, dys, dtw);
        ops::moe_unpermute_bwd(ysd, wtd, on_dev(dy), rd, dysd, dtwd);
        EXPECT_TRUE(agree(dysd, dys, "unpermute_bwd dys"));
        EXPECT_TRUE(agree(dtwd, dtw, "unpermute_bwd dtopk_w", 2));
      }
}

TEST_P(BackendConsistencyMoe, GroupedLinearForwardAndBackward) {
  // Empty groups, single rows and groups of tens of rows.
  const std::vector<int64_t> sizes = {0, 5, 40, 0, 1, 33, 17};
  const int64_t in = 37, out = 29, E = int64_t(sizes.size());
  const int64_t N = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  Tensor x = host({N, in}, dt(), 5001), dy = host({N, out}, dt(), 5002), xd = on_dev(x), dyd = on_dev(dy);
  std::vector<Tensor> w, wd, dw, dwd;
  for (int64_t e = 0; e < E; ++e) {
    w.push_back(host({out, in}, dt(), 5100 + uint64_t(e), 0.3));
    wd.push_back(on_dev(w.back()));
    dw.push_back(host({out, in}, DType::F32, 5200 + uint64_t(e)));
    dwd.push_back(on_dev(dw.back()));
  }
  std::vector<const Tensor*> wp, wpd;
  std::vector<Tensor*> dwp, dwpd;
  for (int64_t e = 0; e < E; ++e) {
    wp.push_back(&w[size_t(e)]);
    wpd.push_back(&wd[size_t(e)]);
    dwp.push_back(e == 2 ? nullptr : &dw[size_t(e)]);  // expert 2 frozen
    dwpd.push_back(e == 2 ? nullptr : &dwd[size_t(e)]);
  }
  Tensor y = Tensor::zeros({N, out}, dt()), yd = dev_zeros({N, out}, dt());
  ops::grouped_linear_fwd(x, sizes, wp, y);
  ops::grouped_linear_fwd(xd, sizes, wpd, yd);
  EXPECT_TRUE(agree(yd, y, "grouped_linear_fwd"));
  Tensor dx = Tensor::zeros({N, in}, dt()), dxd = dev_zeros({N, in}, dt());
  ops::grouped_linear_bwd(x, sizes, wp, dy, &dx, dwp);
  ops::grouped_linear_bwd(xd, sizes, wpd, dyd, &dxd, dwpd);
  EXPECT_TRUE(agree(dxd, dx, "grouped_linear_bwd dx", 2));
  for (int64_t e = 0; e < E; ++e)
    EXPECT_TRUE(agree(dwd[size_t(e)], dw[size_t(e)], "grouped_linear_bwd dw[" + std::to_string(e) + "] (+=)", 2));
  // dx only (no weight gradients).
  Tensor dx2 = Tensor::zeros({N, in}, dt()), dx2d = dev_zeros({N, in}, dt());
  ops::grouped_linear_bwd(x, sizes, wp, dy, &dx2, {});
  ops::grouped_linear_bwd(xd, sizes, wpd, dyd, &dx2d, {});
  EXPECT_TRUE(agree(dx2d, dx2, "grouped_linear_bwd dx only", 2));
}

TEST_P(BackendConsistencyMoe, SharedExpertGate) {
  const int64_t T = 9;
  uint64_t seed = 6000;
  for (int64_t D : {19, 300}) {
    SCOPED_TRACE("D=" + std::to_string(D));
    Tensor g = host({T, 1}, dt(), ++seed, 2.0), s = host({T, D}, dt(), ++seed), y = host({T, D}, dt(), ++seed);
    Tensor dy = host({T, D}, dt(), ++seed), gd = on_dev(g), sd = on_dev(s), yd = on_dev(y);
    ops::sigmoid_gate_add_fwd(g, s, y);
    ops::sigmoid_gate_add_fwd(gd, sd, yd);
    EXPECT_TRUE(agree(yd, y, "sigmoid_gate_add_fwd (+=)"));
    Tensor ds = Tensor::zeros({T, D}, DType::F32), dsd = dev_zeros({T, D}, DType::F32);
    Tensor dg = Tensor::zeros({T, 1}, DType::F32), dgd = dev_zeros({T, 1}, DType::F32);
    ops::sigmoid_gate_add_bwd(g, s, dy, ds, dg);
    ops::sigmoid_gate_add_bwd(gd, sd, on_dev(dy), dsd, dgd);
    EXPECT_TRUE(agree(dsd, ds, "sigmoid_gate_add_bwd ds"));
    EXPECT_TRUE(agree(dgd, dg, "sigmoid_gate_add_bwd dg", 2));
  }
}

TEST_P(BackendConsistencyMoe, DeviceIndexChecksFailAsOnTheCpu) {
  // The device paths read their metadata back and check it before a kernel
  // could read out of bounds, with the CPU kernels' messages.
  const int64_t T = 3, E = 4, k = 2;
  const ops::MoeRouterConfig cfg = router_cfg(E, k, MoeScore::Softmax);
  Tensor sc = dev_zeros({T, E}, DType::F32), w = dev_zeros({T, k}, DType::F32), dl = dev_zeros({T, E}, DType::F32);
  Tensor bad = on_dev(Tensor::from_host(std::vector<int32_t>{0, 1, 2, 4, 3, -1}, {T, k}));
  EXPECT_THROW_MSG(ops::moe_router_bwd(sc, bad, w, w, cfg, dl), "topk_idx[1, 1] = 4 is not an expert in [0, 4)");
  Tensor logits = on_dev(host({T, E}, dt(), 7001));
  EXPECT_THROW_MSG(ops::moe_router_fwd(logits, nullptr, cfg, bad, w, sc, /*replay=*/true), "is not an expert");
  EXPECT_THROW_MSG(ops::moe_drop_to_capacity(bad, w, E, 1, MoeDropPolicy::Probs), "is not an expert");
  Tensor counts = dev_zeros({E}, DType::I32);
  Tensor cu = on_dev(Tensor::from_host(std::vector<int32_t>{0, 2}, {2}));
  EXPECT_THROW_MSG(ops::moe_aux_loss_fwd(logits, cu, MoeScore::Softmax, k, 0.1, counts), "must run from 0 to the 3");
  Tensor cu_down = on_dev(Tensor::from_host(std::vector<int32_t>{0, 2, 1, 3}, {4}));
  EXPECT_THROW_MSG(ops::moe_aux_loss_bwd(logits, cu_down, MoeScore::Softmax, k, 0.1, 1.0, dl), "must not decrease");
  // Routings tampered with after moe_routing: a source row past the tokens, two slots' rows swapped.
  const ops::MoeRouting r =
      ops::moe_routing(on_dev(Tensor::from_host(std::vector<int32_t>{0, 1, 2, 3, 2, 1}, {T, k})), E);
  const int64_t N = r.rows(), D = 5;
  ops::MoeRouting bad_source = r, bad_dest = r;
  std::vector<int32_t> src = r.source.to_host<int32_t>(), dst = r.dest.to_host<int32_t>();
  src[0] = int32_t(T);
  std::swap(dst[0], dst[2]);  // token 0's first slot takes token 1's row
  bad_source.source = on_dev(Tensor::from_host(src, {N}));
  bad_dest.dest = on_dev(Tensor::from_host(dst, {T, k}));
  Tensor x = on_dev(host({T, D}, dt(), 7002)), xs = dev_zeros({N, D}, dt());
  EXPECT_THROW_MSG(ops::moe_permute_fwd(x, bad_source, xs), "source[0] = 3 is outside [-1, 3)");
  Tensor ys = on_dev(host({N, D}, dt(), 7003)), dy = on_dev(host({T, D}, dt(), 7004));
  Tensor dys = dev_zeros({N, D}, DType::F32), dtw = dev_zeros({T, k}, DType::F32);
  EXPECT_THROW_MSG(ops::moe_unpermute_bwd(ys, w, dy, bad_dest, dys, dtw), "dest[0, 0] = 3 is another slot's row");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendConsistencyMoe, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace kestrel
