// Every op with a device kernel, run on the device and on the CPU from the
// same inputs, must agree within the tolerance of the output's dtype (ggml's
// test-backend-ops in function): the CPU kernels are themselves checked
// against the scalar references and finite differences by the other tests
// here, so agreement carries that check over to the device. Skipped where
// the build has no device backend or the machine no device (every CPU
// machine, CI included); scripts/device_check.sh runs it on a GPU.
//
// Optimizer ops must agree bit for bit (their CUDA kernels spell out every
// IEEE operation, kernels_optim.cu); sum_squares too (same order).
#include <gtest/gtest.h>

#include "backend/adamw_scalars.h"
#include "backend_consistency.h"
#include "common/testing.h"
#include "op_harness.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/mla.h"
#include "ops/norm.h"
#include "ops/optim_ops.h"
#include "ops/paged_attention.h"
#include "ops/reuse_fp32_ops.h"
#include "ops/rope.h"
#include "ops/vocab_loss.h"

namespace kestrel {
namespace {

using testing::make_tensor;
using testing::randn;

using testing::BackendConsistency;

TEST_P(BackendConsistency, LinearForwardAndBackward) {
  const int64_t T = 37, in = 96, out = 80;
  Tensor x = host({T, in}, dt(), 1), w = host({out, in}, dt(), 2, 0.1), b = host({out}, dt(), 3);
  Tensor dy = host({T, out}, dt(), 4);
  Tensor y = Tensor::empty({T, out}, dt()), yd = on_dev(y);
  Tensor bd = on_dev(b);
  ops::linear_fwd(x, w, &b, y);
  ops::linear_fwd(on_dev(x), on_dev(w), &bd, yd);
  EXPECT_TRUE(agree(yd, y, "linear_fwd"));
  for (bool acc : {false, true}) {
    Tensor dx = host({T, in}, DType::F32, 5), dw = host({out, in}, DType::F32, 6), db = host({out}, DType::F32, 7);
    Tensor dxd = on_dev(dx), dwd = on_dev(dw), dbd = on_dev(db);
    ops::linear_bwd(x, w, dy, &dx, &dw, &db, acc);
    ops::linear_bwd(on_dev(x), on_dev(w), on_dev(dy), &dxd, &dwd, &dbd, acc);
    EXPECT_TRUE(agree(dxd, dx, "linear_bwd dx", 2));
    EXPECT_TRUE(agree(dwd, dw, "linear_bwd dw", 2));
    EXPECT_TRUE(agree(dbd, db, "linear_bwd db", 2));
  }
  if (dt() == DType::BF16) {
    // bf16 training's backward: f32 output gradients against bf16 weights and
    // inputs, the device's three bf16 GEMMs of the split gradient (dense_ops.cpp:
    // split once for both GEMMs, or for the one asked) against the CPU's f32.
    Tensor dy32 = host({T, out}, DType::F32, 9);
    for (int which : {3, 1, 2}) {  // bit 1: dx, bit 2: dw
      Tensor dx = host({T, in}, DType::F32, 5), dw = host({out, in}, DType::F32, 6);
      Tensor dxd = on_dev(dx), dwd = on_dev(dw);
      Tensor* hx = which & 1 ? &dx : nullptr;
      Tensor* hw = which & 2 ? &dw : nullptr;
      ops::linear_bwd(x, w, dy32, hx, hw, nullptr, true);
      ops::linear_bwd(on_dev(x), on_dev(w), on_dev(dy32), hx ? &dxd : nullptr, hw ? &dwd : nullptr, nullptr, true);
      EXPECT_TRUE(agree(dxd, dx, "linear_bwd dx (f32 gradient, bf16 weights)", 2)) << which;
      EXPECT_TRUE(agree(dwd, dw, "linear_bwd dw (f32 gradient, bf16 inputs)", 2)) << which;
    }
  }
  Tensor a = host({T, in}, dt(), 8), s = Tensor::empty({T, in}, dt()), sd = on_dev(s);
  ops::add(x, a, s);
  ops::add(on_dev(x), on_dev(a), sd);
  EXPECT_TRUE(agree(sd, s, "add"));
}

TEST_P(BackendConsistency, EmbeddingNormAndSwiglu) {
  const int64_t T = 29, V = 50, D = 72;
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7 + 3) % (V + 10)) - 5;  // some outside the shard
  Tensor idh = Tensor::from_ints(ids, {T}), idd = on_dev(idh);
  Tensor table = host({V, D}, dt(), 11), y = Tensor::empty({T, D}, dt()), yd = on_dev(y);
  ops::embedding_fwd(idh, table, y, 2);
  ops::embedding_fwd(idd, on_dev(table), yd, 2);
  EXPECT_TRUE(agree(yd, y, "embedding_fwd"));
  Tensor dy = host({T, D}, dt(), 12), dt_ = host({V, D}, DType::F32, 13), dtd = on_dev(dt_);
  ops::embedding_bwd(idh, dy, dt_, 2);
  ops::embedding_bwd(idd, on_dev(dy), dtd, 2);
  EXPECT_TRUE(agree(dtd, dt_, "embedding_bwd"));
  {
    // Enough tokens for the device kernel's row partitions (one per 64 tokens,
    // here 10), every row seen many times, some ids outside the shard: each
    // row's tokens are still summed in token order, so the sums are the CPU's bit for bit.
    const int64_t Tn = 700;
    std::vector<int32_t> many(static_cast<size_t>(Tn));
    for (int64_t t = 0; t < Tn; ++t) many[size_t(t)] = int32_t((t * 13 + 1) % (V + 6)) - 1;
    Tensor mh = Tensor::from_ints(many, {Tn}), md = on_dev(mh);
    Tensor g = host({Tn, D}, dt(), 21), acc = host({V, D}, DType::F32, 22), accd = on_dev(acc);
    ops::embedding_bwd(mh, g, acc, 2);
    ops::embedding_bwd(md, on_dev(g), accd, 2);
    EXPECT_EQ(accd.to_host<float>(), acc.to_host<float>()) << "embedding_bwd over " << Tn << " tokens";
  }

