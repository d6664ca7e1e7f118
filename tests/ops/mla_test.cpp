// Multi-head latent attention (ops/mla.h): the absorbed projections, the
// latent cache write and the paged latent attention against their double
// references (f32 and bf16, each kernel ISA level), and the equivalence that
// makes the rollout's absorbed path valid: absorb_q -> latent write -> paged
// latent attention -> absorb_out computes what the training path's
// decompressed attention (k_h = [W_UK_h c_kv | k_pe], v_h = W_UV_h c_kv,
// ops::attention_fwd with head_dim nope+rope and v_head_dim v) computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "core/parallel_for.h"
#include "op_harness.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/linear.h"
#include "ops/mla.h"
#include "ops/ref/mla_ref.h"

namespace kestrel {
namespace {

using namespace testing;

ops::ref::MlaRefShape ref_shape(const ops::MlaShape& s) {
  return {s.n_heads, s.kv_lora_rank, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim, double(s.scale)};
}

Tensor random_tensor(Shape shape, DType dt, uint64_t seed, double scale = 1.0) {
  const int64_t n = shape_numel(shape);
  return make_tensor(randn(n, seed, scale), std::move(shape), dt);
}

// ---------------------------------------------------------------- absorb --

class MlaDtypes : public IsaParamTest<DType> {};

TEST_P(MlaDtypes, AbsorbMatchesReference) {
  const DType dt = param();
  // Widths off the vector width, DeepSeek-V2-Lite's per-head widths; a few
  // rows (the decode kernels, latent of whole vectors) and many (the GEMMs).
  struct AbsorbCase {
    ops::MlaShape s;
    int64_t T;
  };
  for (const auto& [s, T] : {AbsorbCase{{3, 40, 12, 8, 10, 0.f}, 7}, AbsorbCase{{2, 512, 128, 64, 128, 0.f}, 7},
                             AbsorbCase{{3, 32, 12, 8, 10, 0.f}, 5}, AbsorbCase{{3, 32, 12, 8, 10, 0.f}, 40},
                             AbsorbCase{{2, 64, 16, 8, 6, 0.f}, 1}}) {
    const std::string name = "H" + std::to_string(s.n_heads) + " L" + std::to_string(s.kv_lora_rank) + " T" +
                             std::to_string(T);
    const int64_t H = s.n_heads;
    const Tensor q = random_tensor({T, H * (s.qk_nope_head_dim + s.qk_rope_head_dim)}, dt, 1);
    const Tensor kv_b = random_tensor({H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank}, dt, 2, 0.1);
    const Tensor o_lat = random_tensor({T, H * s.kv_lora_rank}, dt, 3);
    Tensor q_lat = nan_tensor({T, H * s.latent_dim()}, dt), o = nan_tensor({T, H * s.v_head_dim}, dt);
    ops::mla_absorb_q(q, kv_b, s, q_lat);
    ops::mla_absorb_out(o_lat, kv_b, s, o);
    const auto qd = values(q), wd = values(kv_b), ld = values(o_lat);
    std::vector<double> want_q(size_t(q_lat.numel())), want_o(size_t(o.numel()));
    ops::ref::mla_absorb_q_ref(qd.data(), wd.data(), ref_shape(s), T, want_q.data());
    ops::ref::mla_absorb_out_ref(ld.data(), wd.data(), ref_shape(s), T, want_o.data());
    EXPECT_TRUE(close_for(dt, values(q_lat), want_q, name + " q_lat"));
    EXPECT_TRUE(close_for(dt, values(o), want_o, name + " o"));
  }
}

// f32 weights with bf16 activations (master weights kept in f32).
TEST_P(MlaDtypes, AbsorbWithF32Weights) {
  const DType dt = param();
  const ops::MlaShape s{2, 24, 8, 4, 6, 0.f};
  const int64_t T = 5;
  const Tensor q = random_tensor({T, 2 * 12}, dt, 4), kv_b = random_tensor({2 * 14, 24}, DType::F32, 5);
  Tensor q_lat = nan_tensor({T, 2 * 28}, dt);
  ops::mla_absorb_q(q, kv_b, s, q_lat);
  const auto qd = values(q), wd = values(kv_b);
  std::vector<double> want(size_t(q_lat.numel()));
  ops::ref::mla_absorb_q_ref(qd.data(), wd.data(), ref_shape(s), T, want.data());
  EXPECT_TRUE(close_for(dt, values(q_lat), want, "q_lat"));
}

// ------------------------------------------------------- latent cache --

TEST_P(MlaDtypes, LatentWriteMatchesReferenceAndSkipsPadSlots) {
  const DType dt = param();
  const int64_t L = 20, R = 6, nb = 5, bs = 4, T = 6;
  const auto cache0 = randn(nb * bs * (L + R), 10);
  Tensor cache = make_tensor(cache0, {nb, bs, L + R}, dt);
  const Tensor c_kv = random_tensor({T, L}, dt, 11), k_pe = random_tensor({T, R}, dt, 12);
  const std::vector<int32_t> slots = {17, -1, 3, 0, 19, -1};  // non-contiguous, two pad rows
  ops::paged_latent_write(c_kv, k_pe, make_ids(slots), cache);
  std::vector<double> want = round_to(cache0, dt);
  const auto cd = values(c_kv), kd = values(k_pe);
  ops::ref::paged_latent_write_ref(cd.data(), kd.data(), slots.data(), T, L, R, want.data());
  EXPECT_EQ(values(cache), want);  // values move exactly
}

// ---------------------------------------------------- latent attention --

struct LatCase {
  std::string name;
  int64_t H, L, R, bs;
  std::vector<int32_t> q_lens, ctx_lens;  // per sequence: query rows, context including them
};

struct LatBuilt {
  ops::MlaShape s;
  Tensor q_lat, cache, tables, cu_q, seq_lens;
  int64_t T = 0, max_blocks = 0;
};

// Shuffled block ids (block 0 never used, like the engine's null block), a
// cache of random "cached" rows plus the chunk's rows written through
// paged_latent_write; blocks no table uses hold `garbage`.
LatBuilt build(const LatCase& c, DType dt, double garbage = 0.0) {
  LatBuilt b;
  b.s = {c.H, c.L, 16, c.R, 16, 0.f};
  const int64_t B = int64_t(c.q_lens.size()), D = c.L + c.R;
  int64_t blocks = 0;
  for (int64_t i = 0; i < B; ++i) {
    b.T += c.q_lens[size_t(i)];
    const int64_t nb = (c.ctx_lens[size_t(i)] + c.bs - 1) / c.bs;
    b.max_blocks = std::max(b.max_blocks, nb);
    blocks += nb;
  }
  const int64_t num_blocks = blocks + 3;  // two unused blocks besides block 0
  std::vector<int32_t> ids(size_t(num_blocks - 1));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937 g(7);
  std::shuffle(ids.begin(), ids.end(), g);
  std::vector<double> cache = randn(num_blocks * c.bs * D, 20);
  std::vector<int32_t> tables(size_t(B * b.max_blocks), 0), cu(size_t(B + 1), 0), slots;
  size_t next = 0;
  std::vector<bool> used(size_t(num_blocks), false);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t nb = (c.ctx_lens[size_t(i)] + c.bs - 1) / c.bs;
    for (int64_t j = 0; j < nb; ++j) used[size_t(tables[size_t(i * b.max_blocks + j)] = ids[next++])] = true;
    cu[size_t(i + 1)] = cu[size_t(i)] + c.q_lens[size_t(i)];
    for (int64_t p = c.ctx_lens[size_t(i)] - c.q_lens[size_t(i)]; p < c.ctx_lens[size_t(i)]; ++p)
      slots.push_back(tables[size_t(i * b.max_blocks + p / c.bs)] * int32_t(c.bs) + int32_t(p % c.bs));
  }
  for (int64_t blk = 0; blk < num_blocks; ++blk)
    if (!used[size_t(blk)])
      std::fill(cache.begin() + blk * c.bs * D, cache.begin() + (blk + 1) * c.bs * D, garbage);
  b.cache = make_tensor(cache, {num_blocks, c.bs, D}, dt);
  b.tables = Tensor::from_ints(tables, {B, b.max_blocks});
  b.cu_q = Tensor::from_ints(cu, {B + 1});
  b.seq_lens = Tensor::from_ints(c.ctx_lens, {B});
  b.q_lat = random_tensor({b.T, c.H * D}, dt, 21, 0.5);
  ops::paged_latent_write(random_tensor({b.T, c.L}, dt, 22), random_tensor({b.T, c.R}, dt, 23), make_ids(slots),
                          b.cache);
  return b;
}

Tensor run_latent(const LatBuilt& b) {
  Tensor o = nan_tensor({b.T, b.s.n_heads * b.s.kv_lora_rank}, b.q_lat.dtype());
  ops::paged_latent_attention_fwd(b.q_lat, b.cache, b.tables, b.cu_q, b.seq_lens, b.s, o);
  return o;
}

std::vector<double> ref_latent(const LatBuilt& b) {
  const auto q = values(b.q_lat), cache = values(b.cache);
  std::vector<double> o(size_t(b.T * b.s.n_heads * b.s.kv_lora_rank));
  ops::ref::paged_latent_attention_ref(q.data(), cache.data(), b.cache.size(1), b.tables.data<int32_t>(), b.max_blocks,
                                       b.cu_q.data<int32_t>(), b.seq_lens.data<int32_t>(), b.tables.size(0),
                                       ref_shape(b.s), o.data());
  return o;
}

// Decode rows and chunked prefills mixed in one batch: a decode at context 1
// and at contexts across the kernel's 64-key chunks, a chunk after a cached
// prefix, a whole prompt longer than a chunk, an empty chunk; heads not a
// multiple of the score tile, more heads than a task holds (40 > 32), latent
// rows read in place (D = 48) and widened (D = 26), block sizes 4 and 16.
std::vector<LatCase> lat_cases() {
  const std::vector<int32_t> q = {1, 20, 70, 1, 0, 1, 3}, ctx = {37, 50, 70, 1, 10, 150, 66};
  return {
      {"H5 L40 R8 bs4", 5, 40, 8, 4, q, ctx},
      {"H3 L20 R6 bs16", 3, 20, 6, 16, q, ctx},
      {"H40 L32 R16 bs16", 40, 32, 16, 16, {1, 9, 1}, {130, 40, 2}},
      {"H16 L512 R64 bs16", 16, 512, 64, 16, {1, 5, 1}, {70, 20, 3}},  // DeepSeek's latent
  };
}

TEST_P(MlaDtypes, LatentAttentionMatchesReference) {
  const DType dt = param();
  for (const LatCase& c : lat_cases()) {
    const LatBuilt b = build(c, dt);
    EXPECT_TRUE(close_for(dt, values(run_latent(b)), ref_latent(b), c.name));
  }
}

// NaN in blocks no table points at, and in the last row of a prefill chunk,
// reaches no row that cannot see it.
TEST_P(MlaDtypes, LatentAttentionNanStaysWhereItBelongs) {
  const DType dt = param();
  const LatCase c{"nan", 5, 40, 8, 4, {1, 20, 1}, {37, 50, 9}};
  LatBuilt b = build(c, dt, kNaN);
  const int64_t D = c.L + c.R;
  auto poison = [&](int64_t seq, int64_t pos, int64_t col) {
    const int64_t blk = b.tables.data<int32_t>()[seq * b.max_blocks + pos / c.bs];
    b.cache.set((blk * c.bs + pos % c.bs) * D + col, std::numeric_limits<float>::quiet_NaN());
  };
  // Slots past each context in its last block.
  for (int64_t seq = 0; seq < 3; ++seq)
    for (int64_t pos = c.ctx_lens[size_t(seq)]; pos % c.bs; ++pos)
      for (int64_t col = 0; col < D; ++col) poison(seq, pos, col);
  poison(1, 49, 3);  // sequence 1's last chunk row (position 49)
  const auto got = values(run_latent(b)), want = ref_latent(b);
  EXPECT_TRUE(close_for(dt, got, want, "nan"));
  const int64_t HL = c.H * c.L;
  for (int64_t t = 0; t < b.T; ++t)
    EXPECT_EQ(std::isnan(got[size_t(t * HL)]), t == 20) << "row " << t;  // row 20 = sequence 1's last
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlaDtypes,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::ValuesIn(kernel_isas())),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  isa_name(std::get<1>(info.param));
                         });

