// Causal GQA flash attention on CPU: forward and forward+backward time and
// GFLOP/s at 1 and 2 threads, for each kernel ISA level (--isa, default all
// the machine runs: avx2 and avx512 interleaved per case).
//
// Default: the long-sequence training shape (T=2048 packed as 4 sequences of
// 512, 8 heads, 2 kv heads, head_dim 64), f32 and bf16.
// --len A..B: random lengths in [A, B] (the RL shape: many short sequences).
// --groups G --prefix P --branches N: GRPO groups instead of --seqs sequences:
// each group is a P-row prompt prefix and N responses of --len rows, measured
// twice: "dup" packs each response with its own copy of the prefix (what the
// trainer did before prefix sharing), "shared" packs the prefix once and
// passes prefix_of so the responses attend to it.
//   RL shape:   --seqs 70 --len 48..100 --heads 4 --kv 2 --dim 32 --dtype f32
//   RL groups:  --groups 16 --prefix 48 --branches 8 --len 40..56 --heads 4 --kv 2 --dim 32 --dtype f32
// --vdim V: value heads of V columns (AttentionShape::v_head_dim; default
// --dim), e.g. the MLA training shape: --heads 16 --kv 16 --dim 192 --vdim 128.
// --block: ring context parallelism's block kernels (ops::attention_block_fwd,
// attention_merge, attention_block_bwd) on a zigzag CP2 split of the same
// sequences (each cut into 4 chunks; rank r holds chunks r and 3-r), both
// ranks and both ring steps run one after the other in this process, against
// the full attention kernel: the same attended pairs, so the same FLOPs, and
// the ratio is the block path's overhead (row gathers, partly visible tiles,
// the merges; the backward's accumulations). Lengths are rounded down to a
// multiple of 4. RL long-response shape: --block 1 --seqs 2 --len 4096 --heads 8 --kv 2 --dim 128
// FLOPs count only the (query, key) pairs that are attended: forward
// 2*(dim + vdim) per pair and head (QK^T, PV; 4*dim when they are equal);
// backward 2.5x forward (S recompute, dV, dP, dQ, dK).
// Usage: bench_attention_bench [--seqs 4] [--len 512|A..B] [--groups G --prefix P --branches N] [--block 1]
//        [--heads 8] [--kv 2] [--dim 64] [--vdim 64] [--threads 1,2] [--dtype f32|bf16|both]
//        [--isa all|avx2,avx512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "bench_isa.h"
#include "bench_timing.h"
#include "core/status.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "ops/attention.h"

using namespace kestrel;

namespace {

Tensor randn(Shape s, DType dt, uint64_t stream) {
  Tensor t = Tensor::empty(std::move(s), dt);
  Philox rng{42, stream};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.normal(uint64_t(i)));
  return t;
}

using bench::Timing;
using bench::time_best;

// One packing: cu_seqlens, optional prefix_of, and the attended pair count.
struct Layout {
  explicit Layout(std::string n) : name(std::move(n)) {}
  std::string name;
  std::vector<int32_t> cu{0}, prefix_of;  // prefix_of empty = none
  double pairs = 0;
  void add(int32_t len, int32_t prefix_seq = -1) {
    const double pl = prefix_seq >= 0 ? double(cu[prefix_seq + 1] - cu[prefix_seq]) : 0.0;
    pairs += double(len) * (double(len) + 1) / 2 + double(len) * pl;
    cu.push_back(cu.back() + len);
    if (prefix_seq >= 0 || !prefix_of.empty()) prefix_of.resize(cu.size() - 2, -1), prefix_of.push_back(prefix_seq);
  }
  int64_t T() const { return cu.back(); }
  int64_t n() const { return int64_t(cu.size()) - 1; }
};