  Tensor x = host({T, D}, dt(), 14), w = host({D}, dt(), 15), n = Tensor::empty({T, D}, dt()), nd = on_dev(n);
  Tensor rstd = Tensor::empty({T}, DType::F32), rstdd = on_dev(rstd);
  ops::rmsnorm_fwd(x, w, 1e-6f, n, rstd);
  ops::rmsnorm_fwd(on_dev(x), on_dev(w), 1e-6f, nd, rstdd);
  EXPECT_TRUE(agree(nd, n, "rmsnorm_fwd"));
  EXPECT_TRUE(agree(rstdd, rstd, "rmsnorm rstd"));
  Tensor dx = Tensor::empty({T, D}, dt()), dxd = on_dev(dx), dw = host({D}, DType::F32, 16), dwd = on_dev(dw);
  ops::rmsnorm_bwd(x, w, rstd, dy, dx, dw);
  ops::rmsnorm_bwd(on_dev(x), on_dev(w), rstdd, on_dev(dy), dxd, dwd);
  EXPECT_TRUE(agree(dxd, dx, "rmsnorm_bwd dx", 2));
  EXPECT_TRUE(agree(dwd, dw, "rmsnorm_bwd dw", 2));

  Tensor g = host({T, D}, dt(), 17), u = host({T, D}, dt(), 18), h = Tensor::empty({T, D}, dt()), hd = on_dev(h);
  ops::swiglu_fwd(g, u, h);
  ops::swiglu_fwd(on_dev(g), on_dev(u), hd);
  EXPECT_TRUE(agree(hd, h, "swiglu_fwd"));
  Tensor dg = Tensor::empty({T, D}, dt()), du = Tensor::empty({T, D}, dt()), dgd = on_dev(dg), dud = on_dev(du);
  ops::swiglu_bwd(g, u, dy, dg, du);
  ops::swiglu_bwd(on_dev(g), on_dev(u), on_dev(dy), dgd, dud);
  EXPECT_TRUE(agree(dgd, dg, "swiglu_bwd dgate"));
  EXPECT_TRUE(agree(dud, du, "swiglu_bwd dup"));
}