KS_ISA_SUITE(Mla);

TEST_P(Mla, LatentAttentionThreadCountIndependent) {
  for (const LatCase& c : lat_cases()) {
    const LatBuilt b = build(c, DType::BF16);
    const int saved = num_threads();
    set_num_threads(1);
    const auto one = run_latent(b).to_float_vector();
    set_num_threads(2);
    const auto two = run_latent(b).to_float_vector();
    set_num_threads(saved);
    EXPECT_EQ(one, two) << c.name;
  }
}

TEST_P(Mla, AbsorbThreadCountIndependent) {
  const ops::MlaShape s{6, 64, 16, 8, 12, 0.f};
  for (int64_t T : {3, 40})
    for (DType dt : {DType::F32, DType::BF16}) {
      const Tensor q = random_tensor({T, 6 * 24}, dt, 40), kv_b = random_tensor({6 * 28, 64}, dt, 41, 0.2);
      const Tensor o_lat = random_tensor({T, 6 * 64}, dt, 42);
      auto run = [&](int threads) {
        set_num_threads(threads);
        Tensor q_lat = Tensor::empty({T, 6 * 72}, dt), o = Tensor::empty({T, 6 * 12}, dt);
        ops::mla_absorb_q(q, kv_b, s, q_lat);
        ops::mla_absorb_out(o_lat, kv_b, s, o);
        return std::make_pair(q_lat.to_float_vector(), o.to_float_vector());
      };
      const int saved = num_threads();
      const auto one = run(1), two = run(2);
      set_num_threads(saved);
      EXPECT_EQ(one, two) << "T " << T << " " << dtype_name(dt);
    }
}

