// MLA decode on CPU: the paged latent attention (ops::paged_latent_attention_fwd,
// the rollout's absorbed-weight attention over the [c_kv | k_pe] cache) against
// ops::paged_attention_fwd of a GQA model with the same number of query heads,
// one decode row per sequence, at contexts 1k and 4k. Wall time of the best
// of --reps calls after one warm-up, per kernel ISA level (--isa, default all
// the machine runs) and thread count.
//
// Shapes (defaults): MLA as DeepSeek-V2-Lite / V3 per head (kv_lora 512,
// rope 64, nope 128, v 128) with 16 query heads (V3's 128 heads over tp 8);
// GQA with 16 query heads, --kv 4 kv heads of head_dim 128. Block size 16,
// shuffled block tables, random cache.
// Rows:
//   mla        paged_latent_attention_fwd alone
//   mla+absorb mla_absorb_q + paged_latent_attention_fwd + mla_absorb_out (the
//              whole absorbed step; kv_b_proj in the cache's dtype)
//   gqa        paged_attention_fwd
// cache B/tok: bytes per token and layer of the cache (MLA: kv_lora + rope
// values; GQA: 2 * kv_heads * head_dim). GF/s counts the attended (query, key)
// pairs: 2*(kv_lora+rope + kv_lora) FLOPs per pair and head for MLA, 4*head_dim
// for GQA (the absorb GEMMs not counted).
// Usage: bench_mla_attention_bench [--seqs 8] [--ctx 1024,4096] [--heads 16] [--kv 4] [--dim 128]
//        [--lora 512] [--rope 64] [--nope 128] [--vdim 128] [--threads 1,2] [--reps 10]
//        [--dtype bf16|f32|both] [--isa all|avx2,avx512] [--only mla|mla+absorb|gqa]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_isa.h"
#include "bench_timing.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "core/status.h"
#include "ops/mla.h"
#include "ops/paged_attention.h"

using namespace kestrel;

namespace {

Tensor randn(Shape s, DType dt, uint64_t stream, float scale = 1.f) {
  Tensor t = Tensor::empty(std::move(s), DType::F32);
  Philox rng{42, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * rng.normal(uint64_t(i)));
  return dt == DType::F32 ? t : t.to(dt);
}

std::vector<int> parse_ints(const char* v) {
  std::vector<int> out;
  for (const char* p = v; *p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p))
    out.push_back(std::atoi(p));
  return out;
}

struct Options {
  int64_t seqs = 8, heads = 16, kv = 4, dim = 128, lora = 512, rope = 64, nope = 128, vdim = 128, bs = 16;
  std::vector<int> ctx{1024, 4096}, threads{1, 2};
  std::vector<DType> dtypes{DType::BF16, DType::F32};
  std::vector<IsaLevel> isas;
  std::string only;
  int reps = 10;
};

// B decode rows at context ctx: shuffled block tables over blocks 1.. (block 0
// unused, like the engine's null block).
struct Batch {
  Tensor tables, cu_q, seq_lens;
  int64_t num_blocks = 0;
};
Batch decode_batch(int64_t B, int64_t ctx, int64_t bs) {
  const int64_t nb = (ctx + bs - 1) / bs;
  std::vector<int32_t> ids(size_t(B * nb));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937 g(3);
  std::shuffle(ids.begin(), ids.end(), g);
  std::vector<int32_t> cu(size_t(B + 1));
  std::iota(cu.begin(), cu.end(), 0);
  Batch b;
  b.num_blocks = B * nb + 1;
  b.tables = Tensor::from_ints(ids, {B, nb});
  b.cu_q = Tensor::from_ints(cu, {B + 1});
  b.seq_lens = Tensor::from_ints(std::vector<int32_t>(size_t(B), int32_t(ctx)), {B});
  return b;
}

void print_row(const char* name, DType dt, IsaLevel isa, int64_t B, int64_t ctx, int nt, double s, double flops,
               double cache_bytes) {
  std::printf("%-11s %-5s %-7s %5lld %6lld %7d %10.1f %9.1f %8.2f %11.0f\n", name, dtype_name(dt), isa_name(isa),
              (long long)B, (long long)ctx, nt, s * 1e6, s * 1e6 / double(B), flops / s * 1e-9, cache_bytes);
}