TEST_P(BackendConsistency, CopyOpsAndRope) {
  const int64_t R = 12, C = 10;
  Tensor src = host({R, C}, dt(), 21);
  Tensor idx = Tensor::from_ints({3, 0, 11, 5}, {4});
  Tensor g = Tensor::empty({4, C}, dt()), gd = on_dev(g);
  ops::gather_rows(src, idx, g);
  ops::gather_rows(on_dev(src), on_dev(idx), gd);
  expect_bits(gd, g, "gather_rows");
  Tensor dst = host({R, C}, dt(), 22), dstd = on_dev(dst);
  ops::scatter_rows(g, idx, dst);
  ops::scatter_rows(gd, on_dev(idx), dstd);
  expect_bits(dstd, dst, "scatter_rows");
  Tensor padded = Tensor::empty({R + 3, C}, dt()), paddedd = on_dev(padded);
  ops::pad_rows(src, padded, -100.f);
  ops::pad_rows(on_dev(src), paddedd, -100.f);
  expect_bits(paddedd, padded, "pad_rows");
  Tensor cols = host({R, 7}, dt(), 23), colsd = on_dev(cols);
  ops::copy_cols(src, 2, cols, 1, 5);
  ops::copy_cols(on_dev(src), 2, colsd, 1, 5);
  expect_bits(colsd, cols, "copy_cols");
  Tensor f32 = host({3, C}, DType::F32, 24), sum = Tensor::empty({C}, DType::F32), sumd = on_dev(sum);
  ops::sum_rows(f32, sum);
  ops::sum_rows(on_dev(f32), sumd);
  expect_bits(sumd, sum, "sum_rows");
  // Heads: src [T, 4 heads of 6], broadcast from one head, and the sum back.
  const int64_t T = 5;
  Tensor hs = host({T, 24}, dt(), 25), one = host({T, 6}, dt(), 26);
  Tensor hdst = host({T, 4 * 8}, dt(), 27), hdstd = on_dev(hdst), bdst = host({T, 4 * 8}, dt(), 28), bdstd = on_dev(bdst);
  ops::copy_head_cols(hs, 4, 1, hdst, 4, 2, 4);
  ops::copy_head_cols(on_dev(hs), 4, 1, hdstd, 4, 2, 4);
  expect_bits(hdstd, hdst, "copy_head_cols");
  ops::copy_head_cols(one, 1, 0, bdst, 4, 3, 5);
  ops::copy_head_cols(on_dev(one), 1, 0, bdstd, 4, 3, 5);
  expect_bits(bdstd, bdst, "copy_head_cols broadcast");
  Tensor hsum = Tensor::empty({T, 3}, DType::F32), hsumd = on_dev(hsum);
  ops::sum_head_cols(hs, 4, 2, hsum, 3);
  ops::sum_head_cols(on_dev(hs), 4, 2, hsumd, 3);
  EXPECT_TRUE(agree(hsumd, hsum, "sum_head_cols"));

  for (bool interleaved : {false, true}) {
    ops::RopeConfig cfg;
    cfg.head_dim = 32;
    cfg.interleaved = interleaved;
    const ops::RopeTable table = ops::make_rope_table(cfg, 64), tabled = ops::rope_table_to(table, dev_);
    Tensor pos = Tensor::from_ints({0, 5, 63, 7, 1, 2, 3}, {7}), posd = on_dev(pos);
    Tensor x = host({7, 3 * 40}, dt(), 29), xd = on_dev(x);  // 3 heads of 40, rotated from column 4
    ops::rope_fwd(x, pos, table, 3, 4);
    ops::rope_fwd(xd, posd, tabled, 3, 4);
    EXPECT_TRUE(agree(xd, x, interleaved ? "rope_fwd interleaved" : "rope_fwd"));
    ops::rope_bwd(x, pos, table, 3, 4);
    ops::rope_bwd(xd, posd, tabled, 3, 4);
    EXPECT_TRUE(agree(xd, x, interleaved ? "rope_bwd interleaved" : "rope_bwd"));
  }
}