// A sequence's rows do not depend on the other sequences of the batch.
TEST_P(Mla, LatentAttentionIndependentOfTheBatch) {
  const LatCase c = lat_cases()[0];
  const LatBuilt all = build(c, DType::F32);
  const auto full = run_latent(all).to_float_vector();
  // Sequence 1 alone, same cache and table row.
  const int64_t HL = c.H * c.L, r0 = c.q_lens[0], n = c.q_lens[1];
  LatBuilt one = all;
  one.T = n;
  one.q_lat = all.q_lat.slice_rows(r0, r0 + n);
  one.cu_q = Tensor::from_ints({0, int32_t(n)}, {2});
  one.seq_lens = Tensor::from_ints({c.ctx_lens[1]}, {1});
  std::vector<int32_t> row(all.tables.data<int32_t>() + all.max_blocks,
                           all.tables.data<int32_t>() + 2 * all.max_blocks);
  one.tables = Tensor::from_ints(row, {1, all.max_blocks});
  const auto alone = run_latent(one).to_float_vector();
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), full.begin() + r0 * HL));
}

TEST_P(Mla, RejectsBadArguments) {
  const LatCase c{"bad", 2, 8, 4, 4, {1, 2}, {3, 5}};
  LatBuilt b = build(c, DType::F32);
  Tensor o = Tensor::empty({b.T, 2 * 8}, DType::F32);
  auto run = [&](const Tensor& tables, const Tensor& sl) {
    ops::paged_latent_attention_fwd(b.q_lat, b.cache, tables, b.cu_q, sl, b.s, o);
  };
  EXPECT_THROW_MSG(run(b.tables, Tensor::from_ints({3, 1}, {2})), "sequence 1 has 2 query rows but a context of 1");
  EXPECT_THROW_MSG(run(b.tables, Tensor::from_ints({3, 9}, {2})), "sequence 1 needs 3 blocks, block_tables has 2");
  std::vector<int32_t> t(b.tables.data<int32_t>(), b.tables.data<int32_t>() + b.tables.numel());
  t[3] = 999;
  EXPECT_THROW_MSG(run(Tensor::from_ints(t, {2, 2}), b.seq_lens), "block_tables[1, 1] = 999 is not a block id");
  ops::MlaShape bad = b.s;
  bad.kv_lora_rank = 0;
  EXPECT_THROW_MSG(ops::paged_latent_attention_fwd(b.q_lat, b.cache, b.tables, b.cu_q, b.seq_lens, bad, o),
                   "bad MlaShape");
  Tensor cache_bf = b.cache.to(DType::BF16);
  EXPECT_THROW_MSG(ops::paged_latent_attention_fwd(b.q_lat, cache_bf, b.tables, b.cu_q, b.seq_lens, b.s, o),
                   "cache must be f32[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim = 12]");
  Tensor o_bad = Tensor::empty({b.T, 2 * 12}, DType::F32);
  EXPECT_THROW_MSG(ops::paged_latent_attention_fwd(b.q_lat, b.cache, b.tables, b.cu_q, b.seq_lens, b.s, o_bad),
                   "o_lat must have shape [3, 16]");
  // The write: slots inside the cache or -1; k_pe fills the row after c_kv.
  const Tensor c_kv = Tensor::zeros({2, 8}, DType::F32), k_pe = Tensor::zeros({2, 4}, DType::F32);
  EXPECT_THROW_MSG(ops::paged_latent_write(c_kv, k_pe, Tensor::from_ints({0, 1000}, {2}), b.cache),
                   "slot 1000 of row 1 is outside the cache");
  EXPECT_THROW_MSG(ops::paged_latent_write(c_kv, k_pe, Tensor::from_ints({0, -2}, {2}), b.cache), "slot -2 of row 1");
  EXPECT_THROW_MSG(ops::paged_latent_write(c_kv, Tensor::zeros({2, 3}, DType::F32), Tensor::from_ints({0, 1}, {2}),
                                           b.cache),
                   "k_pe must have shape [2, 4]");
  // The absorb ops: kv_b is kv_b_proj.weight [H*(nope+v), kv_lora].
  Tensor q = Tensor::zeros({3, 2 * 20}, DType::F32), q_lat = Tensor::empty({3, 2 * 12}, DType::F32);
  EXPECT_THROW_MSG(ops::mla_absorb_q(q, Tensor::zeros({2 * 32, 9}, DType::F32), b.s, q_lat),
                   "kv_b must have shape [64, 8]");
  EXPECT_THROW_MSG(ops::mla_absorb_q(q, Tensor::zeros({64, 8}, DType::F32), b.s, q), "q_lat must have shape [3, 24]");
}