void run_ctx(const Options& o, int64_t ctx, DType dt) {
  const int64_t B = o.seqs, H = o.heads, D = o.lora + o.rope;
  const Batch bt = decode_batch(B, ctx, o.bs);
  const double pairs = double(B) * double(ctx);
  const double es = double(dtype_size(dt));
  // MLA: the latent cache, q_lat and kv_b_proj.
  const ops::MlaShape ms{H, o.lora, o.nope, o.rope, o.vdim, 0.f};
  const Tensor cache = randn({bt.num_blocks, o.bs, D}, dt, 1);
  const Tensor q = randn({B, H * (o.nope + o.rope)}, dt, 2);
  const Tensor kv_b = randn({H * (o.nope + o.vdim), o.lora}, dt, 3, 0.05f);
  Tensor q_lat = randn({B, H * D}, dt, 4, 0.05f), o_lat = Tensor::empty({B, H * o.lora}, dt),
         out_mla = Tensor::empty({B, H * o.vdim}, dt);
  // GQA: K/V caches of the same block geometry.
  const Tensor kc = randn({bt.num_blocks, o.bs, o.kv, o.dim}, dt, 5), vc = randn({bt.num_blocks, o.bs, o.kv, o.dim}, dt, 6);
  const Tensor qg = randn({B, H * o.dim}, dt, 7, 0.1f);
  Tensor out_gqa = Tensor::empty({B, H * o.dim}, dt);
  const ops::AttentionShape gs{H, o.kv, o.dim, 0.f};
  const double mla_flops = 2.0 * double(D + o.lora) * double(H) * pairs, gqa_flops = 4.0 * double(o.dim) * double(H) * pairs;
  const double mla_bytes = double(D) * es, gqa_bytes = 2.0 * double(o.kv * o.dim) * es;
  for (int nt : o.threads)
    for (IsaLevel isa : o.isas) {
      set_num_threads(nt);
      set_kernel_isa(isa);
      auto want = [&](const char* n) { return o.only.empty() || o.only == n; };
      if (want("mla")) {
        const double s = bench::time_best(
            [&] { ops::paged_latent_attention_fwd(q_lat, cache, bt.tables, bt.cu_q, bt.seq_lens, ms, o_lat); }, o.reps, 1)
                             .wall;
        print_row("mla", dt, isa, B, ctx, nt, s, mla_flops, mla_bytes);
      }
      if (want("mla+absorb")) {
        const double s = bench::time_best(
                             [&] {
                               ops::mla_absorb_q(q, kv_b, ms, q_lat);
                               ops::paged_latent_attention_fwd(q_lat, cache, bt.tables, bt.cu_q, bt.seq_lens, ms, o_lat);
                               ops::mla_absorb_out(o_lat, kv_b, ms, out_mla);
                             },
                             o.reps, 1)
                             .wall;
        print_row("mla+absorb", dt, isa, B, ctx, nt, s, mla_flops, mla_bytes);
      }
      if (want("gqa")) {
        const double s = bench::time_best(
            [&] { ops::paged_attention_fwd(qg, kc, vc, bt.tables, bt.cu_q, bt.seq_lens, gs, out_gqa); }, o.reps, 1)
                             .wall;
        print_row("gqa", dt, isa, B, ctx, nt, s, gqa_flops, gqa_bytes);
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.isas = bench::parse_isas("all");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--seqs") o.seqs = std::atoll(v);
    else if (a == "--ctx") o.ctx = parse_ints(v);
    else if (a == "--heads") o.heads = std::atoll(v);
    else if (a == "--kv") o.kv = std::atoll(v);
    else if (a == "--dim") o.dim = std::atoll(v);
    else if (a == "--lora") o.lora = std::atoll(v);
    else if (a == "--rope") o.rope = std::atoll(v);
    else if (a == "--nope") o.nope = std::atoll(v);
    else if (a == "--vdim") o.vdim = std::atoll(v);
    else if (a == "--threads") o.threads = parse_ints(v);
    else if (a == "--reps") o.reps = std::atoi(v);
    else if (a == "--only") o.only = v;
    else if (a == "--isa") {
      o.isas = bench::parse_isas(v);
      if (o.isas.empty()) return 2;
    } else if (a == "--dtype") {
      const std::string d = v;
      o.dtypes = d == "f32" ? std::vector<DType>{DType::F32}
                 : d == "bf16" ? std::vector<DType>{DType::BF16} : std::vector<DType>{DType::BF16, DType::F32};
    } else {
      std::fprintf(stderr, "unknown option %s (see the usage line at the top of bench/mla_attention_bench.cpp)\n",
                   a.c_str());
      return 2;
    }
  }
  std::printf("%s\n", cpu_summary().c_str());
  std::printf("decode, one row per sequence; MLA: %lld heads, kv_lora %lld, rope %lld (nope %lld, v %lld); "
              "GQA: %lld heads, %lld kv heads, head_dim %lld; block size %lld; best of %d calls\n",
              (long long)o.heads, (long long)o.lora, (long long)o.rope, (long long)o.nope, (long long)o.vdim,
              (long long)o.heads, (long long)o.kv, (long long)o.dim, (long long)o.bs, o.reps);
  std::printf("%-11s %-5s %-7s %5s %6s %7s %10s %9s %8s %9s\n", "case", "dtype", "isa", "seqs", "ctx", "threads", "us",
              "us/seq", "GF/s", "cache B/tok");
  try {
    for (DType dt : o.dtypes)
      for (int ctx : o.ctx) run_ctx(o, ctx, dt);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