TEST_P(BackendConsistency, LossesOverTheVocabulary) {
  const int64_t T = 9, V = 1000;
  Tensor logits = host({T, V}, dt(), 31, 3.0);
  Tensor tg = Tensor::from_ints({0, 999, -100, 17, 500, 3, -1, 42, 7}, {T}), tgd = on_dev(tg);
  Tensor ld = on_dev(logits);
  Tensor lp = Tensor::empty({T}, DType::F32), en = Tensor::empty({T}, DType::F32), lse = Tensor::empty({T}, DType::F32);
  Tensor lpd = on_dev(lp), end = on_dev(en), lsed = on_dev(lse);
  ops::logprob_entropy_fwd(logits, tg, lp, &en, lse);
  ops::logprob_entropy_fwd(ld, tgd, lpd, &end, lsed);
  EXPECT_TRUE(agree(lpd, lp, "logprob"));
  EXPECT_TRUE(agree(end, en, "entropy"));
  EXPECT_TRUE(agree(lsed, lse, "lse"));
  Tensor dlp = host({T}, DType::F32, 32), den = host({T}, DType::F32, 33);
  Tensor dl = Tensor::empty({T, V}, dt()), dld = on_dev(dl);
  Tensor dend = on_dev(den);
  ops::logprob_entropy_bwd(logits, tg, lse, dlp, &den, dl);
  ops::logprob_entropy_bwd(ld, tgd, lsed, on_dev(dlp), &dend, dld);
  EXPECT_TRUE(agree(dld, dl, "logprob_entropy_bwd", 2));
  Tensor lse2 = Tensor::empty({T}, DType::F32), lse2d = on_dev(lse2);
  const double ce = ops::cross_entropy_fwd(logits, tg, lse2), ced = ops::cross_entropy_fwd(ld, tgd, lse2d);
  EXPECT_NEAR(ced, ce, 1e-5 * std::abs(ce));
  ops::cross_entropy_bwd(logits, tg, lse2, 0.5, dl);
  ops::cross_entropy_bwd(ld, tgd, lse2d, 0.5, dld);
  EXPECT_TRUE(agree(dld, dl, "cross_entropy_bwd", 2));

  // The vocab-parallel pieces on a shard of 400 columns (390 real) starting at 300.
  const int64_t Vs = 400, n_real = 390, start = 300;
  Tensor shard = host({T, Vs}, dt(), 34, 3.0), shardd = on_dev(shard);
  Tensor M = Tensor::empty({T}, DType::F32), Md = on_dev(M);
  ops::vocab_row_max(shard, n_real, M);
  ops::vocab_row_max(shardd, n_real, Md);
  expect_bits(Md, M, "vocab_row_max");
  Tensor sums = Tensor::empty({3, T}, DType::F32), sumsd = on_dev(sums);
  ops::vocab_row_sums(shard, tg, start, n_real, M, sums);
  ops::vocab_row_sums(shardd, tgd, start, n_real, Md, sumsd);
  EXPECT_TRUE(agree(sumsd, sums, "vocab_row_sums"));
  Tensor L = M.clone(), Ld = on_dev(M), vlp = Tensor::empty({T}, DType::F32), vlpd = on_dev(vlp);
  Tensor ven = Tensor::empty({T}, DType::F32), vend = on_dev(ven);
  ops::vocab_softmax_finish(sums, tg, L, &vlp, &ven);
  ops::vocab_softmax_finish(sumsd, tgd, Ld, &vlpd, &vend);
  EXPECT_TRUE(agree(Ld, L, "vocab lse"));
  EXPECT_TRUE(agree(vlpd, vlp, "vocab logprob"));
  EXPECT_TRUE(agree(vend, ven, "vocab entropy"));
  Tensor vg = Tensor::empty({T, Vs}, DType::F32), vgd = on_dev(vg);
  ops::vocab_logprob_entropy_grad(shard, tg, start, n_real, L, dlp, &den, &ven, vg);
  ops::vocab_logprob_entropy_grad(shardd, tgd, start, n_real, Ld, on_dev(dlp), &dend, &vend, vgd);
  EXPECT_TRUE(agree(vgd, vg, "vocab grad", 2));
}