// ------------------------------------------------------------ equivalence --

// The training path: kv = c_kv @ kv_b^T, k_h = [k_nope_h | k_pe], v_h, then
// causal attention with q/k heads of nope+rope and value heads of v.
Tensor decompressed_attention(const Tensor& q, const Tensor& kv_b, const Tensor& c_kv, const Tensor& k_pe,
                              const std::vector<int32_t>& lens, const ops::MlaShape& s) {
  const int64_t T = q.size(0), H = s.n_heads, nope = s.qk_nope_head_dim, R = s.qk_rope_head_dim, V = s.v_head_dim;
  Tensor kv = Tensor::empty({T, H * (nope + V)}, DType::F32);
  ops::linear_fwd(c_kv, kv_b, nullptr, kv);
  Tensor k = Tensor::empty({T, H * (nope + R)}, DType::F32), v = Tensor::empty({T, H * V}, DType::F32);
  ops::copy_head_cols(kv, H, 0, k, H, 0, nope);
  ops::copy_head_cols(k_pe, 1, 0, k, H, nope, R);
  ops::copy_head_cols(kv, H, nope, v, H, 0, V);
  std::vector<int32_t> cu{0};
  for (int32_t l : lens) cu.push_back(cu.back() + l);
  Tensor out = Tensor::empty({T, H * V}, DType::F32), lse = Tensor::empty({H, T}, DType::F32);
  ops::attention_fwd(q, k, v, Tensor::from_ints(cu, {int64_t(cu.size())}), ops::AttentionShape{H, H, nope + R, s.scale, V},
                     out, lse);
  return out;
}