void run_layout(const Layout& lay, int64_t heads, int64_t kv, int64_t dim, int64_t vdim, const std::vector<DType>& dtypes,
                const std::vector<int>& threads, const std::vector<IsaLevel>& isas, int reps) {
  const int64_t T = lay.T();
  const Tensor cu_t = Tensor::from_ints(lay.cu, {lay.n() + 1});
  Tensor pre_t;
  if (!lay.prefix_of.empty()) pre_t = Tensor::from_ints(lay.prefix_of, {lay.n()});
  const Tensor* pre = lay.prefix_of.empty() ? nullptr : &pre_t;
  const ops::AttentionShape shape{heads, kv, dim, 0.f, vdim};
  const double fwd_flops = 2.0 * double(dim + vdim) * lay.pairs * double(heads), fb_flops = fwd_flops * 3.5;
  std::printf("%s: T=%lld in %lld sequences, heads=%lld, kv_heads=%lld, head_dim=%lld, v_head_dim=%lld\n",
              lay.name.c_str(), (long long)T, (long long)lay.n(), (long long)heads, (long long)kv, (long long)dim,
              (long long)vdim);
  for (DType dt : dtypes) {
    const Tensor q = randn({T, heads * dim}, dt, 1), k = randn({T, kv * dim}, dt, 2), v = randn({T, kv * vdim}, dt, 3);
    const Tensor dout = randn({T, heads * vdim}, dt, 4);
    Tensor out = Tensor::empty(dout.shape(), dt), lse = Tensor::empty({heads, T}, DType::F32);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
    for (int nt : threads)
      for (IsaLevel isa : isas) {
        set_num_threads(nt);
        set_kernel_isa(isa);
        try {
          const Timing tf = time_best([&] { ops::attention_fwd(q, k, v, cu_t, shape, out, lse, pre); }, reps, nt);
          const Timing tfb = time_best(
              [&] {
                ops::attention_fwd(q, k, v, cu_t, shape, out, lse, pre);
                ops::attention_bwd(q, k, v, out, lse, dout, cu_t, shape, dq, dk, dv, pre);
              },
              reps, nt);
          std::printf("%-6s %-7s %-8d %9.3f %8.1f [%7.1f] %11.3f %8.1f [%7.1f]\n", dtype_name(dt), isa_name(isa), nt,
                      tf.wall * 1e3, fwd_flops / tf.wall * 1e-9, fwd_flops / tf.cpu * 1e-9, tfb.wall * 1e3,
                      fb_flops / tfb.wall * 1e-9, fb_flops / tfb.cpu * 1e-9);
        } catch (const Error& e) {
          std::printf("%-6s %-7s %-8d %s\n", dtype_name(dt), isa_name(isa), nt, e.what());
        }
      }
  }
}

// Rows of rank r of a zigzag CP2 split of the sequences of cu (lengths
// multiples of 4): per sequence chunks r and 3 - r, with their positions.
struct RankRows {
  std::vector<int32_t> cu{0}, pos;
};
RankRows zigzag_cp2(const std::vector<int32_t>& cu, int r) {
  RankRows rr;
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int32_t c = (cu[b + 1] - cu[b]) / 4;
    for (int chunk : {r, 3 - r})
      for (int32_t i = 0; i < c; ++i) rr.pos.push_back(chunk * c + i);
    rr.cu.push_back(int32_t(rr.pos.size()));
  }
  return rr;
}