TEST_P(BackendConsistency, AttentionWithGqaPrefixesAndValueWidth) {
  // Sequences 0..3; 2 continues 0 and 3 continues 0 (a GRPO group), 1 is plain; lengths straddle 32
  // (the CUDA kernels' row and key tiles). Head dims up to 64 and up to 128 take the two tiled
  // kernel widths, 160 the row-per-warp kernels (kernels_attention.cu).
  const std::vector<int32_t> cu = {0, 40, 73, 80, 113};
  const int64_t T = cu.back();
  for (const auto& [H, Hkv, hd, vd, prefixed] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>>{{4, 2, 64, 64, false}, {4, 1, 40, 40, true},
                                                                          {2, 2, 48, 32, true}, {2, 1, 128, 96, true},
                                                                          {2, 2, 160, 64, true}}) {
    SCOPED_TRACE("H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) + " hd=" + std::to_string(hd) +
                 " vd=" + std::to_string(vd) + (prefixed ? " prefixed" : ""));
    const ops::AttentionShape s{H, Hkv, hd, 0.f, vd == hd ? 0 : vd};
    Tensor q = host({T, H * hd}, dt(), 41), k = host({T, Hkv * hd}, dt(), 42), v = host({T, Hkv * vd}, dt(), 43);
    Tensor cut = Tensor::from_ints(cu, {int64_t(cu.size())}), cud = on_dev(cut);
    Tensor pre = Tensor::from_ints({-1, -1, 0, 0}, {4}), pred = on_dev(pre);
    const Tensor* pp = prefixed ? &pre : nullptr;
    const Tensor* ppd = prefixed ? &pred : nullptr;
    Tensor out = Tensor::empty({T, H * vd}, dt()), lse = Tensor::empty({H, T}, DType::F32);
    Tensor outd = on_dev(out), lsed = on_dev(lse);
    Tensor qd = on_dev(q), kd = on_dev(k), vdv = on_dev(v);
    ops::attention_fwd(q, k, v, cut, s, out, lse, pp);
    ops::attention_fwd(qd, kd, vdv, cud, s, outd, lsed, ppd);
    EXPECT_TRUE(agree(outd, out, "attention out"));
    EXPECT_TRUE(agree(lsed, lse, "attention lse"));
    Tensor dout = host({T, H * vd}, dt(), 44);
    Tensor dq = Tensor::empty(q.shape(), dt()), dk = Tensor::empty(k.shape(), dt()), dv = Tensor::empty(v.shape(), dt());
    Tensor dqd = on_dev(dq), dkd = on_dev(dk), dvd = on_dev(dv);
    ops::attention_bwd(q, k, v, out, lse, dout, cut, s, dq, dk, dv, pp);
    ops::attention_bwd(qd, kd, vdv, outd, lsed, on_dev(dout), cud, s, dqd, dkd, dvd, ppd);
    EXPECT_TRUE(agree(dqd, dq, "attention dq", 2));
    EXPECT_TRUE(agree(dkd, dk, "attention dk", 2));
    EXPECT_TRUE(agree(dvd, dv, "attention dv", 2));
    if (dt() == DType::F32) continue;
    // The model's bf16 layout: bf16 q, k, v and output, f32 output gradient and f32 dq, dk, dv. Both
    // backwards take the CPU forward's out and lse (the device's differ by bf16 ulps), so the f32
    // gradients must agree to f32's tolerance. The output gradient has f32's full
    // precision (not bf16 values widened), so every bf16 part of the tensor-core
    // kernels' split of it (kernels_attention_mma.cu) counts.
    Tensor dout32 = host({T, H * vd}, DType::F32, 45);
    outd = on_dev(out);
    lsed = on_dev(lse);
    Tensor gq = Tensor::empty(q.shape(), DType::F32), gk = Tensor::empty(k.shape(), DType::F32);
    Tensor gv = Tensor::empty(v.shape(), DType::F32);
    Tensor gqd = on_dev(gq), gkd = on_dev(gk), gvd = on_dev(gv);
    ops::attention_bwd(q, k, v, out, lse, dout32, cut, s, gq, gk, gv, pp);
    ops::attention_bwd(qd, kd, vdv, outd, lsed, on_dev(dout32), cud, s, gqd, gkd, gvd, ppd);
    EXPECT_TRUE(agree(gqd, gq, "attention dq (f32 grads of bf16 inputs)", 2));
    EXPECT_TRUE(agree(gkd, gk, "attention dk (f32 grads of bf16 inputs)", 2));
    EXPECT_TRUE(agree(gvd, gv, "attention dv (f32 grads of bf16 inputs)", 2));
  }
}