// The rollout path, one step: the step's rows of q (rows [r0, r0 + n) of
// each sequence) against everything written so far.
struct Rollout {
  ops::MlaShape s;
  Tensor kv_b, cache, tables;
  int64_t bs, max_blocks;
  std::vector<int32_t> starts;  // each sequence's first row in the packed inputs
};

// Runs rows [done[b], done[b] + step[b]) of every sequence b: writes their
// latents, attends, projects out; returns [sum step, H*v].
Tensor rollout_step(Rollout& ro, const Tensor& q, const Tensor& c_kv, const Tensor& k_pe,
                    const std::vector<int32_t>& done, const std::vector<int32_t>& step) {
  const ops::MlaShape& s = ro.s;
  const int64_t B = int64_t(step.size());
  std::vector<int32_t> rows, slots, cu{0}, ctx;
  for (int64_t b = 0; b < B; ++b) {
    for (int32_t p = done[size_t(b)]; p < done[size_t(b)] + step[size_t(b)]; ++p) {
      rows.push_back(ro.starts[size_t(b)] + p);
      slots.push_back(ro.tables.data<int32_t>()[b * ro.max_blocks + p / ro.bs] * int32_t(ro.bs) + p % int32_t(ro.bs));
    }
    cu.push_back(cu.back() + step[size_t(b)]);
    ctx.push_back(done[size_t(b)] + step[size_t(b)]);
  }
  const int64_t n = int64_t(rows.size());
  const Tensor idx = make_ids(rows);
  Tensor qs = Tensor::empty({n, q.size(1)}, DType::F32), cs = Tensor::empty({n, c_kv.size(1)}, DType::F32),
         ks = Tensor::empty({n, k_pe.size(1)}, DType::F32);
  ops::gather_rows(q, idx, qs);
  ops::gather_rows(c_kv, idx, cs);
  ops::gather_rows(k_pe, idx, ks);
  Tensor q_lat = Tensor::empty({n, s.n_heads * s.latent_dim()}, DType::F32);
  ops::mla_absorb_q(qs, ro.kv_b, s, q_lat);
  ops::paged_latent_write(cs, ks, make_ids(slots), ro.cache);
  Tensor o_lat = Tensor::empty({n, s.n_heads * s.kv_lora_rank}, DType::F32);
  ops::paged_latent_attention_fwd(q_lat, ro.cache, ro.tables, Tensor::from_ints(cu, {B + 1}), Tensor::from_ints(ctx, {B}),
                                  s, o_lat);
  Tensor o = Tensor::empty({n, s.n_heads * s.v_head_dim}, DType::F32);
  ops::mla_absorb_out(o_lat, ro.kv_b, s, o);
  return o;
}

