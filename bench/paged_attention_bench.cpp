// Paged attention (the rollout engine's attention) on CPU: wall time and
// GF/s of ops::paged_attention_fwd at 1 and 2 threads and each kernel ISA
// level (--isa, default all the machine runs, interleaved per case), best of
// --reps calls after one warm-up call.
//
// Cases (block_size 16, random shuffled block tables, random cache):
//   decode      128 sequences x 1 query row, context uniform in 50..130,
//               heads 4, kv heads 2, head_dim 32 (the RL tiny model), f32
//   decode-bf16 the same with bf16 q / cache / out
//   prefill     16 sequences of 50 new rows with no cached prefix and 16 of
//               50 new rows after a 48-token cached prefix (tiny model, f32)
//   decode-big  64 sequences x 1 row at context 384, heads 8, kv heads 2,
//               head_dim 64 (bench/configs/small.json, the rollout bench)
// FLOPs count only the attended (query, key) pairs: 4*head_dim per pair and head.
// --hot 1: all sequences share one set of blocks, so K/V stay in cache (the
// compute rate alone; such rows are marked with *).
// Usage: bench_paged_attention_bench [--threads 1,2] [--reps 50] [--only NAME] [--hot 0|1]
//        [--isa all|avx2,avx512]
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
#include "ops/paged_attention.h"

using namespace kestrel;

namespace {

Tensor randn(Shape s, DType dt, uint64_t stream) {
  Tensor t = Tensor::empty(std::move(s), DType::F32);
  Philox rng{42, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.normal(uint64_t(i)));
  return dt == DType::F32 ? t : t.to(dt);
}

struct Case {
  std::string name;
  int64_t H, Hkv, d, bs;
  DType dt;
  std::vector<int32_t> q_lens, ctx_lens;  // per sequence
};

using bench::time_best;

// hot: every sequence reads the same blocks (cache-resident K/V: the
// kernel's compute rate without the memory traffic of a real batch).
void run_case(const Case& c, const std::vector<int>& threads, const std::vector<IsaLevel>& isas, int reps, bool hot) {
  const int64_t B = int64_t(c.q_lens.size());
  int64_t T = 0, max_blocks = 0, total_blocks = 0;
  double pairs = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nb = (c.ctx_lens[size_t(b)] + c.bs - 1) / c.bs;
    T += c.q_lens[size_t(b)];
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
    const double nq = c.q_lens[size_t(b)], ctx = c.ctx_lens[size_t(b)];
    pairs += nq * (ctx - nq) + nq * (nq + 1) / 2;
  }
  const int64_t num_blocks = total_blocks + 1;  // block 0 stays unused, like the engine's null block
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks));
  std::iota(ids.begin(), ids.end(), 1);
  std::mt19937 g(3);
  std::shuffle(ids.begin(), ids.end(), g);
  std::vector<int32_t> tables(size_t(B * max_blocks), 0), cu(size_t(B + 1), 0);
  size_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t nb = (c.ctx_lens[size_t(b)] + c.bs - 1) / c.bs;
    for (int64_t j = 0; j < nb; ++j) tables[size_t(b * max_blocks + j)] = hot ? int32_t(j + 1) : ids[next++];
    cu[size_t(b + 1)] = cu[size_t(b)] + c.q_lens[size_t(b)];
  }
  const Tensor bt = Tensor::from_ints(tables, {B, max_blocks}), cu_t = Tensor::from_ints(cu, {B + 1}),
               sl = Tensor::from_ints(c.ctx_lens, {B});
  const Tensor q = randn({T, c.H * c.d}, c.dt, 1), kc = randn({num_blocks, c.bs, c.Hkv, c.d}, c.dt, 2),
               vc = randn({num_blocks, c.bs, c.Hkv, c.d}, c.dt, 3);
  Tensor out = Tensor::empty({T, c.H * c.d}, c.dt);
  const ops::AttentionShape shape{c.H, c.Hkv, c.d, 0.f};
  const double flops = 4.0 * double(c.d) * double(c.H) * pairs;
  for (int nt : threads)
    for (IsaLevel isa : isas) {
      set_num_threads(nt);
      set_kernel_isa(isa);
      const double s = time_best([&] { ops::paged_attention_fwd(q, kc, vc, bt, cu_t, sl, shape, out); }, reps, 1).wall;
      std::printf("%-12s%s %-5s %-7s %7lld %8lld %3lld/%lld/%-3lld %7d %10.1f %8.2f\n", c.name.c_str(), hot ? "*" : " ",
                  dtype_name(c.dt), isa_name(isa), (long long)B, (long long)T, (long long)c.H, (long long)c.Hkv,
                  (long long)c.d, nt, s * 1e6, flops / s * 1e-9);
    }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads{1, 2};
  int reps = 50;
  std::string only;
  bool hot = false;
  std::vector<IsaLevel> isas = bench::parse_isas("all");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--reps") reps = std::atoi(v);
    else if (a == "--only") only = v;
    else if (a == "--hot") hot = std::atoi(v) != 0;
    else if (a == "--isa") {
      isas = bench::parse_isas(v);
      if (isas.empty()) return 2;
    }
    else if (a == "--threads") {
      threads.clear();
      for (const char* p = v; *p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p))
        threads.push_back(std::atoi(p));
    } else {
      std::fprintf(stderr, "unknown option %s (options: --threads 1,2 --reps N --only NAME --hot 0|1 --isa all|avx2,avx512)\n", a.c_str());
      return 2;
    }
  }
  const Philox rng{7, 0};
  uint64_t draw = 0;
  auto uniform = [&](int32_t lo, int32_t hi) { return int32_t(lo + int32_t(rng.uniform(draw++) * float(hi - lo + 1))); };

  std::vector<Case> cases;
  Case dec{"decode", 4, 2, 32, 16, DType::F32, {}, {}};
  for (int i = 0; i < 128; ++i) dec.q_lens.push_back(1), dec.ctx_lens.push_back(std::min(130, uniform(50, 130)));
  cases.push_back(dec);
  Case dec16 = dec;
  dec16.name = "decode-bf16";
  dec16.dt = DType::BF16;
  cases.push_back(dec16);
  Case pre{"prefill", 4, 2, 32, 16, DType::F32, {}, {}};
  for (int i = 0; i < 16; ++i) pre.q_lens.push_back(50), pre.ctx_lens.push_back(50);
  for (int i = 0; i < 16; ++i) pre.q_lens.push_back(50), pre.ctx_lens.push_back(98);
  cases.push_back(pre);
  Case big{"decode-big", 8, 2, 64, 16, DType::F32, {}, {}};
  for (int i = 0; i < 64; ++i) big.q_lens.push_back(1), big.ctx_lens.push_back(384);
  cases.push_back(big);

  std::printf("%s\n", cpu_summary().c_str());
  std::printf("best of %d calls; GF/s counts 4*head_dim FLOPs per attended (query, key) pair and head\n", reps);
  std::printf("%-13s %-5s %-7s %7s %8s %-9s %7s %10s %8s\n", "case", "dtype", "isa", "seqs", "q rows", "H/Hkv/d", "threads",
              "us", "GF/s");
  for (const Case& c : cases)
    if (only.empty() || only == c.name) run_case(c, threads, isas, reps, hot);
  return 0;
}