TEST_P(BackendConsistency, RingBlockAttentionMergeAndBackward) {
  // Two sequences. Block A: seq 0's queries at positions 4..7 see keys at 0..5 in part; seq 1's queries
  // (positions 0..2) see none of its keys (6..8): their rows stay 0 / -inf. Block B: the same queries over
  // keys at the queries' own positions, so after the merge every row has seen something.
  const int64_t H = 4, Hkv = 2, hd = 40, vd = 24, Tq = 7;
  const ops::AttentionShape s{H, Hkv, hd, 0.f, vd};
  auto block = [&](std::vector<int32_t> cu_k, std::vector<int32_t> k_pos) {
    ops::AttentionBlock b;
    b.cu_q = Tensor::from_ints({0, 4, 7}, {3});
    b.cu_k = Tensor::from_ints(cu_k, {3});
    b.q_pos = Tensor::from_ints({4, 5, 6, 7, 0, 1, 2}, {Tq});
    b.k_pos = Tensor::from_ints(k_pos, {int64_t(k_pos.size())});
    return b;
  };
  auto to_dev = [&](const ops::AttentionBlock& b) {
    ops::AttentionBlock d;
    d.cu_q = on_dev(b.cu_q), d.cu_k = on_dev(b.cu_k), d.q_pos = on_dev(b.q_pos), d.k_pos = on_dev(b.k_pos);
    return d;
  };
  const ops::AttentionBlock A = block({0, 6, 9}, {0, 1, 2, 3, 4, 5, 6, 7, 8}), B = block({0, 4, 7}, {4, 5, 6, 7, 0, 1, 2});
  const ops::AttentionBlock Ad = to_dev(A), Bd = to_dev(B);
  Tensor q = host({Tq, H * hd}, dt(), 81), qd = on_dev(q);
  Tensor ka = host({9, Hkv * hd}, dt(), 82), va = host({9, Hkv * vd}, dt(), 83);
  Tensor kb = host({7, Hkv * hd}, dt(), 84), vb = host({7, Hkv * vd}, dt(), 85);
  Tensor kad = on_dev(ka), vad = on_dev(va), kbd = on_dev(kb), vbd = on_dev(vb);
  Tensor out = Tensor::empty({Tq, H * vd}, DType::F32), lse = Tensor::empty({H, Tq}, DType::F32);
  Tensor outd = on_dev(out), lsed = on_dev(lse);
  ops::attention_block_fwd(q, ka, va, A, s, out, lse);
  ops::attention_block_fwd(qd, kad, vad, Ad, s, outd, lsed);
  EXPECT_TRUE(agree(outd, out, "attention_block_fwd out (block A)"));
  EXPECT_TRUE(agree(lsed, lse, "attention_block_fwd lse (block A, -inf rows included)"));
  Tensor outb = Tensor::empty({Tq, H * vd}, dt()), lseb = Tensor::empty({H, Tq}, DType::F32);
  Tensor outbd = on_dev(outb), lsebd = on_dev(lseb);
  ops::attention_block_fwd(q, kb, vb, B, s, outb, lseb);
  ops::attention_block_fwd(qd, kbd, vbd, Bd, s, outbd, lsebd);
  ops::attention_merge(out, lse, outb, lseb);
  ops::attention_merge(outd, lsed, outbd, lsebd);
  EXPECT_TRUE(agree(outd, out, "attention_merge out"));
  EXPECT_TRUE(agree(lsed, lse, "attention_merge lse"));
  Tensor dout = host({Tq, H * vd}, DType::F32, 86), doutd = on_dev(dout);
  Tensor dq = host({Tq, H * hd}, DType::F32, 87), dqd = on_dev(dq);  // accumulated into
  for (int blk = 0; blk < 2; ++blk) {
    const Tensor& k = blk ? kb : ka;
    const Tensor& v = blk ? vb : va;
    Tensor dk = Tensor::empty(k.shape(), DType::F32), dv = Tensor::empty(v.shape(), DType::F32);
    Tensor dkd = on_dev(dk), dvd = on_dev(dv);
    ops::attention_block_bwd(q, k, v, out, lse, dout, blk ? B : A, s, dq, dk, dv);
    ops::attention_block_bwd(qd, blk ? kbd : kad, blk ? vbd : vad, outd, lsed, doutd, blk ? Bd : Ad, s, dqd, dkd, dvd);
    EXPECT_TRUE(agree(dkd, dk, "attention_block_bwd dk", 2));
    EXPECT_TRUE(agree(dvd, dv, "attention_block_bwd dv", 2));
  }
  EXPECT_TRUE(agree(dqd, dq, "attention_block_bwd dq (two blocks accumulated)", 2));
}