// --block: the full kernel on the packed sequences, then the CP2 ring's block
// kernels on the same sequences (both ranks' work in this process).
void run_block(const Layout& lay, int64_t heads, int64_t kv, int64_t dim, int64_t vdim,
               const std::vector<DType>& dtypes, const std::vector<int>& threads, const std::vector<IsaLevel>& isas,
               int reps) {
  const ops::AttentionShape shape{heads, kv, dim, 0.f, vdim};
  const RankRows rank[2] = {zigzag_cp2(lay.cu, 0), zigzag_cp2(lay.cu, 1)};
  const int64_t Tr = int64_t(rank[0].pos.size());
  // Each ring step of rank r: the local queries against the block of rank (r - step) mod 2.
  ops::AttentionBlock blk[2][2];
  double pairs = 0;
  for (int r = 0; r < 2; ++r)
    for (int step = 0; step < 2; ++step) {
      const RankRows &q = rank[r], &k = rank[(r + 2 - step) % 2];
      blk[r][step] = {Tensor::from_ints(q.cu, {int64_t(q.cu.size())}), Tensor::from_ints(k.cu, {int64_t(k.cu.size())}),
                      Tensor::from_ints(q.pos, {Tr}), Tensor::from_ints(k.pos, {Tr})};
      for (size_t b = 0; b + 1 < q.cu.size(); ++b)
        for (int32_t i = q.cu[b]; i < q.cu[b + 1]; ++i)
          for (int32_t j = k.cu[b]; j < k.cu[b + 1]; ++j) pairs += k.pos[size_t(j)] <= q.pos[size_t(i)] ? 1 : 0;
    }
  if (pairs != lay.pairs) KS_FAIL("zigzag split attends ", pairs, " pairs, the full kernel ", lay.pairs);
  const double fwd_flops = 2.0 * double(dim + vdim) * pairs * double(heads), fb_flops = fwd_flops * 3.5;
  std::printf("zigzag CP2 blocks (2 ranks x 2 ring steps, T=%lld per rank, out/lse merged in f32; same pairs as the "
              "full kernel)\n",
              (long long)Tr);
  for (DType dt : dtypes) {
    Tensor q[2], k[2], v[2], dout[2], acc[2], acc_lse[2], dq[2];
    Tensor out_b = Tensor::empty({Tr, heads * vdim}, DType::F32), lse_b = Tensor::empty({heads, Tr}, DType::F32);
    Tensor dk = Tensor::empty({Tr, kv * dim}, DType::F32), dv = Tensor::empty({Tr, kv * vdim}, DType::F32);
    for (int r = 0; r < 2; ++r) {
      q[r] = randn({Tr, heads * dim}, dt, 10 + r);
      k[r] = randn({Tr, kv * dim}, dt, 20 + r);
      v[r] = randn({Tr, kv * vdim}, dt, 30 + r);
      dout[r] = randn({Tr, heads * vdim}, DType::F32, 40 + r);
      acc[r] = Tensor::empty({Tr, heads * vdim}, DType::F32);
      acc_lse[r] = Tensor::empty({heads, Tr}, DType::F32);
      dq[r] = Tensor::empty({Tr, heads * dim}, DType::F32);
    }
    auto forward = [&] {
      for (int r = 0; r < 2; ++r) {
        ops::attention_block_fwd(q[r], k[r], v[r], blk[r][0], shape, acc[r], acc_lse[r]);  // step 0 starts the sum
        ops::attention_block_fwd(q[r], k[1 - r], v[1 - r], blk[r][1], shape, out_b, lse_b);
        ops::attention_merge(acc[r], acc_lse[r], out_b, lse_b);
      }
    };
    auto backward = [&] {
      for (int r = 0; r < 2; ++r) {
        dq[r].zero_();
        for (int step = 0; step < 2; ++step) {
          const int kr = (r + 2 - step) % 2;
          ops::attention_block_bwd(q[r], k[kr], v[kr], acc[r], acc_lse[r], dout[r], blk[r][step], shape, dq[r], dk,
                                   dv);
        }
      }
    };
    for (int nt : threads)
      for (IsaLevel isa : isas) {
        set_num_threads(nt);
        set_kernel_isa(isa);
        const Timing tf = time_best(forward, reps, nt);
        const Timing tfb = time_best([&] { forward(); backward(); }, reps, nt);
        std::printf("%-6s %-7s %-8d %9.3f %8.1f [%7.1f] %11.3f %8.1f [%7.1f]\n", dtype_name(dt), isa_name(isa), nt,
                    tf.wall * 1e3, fwd_flops / tf.wall * 1e-9, fwd_flops / tf.cpu * 1e-9, tfb.wall * 1e3,
                    fb_flops / tfb.wall * 1e-9, fb_flops / tfb.cpu * 1e-9);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seqs = 4, len_lo = 512, len_hi = 512, heads = 8, kv = 2, dim = 64, vdim = 0, groups = 0, prefix = 0,
          branches = 0, block = 0;
  std::vector<int> threads{1, 2};
  std::vector<DType> dtypes{DType::F32, DType::BF16};
  std::vector<IsaLevel> isas = bench::parse_isas("all");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--seqs") seqs = std::atoll(v);
    else if (a == "--len") {
      len_lo = len_hi = std::atoll(v);
      if (const char* dots = std::strstr(v, "..")) len_hi = std::atoll(dots + 2);
    } else if (a == "--groups") groups = std::atoll(v);
    else if (a == "--prefix") prefix = std::atoll(v);
    else if (a == "--branches") branches = std::atoll(v);
    else if (a == "--block") block = std::atoll(v);
    else if (a == "--heads") heads = std::atoll(v);
    else if (a == "--kv") kv = std::atoll(v);
    else if (a == "--dim") dim = std::atoll(v);
    else if (a == "--vdim") vdim = std::atoll(v);
    else if (a == "--isa") {
      isas = bench::parse_isas(v);
      if (isas.empty()) return 2;
    }
    else if (a == "--dtype") {
      const std::string d = v;
      dtypes = d == "f32" ? std::vector<DType>{DType::F32}
               : d == "bf16" ? std::vector<DType>{DType::BF16} : std::vector<DType>{DType::F32, DType::BF16};
    } else if (a == "--threads") {
      threads.clear();
      for (const char* p = v; *p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p))
        threads.push_back(std::atoi(p));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (len_hi < len_lo || len_lo < 1) {
    std::fprintf(stderr, "--len must be N or A..B with 1 <= A <= B\n");
    return 2;
  }
  if (vdim <= 0) vdim = dim;
  const Philox rng{7, 0};
  uint64_t draw = 0;
  auto length = [&] { return int32_t(len_lo + int64_t(rng.uniform(draw++) * float(len_hi - len_lo + 1))); };
  std::printf("GF/s from wall time; in brackets from CPU time per thread (immune to a busy machine)\n");
  std::printf("%s\n", cpu_summary().c_str());
  std::printf("%-6s %-7s %-8s %9s %18s %11s %18s\n", "dtype", "isa", "threads", "fwd ms", "fwd GF/s", "f+b ms", "fwd+bwd GF/s");
  if (groups > 0) {
    Layout dup{"dup (prefix copied into each response)"}, shared{"shared (prefix_of)"};
    for (int64_t g = 0; g < groups; ++g) {
      // The prefix holds the prompt minus its last token; that token leads each branch.
      const int32_t root = int32_t(shared.n());
      shared.add(int32_t(prefix));
      for (int64_t b = 0; b < branches; ++b) {
        const int32_t L = length();
        dup.add(int32_t(prefix) + L);
        shared.add(L, root);
      }
    }
    const int reps = 5;
    run_layout(dup, heads, kv, dim, vdim, dtypes, threads, isas, reps);
    run_layout(shared, heads, kv, dim, vdim, dtypes, threads, isas, reps);
  } else if (block) {
    Layout plain{"full kernel (attention_fwd/bwd)"};
    for (int64_t b = 0; b < seqs; ++b) plain.add(std::max<int32_t>(4, (len_lo == len_hi ? int32_t(len_lo) : length()) / 4 * 4));
    run_layout(plain, heads, kv, dim, vdim, dtypes, threads, isas, 5);
    run_block(plain, heads, kv, dim, vdim, dtypes, threads, isas, 5);
  } else {
    Layout plain{len_lo == len_hi ? "uniform" : "random lengths"};
    for (int64_t b = 0; b < seqs; ++b) plain.add(len_lo == len_hi ? int32_t(len_lo) : length());
    run_layout(plain, heads, kv, dim, vdim, dtypes, threads, isas, 5);
  }
  return 0;
}