// For random q, kv_b, c_kv and k_pe the absorbed path equals the decompressed
// one to f32 rounding: whole prompts at once, and the same prompts as a
// chunked prefill followed by one decode row at a time.
TEST_P(Mla, AbsorbedEqualsDecompressedAttention) {
  for (const ops::MlaShape s : {ops::MlaShape{4, 32, 16, 8, 12, 0.f}, ops::MlaShape{2, 128, 32, 16, 24, 0.11f},
                                ops::MlaShape{3, 512, 128, 64, 128, 0.f}}) {
    const std::string name = "H" + std::to_string(s.n_heads) + " L" + std::to_string(s.kv_lora_rank);
    const std::vector<int32_t> lens = {9, 70, 1, 33};
    const int64_t T = std::accumulate(lens.begin(), lens.end(), int64_t(0)), H = s.n_heads;
    const Tensor q = random_tensor({T, H * (s.qk_nope_head_dim + s.qk_rope_head_dim)}, DType::F32, 30);
    const Tensor kv_b = random_tensor({H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank}, DType::F32, 31,
                                      1.0 / std::sqrt(double(s.kv_lora_rank)));
    const Tensor c_kv = random_tensor({T, s.kv_lora_rank}, DType::F32, 32);
    const Tensor k_pe = random_tensor({T, s.qk_rope_head_dim}, DType::F32, 33);
    const auto want = values(decompressed_attention(q, kv_b, c_kv, k_pe, lens, s));

    const int64_t bs = 16, B = int64_t(lens.size());
    Rollout ro{s, kv_b, Tensor(), Tensor(), bs, 0, {}};
    std::vector<int32_t> tables;
    int32_t next = 1;
    for (int32_t l : lens) ro.max_blocks = std::max<int64_t>(ro.max_blocks, (l + bs - 1) / bs);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < ro.max_blocks; ++j, next += 2) tables.push_back(next);  // every other block
    ro.tables = Tensor::from_ints(tables, {B, ro.max_blocks});
    for (int64_t b = 0, r = 0; b < B; r += lens[size_t(b)], ++b) ro.starts.push_back(int32_t(r));
    const Tolerance tol{2e-5, 2e-4};

    // Whole prompts in one step.
    ro.cache = Tensor::zeros({next + 1, bs, s.latent_dim()}, DType::F32);
    const Tensor once = rollout_step(ro, q, c_kv, k_pe, std::vector<int32_t>(size_t(B), 0), lens);
    EXPECT_TRUE(all_close(values(once), want, tol, name + " whole prompts"));

    // A chunked prefill of about half of each prompt, then one decode row per step.
    ro.cache = Tensor::zeros({next + 1, bs, s.latent_dim()}, DType::F32);
    std::vector<int32_t> done(size_t(B), 0), step(size_t(B), 0);
    std::vector<double> got(want.size(), kNaN);
    const int64_t HV = H * s.v_head_dim;
    while (true) {
      int64_t rows = 0;
      for (int64_t b = 0; b < B; ++b) {
        const int32_t left = lens[size_t(b)] - done[size_t(b)];
        step[size_t(b)] = done[size_t(b)] == 0 ? std::max(1, lens[size_t(b)] / 2) : std::min(1, left);
        rows += step[size_t(b)];
      }
      if (rows == 0) break;
      const auto o = values(rollout_step(ro, q, c_kv, k_pe, done, step));
      for (int64_t b = 0, at = 0; b < B; ++b)
        for (int32_t p = done[size_t(b)]; p < done[size_t(b)] + step[size_t(b)]; ++p, ++at)
          std::copy(o.begin() + at * HV, o.begin() + (at + 1) * HV, got.begin() + (ro.starts[size_t(b)] + p) * HV);
      for (int64_t b = 0; b < B; ++b) done[size_t(b)] += step[size_t(b)];
    }
    EXPECT_TRUE(all_close(got, want, tol, name + " chunked prefill + decode"));
  }
}

}  // namespace
}  // namespace kestrel