TEST_P(BackendConsistency, PagedKvCacheAndAttention) {
  // 3 sequences: a decode row at position 40, a prefill chunk of 5 rows ending at 20, a decode row at 0.
  const int64_t H = 4, Hkv = 2, hd = 64, bs = 16, nblocks = 12, max_blocks = 4;
  const ops::AttentionShape s{H, Hkv, hd, 0.f, 0};
  Tensor kc = Tensor::zeros({nblocks, bs, Hkv, hd}, dt()), vc = Tensor::zeros({nblocks, bs, Hkv, hd}, dt());
  Tensor kcd = on_dev(kc), vcd = on_dev(vc);
  // Fill every slot the tables below use: 48 tokens' K/V into slots of blocks 7, 2, 9 (seq 0), 4, 0 (seq 1), 11 (seq 2).
  std::vector<int32_t> slots;
  for (int32_t blk : {7, 2, 9, 4, 0, 11})
    for (int32_t o = 0; o < bs; ++o) slots.push_back(blk * int32_t(bs) + o);
  const int64_t n = int64_t(slots.size());
  Tensor k = host({n, Hkv * hd}, dt(), 61), v = host({n, Hkv * hd}, dt(), 62);
  Tensor sl = Tensor::from_ints(slots, {n});
  ops::paged_kv_write(k, v, sl, kc, vc);
  ops::paged_kv_write(on_dev(k), on_dev(v), on_dev(sl), kcd, vcd);
  expect_bits(kcd, kc, "paged_kv_write k");
  expect_bits(vcd, vc, "paged_kv_write v");
  Tensor bt = Tensor::from_ints({7, 2, 9, -1, 4, 0, -1, -1, 11, -1, -1, -1}, {3, max_blocks});
  Tensor cu = Tensor::from_ints({0, 1, 6, 7}, {4}), lens = Tensor::from_ints({41, 20, 1}, {3});
  Tensor q = host({7, H * hd}, dt(), 63), out = Tensor::empty({7, H * hd}, dt()), outd = on_dev(out);
  ops::paged_attention_fwd(q, kc, vc, bt, cu, lens, s, out);
  ops::paged_attention_fwd(on_dev(q), kcd, vcd, on_dev(bt), on_dev(cu), on_dev(lens), s, outd);
  EXPECT_TRUE(agree(outd, out, "paged_attention_fwd"));
  // The other kernel shapes (kernels_paged.cu): 7 query heads per kv head at head dim 128 (the
  // grouped kernel's wide variant, Qwen2.5-0.5B's grouping), and 9 per kv head (the row-per-warp kernel).
  for (const auto& [H2, hd2] : std::vector<std::pair<int64_t, int64_t>>{{7, 128}, {9, 32}}) {
    SCOPED_TRACE("H=" + std::to_string(H2) + " Hkv=1 hd=" + std::to_string(hd2));
    Tensor kc2 = Tensor::zeros({nblocks, bs, 1, hd2}, dt()), vc2 = Tensor::zeros({nblocks, bs, 1, hd2}, dt());
    Tensor kcd2 = on_dev(kc2), vcd2 = on_dev(vc2);
    Tensor k2 = host({n, hd2}, dt(), 64), v2 = host({n, hd2}, dt(), 65);
    ops::paged_kv_write(k2, v2, sl, kc2, vc2);
    ops::paged_kv_write(on_dev(k2), on_dev(v2), on_dev(sl), kcd2, vcd2);
    Tensor q2 = host({7, H2 * hd2}, dt(), 66), out2 = Tensor::empty({7, H2 * hd2}, dt()), outd2 = on_dev(out2);
    const ops::AttentionShape s2{H2, 1, hd2, 0.f, 0};
    ops::paged_attention_fwd(q2, kc2, vc2, bt, cu, lens, s2, out2);
    ops::paged_attention_fwd(on_dev(q2), kcd2, vcd2, on_dev(bt), on_dev(cu), on_dev(lens), s2, outd2);
    EXPECT_TRUE(agree(outd2, out2, "paged_attention_fwd"));
  }
  // Block copies within the device cache, and a swap out to the host and back in.
  const std::vector<std::pair<int32_t, int32_t>> pairs = {{7, 1}, {2, 3}, {11, 5}};
  ops::copy_kv_blocks(kc, kc, pairs);
  ops::copy_kv_blocks(kcd, kcd, pairs);
  expect_bits(kcd, kc, "copy_kv_blocks");
  Tensor swap = Tensor::zeros({4, bs, Hkv, hd}, dt());
  ops::copy_kv_blocks(kcd, swap, {{7, 0}, {9, 3}});
  Tensor back = Tensor::zeros({nblocks, bs, Hkv, hd}, dt(), MemCategory::Other, dev_);
  ops::copy_kv_blocks(swap, back, {{0, 6}, {3, 8}});
  ops::copy_kv_blocks(kc, kc, {{7, 6}, {9, 8}});
  Tensor want = Tensor::zeros({nblocks, bs, Hkv, hd}, dt());
  ops::copy_kv_blocks(kc, want, {{6, 6}, {8, 8}});
  expect_bits(back, want, "copy_kv_blocks swap out and in");
}

TEST_P(BackendConsistency, MlaAbsorbedProjectionsAndLatentCache) {
  const int64_t H = 2, lora = 48, nope = 16, rope = 8, v = 12, bs = 8, nblocks = 6, max_blocks = 3;
  const ops::MlaShape s{H, lora, nope, rope, v, 0.f};
  const int64_t T = 4;  // a decode row at position 17 (seq 0) and a chunk of 3 ending at 9 (seq 1)
  Tensor q = host({T, H * (nope + rope)}, dt(), 71), kv_b = host({H * (nope + v), lora}, dt(), 72, 0.2);
  Tensor q_lat = Tensor::empty({T, H * (lora + rope)}, dt()), q_latd = on_dev(q_lat);
  ops::mla_absorb_q(q, kv_b, s, q_lat);
  ops::mla_absorb_q(on_dev(q), on_dev(kv_b), s, q_latd);
  EXPECT_TRUE(agree(q_latd, q_lat, "mla_absorb_q"));
  std::vector<int32_t> slots;
  for (int32_t blk : {4, 1, 5, 0, 2})
    for (int32_t o = 0; o < bs; ++o) slots.push_back(blk * int32_t(bs) + o);
  const int64_t n = int64_t(slots.size());
  Tensor c_kv = host({n, lora}, dt(), 73), k_pe = host({n, rope}, dt(), 74), sl = Tensor::from_ints(slots, {n});
  Tensor cache = Tensor::zeros({nblocks, bs, lora + rope}, dt()), cached = on_dev(cache);
  ops::paged_latent_write(c_kv, k_pe, sl, cache);
  ops::paged_latent_write(on_dev(c_kv), on_dev(k_pe), on_dev(sl), cached);
  expect_bits(cached, cache, "paged_latent_write");
  Tensor bt = Tensor::from_ints({4, 1, 5, 0, 2, -1}, {2, max_blocks});
  Tensor cu = Tensor::from_ints({0, 1, 4}, {3}), lens = Tensor::from_ints({18, 10}, {2});
  Tensor o_lat = Tensor::empty({T, H * lora}, dt()), o_latd = on_dev(o_lat);
  ops::paged_latent_attention_fwd(q_lat, cache, bt, cu, lens, s, o_lat);
  ops::paged_latent_attention_fwd(on_dev(q_lat), cached, on_dev(bt), on_dev(cu), on_dev(lens), s, o_latd);
  EXPECT_TRUE(agree(o_latd, o_lat, "paged_latent_attention_fwd"));
  Tensor o = Tensor::empty({T, H * v}, dt()), od = on_dev(o);
  ops::mla_absorb_out(o_lat, kv_b, s, o);
  ops::mla_absorb_out(on_dev(o_lat), on_dev(kv_b), s, od);
  EXPECT_TRUE(agree(od, o, "mla_absorb_out"));
}

TEST_P(BackendConsistency, OptimizerOpsAreBitForBit) {
  if (dt() != DType::F32) GTEST_SKIP() << "the optimizer's state is f32; one pass suffices";
  const int64_t n = 10007;
  for (DType copy_dt : {DType::BF16, DType::F16, DType::F32}) {
    Tensor w = host({n}, DType::F32, 51), m = host({n}, DType::F32, 52, 0.01), v = host({n}, DType::F32, 53, 0.01);
    Tensor g = host({n}, DType::F32, 54), c = Tensor::empty({n}, copy_dt);
    // v must be non-negative: a squared average.
    Tensor v_abs = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) v_abs.set(i, std::abs(v.get(i)));
    Tensor wd = on_dev(w), md = on_dev(m), vd = on_dev(v_abs), gd = on_dev(g), cd = on_dev(c);
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWScalars s = AdamWScalars::make(1e-2, 0.9, 0.999, 1e-8, 0.1, t, t != 2);
      ops::adamw_step(s, w, m, v_abs, g, &c);
      ops::adamw_step(s, wd, md, vd, gd, &cd);
    }
    expect_bits(wd, w, "adamw master");
    expect_bits(md, m, "adamw exp_avg");
    expect_bits(vd, v_abs, "adamw exp_avg_sq");
    expect_bits(cd, c, std::string("adamw model copy ") + dtype_name(copy_dt));
  }
  // reuse_fp32_param: split, three steps on (copy, residual, flags), recover.
  {
    Tensor master = host({n}, DType::F32, 56), m = host({n}, DType::F32, 57, 0.01), g = host({n}, DType::F32, 58);
    Tensor v = Tensor::empty({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) v.set(i, std::abs(0.01f * g.get(i)));
    Tensor copy = Tensor::empty({n}, DType::BF16), res = Tensor::empty({n}, DType::BF16);
    Tensor copyd = on_dev(copy), resd = on_dev(res), md = on_dev(m), vd = on_dev(v), gd = on_dev(g);
    ops::reuse_fp32_split(master, copy, res, v);
    ops::reuse_fp32_split(on_dev(master), copyd, resd, vd);
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWScalars s = AdamWScalars::make(1e-2, 0.9, 0.999, 1e-8, 0.1, t, true);
      ops::adamw_step_reuse_fp32(s, copy, res, m, v, g);
      ops::adamw_step_reuse_fp32(s, copyd, resd, md, vd, gd);
    }
    Tensor back = Tensor::empty({n}, DType::F32), backd = on_dev(back);
    Tensor vc = Tensor::empty({n}, DType::F32), vcd = on_dev(vc);
    ops::reuse_fp32_recover(copy, res, v, back, &vc);
    ops::reuse_fp32_recover(copyd, resd, vd, backd, &vcd);
    expect_bits(backd, back, "reuse_fp32 master after three steps");
    expect_bits(vcd, vc, "reuse_fp32 exp_avg_sq");
    expect_bits(md, m, "reuse_fp32 exp_avg");
  }
  Tensor x = host({n}, DType::F32, 55), xd = on_dev(x);
  EXPECT_EQ(ops::sum_squares(xd), ops::sum_squares(x));
  ops::scale_(x, 0.37f);
  ops::scale_(xd, 0.37f);
  expect_bits(xd, x, "scale_");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BackendConsistency, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kestrel
