// Causal GQA flash attention on CPU: forward and forward+backward GFLOP/s for
// the training shape (T=2048 packed as 4 sequences of 512, 8 heads, 2 kv
// heads, head_dim 64) at 1 and 2 threads, f32 and bf16.
// FLOPs count the causal half only: forward 4*d per (query, key<=query) pair
// and head (QK^T, PV); backward 2.5x forward (S recompute, dV, dP, dQ, dK).
// Usage: bench_attention_bench [--seqs 4] [--len 512] [--heads 8] [--kv 2] [--dim 64] [--threads 1,2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <ctime>
#include <vector>

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

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Timing { double wall, cpu; };  // seconds; cpu = process CPU time / threads
// Best of `reps` runs after one warm-up call. On a shared machine the wall
// time includes time descheduled; the CPU time per thread does not.
template <class F>
Timing time_best(F&& f, int reps, int threads) {
  f();
  Timing best{1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    f();
    best.cpu = std::min(best.cpu, (cpu_seconds() - c0) / threads);
    best.wall = std::min(best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seqs = 4, len = 512, heads = 8, kv = 2, dim = 64;
  std::vector<int> threads{1, 2};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--seqs") seqs = std::atoll(v);
    else if (a == "--len") len = std::atoll(v);
    else if (a == "--heads") heads = std::atoll(v);
    else if (a == "--kv") kv = std::atoll(v);
    else if (a == "--dim") dim = std::atoll(v);
    else if (a == "--threads") {
      threads.clear();
      for (const char* p = v; *p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p))
        threads.push_back(std::atoi(p));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int64_t T = seqs * len;
  std::vector<int32_t> cu;
  for (int64_t b = 0; b <= seqs; ++b) cu.push_back(int32_t(b * len));
  const Tensor cu_t = Tensor::from_ints(cu, {seqs + 1});
  const ops::AttentionShape shape{heads, kv, dim, 0.f};
  const double pairs = double(seqs) * double(len) * double(len + 1) / 2;
  const double fwd_flops = 4.0 * dim * pairs * heads, fb_flops = fwd_flops * 3.5;
  std::printf("attention: T=%lld (%lld x %lld), heads=%lld, kv_heads=%lld, head_dim=%lld, causal\n", (long long)T,
              (long long)seqs, (long long)len, (long long)heads, (long long)kv, (long long)dim);
  std::printf("GF/s from wall time; in brackets from CPU time per thread (immune to a busy machine)\n");
  std::printf("%-6s %-8s %9s %18s %11s %18s\n", "dtype", "threads", "fwd ms", "fwd GF/s", "f+b ms", "fwd+bwd GF/s");
  for (DType dt : {DType::F32, DType::BF16}) {
    const Tensor q = randn({T, heads * dim}, dt, 1), k = randn({T, kv * dim}, dt, 2), v = randn({T, kv * dim}, dt, 3);
    const Tensor dout = randn({T, heads * dim}, dt, 4);
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({heads, T}, DType::F32);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
    for (int nt : threads) {
      set_num_threads(nt);
      const Timing tf = time_best([&] { ops::attention_fwd(q, k, v, cu_t, shape, out, lse); }, 5, nt);
      const Timing tfb = time_best(
          [&] {
            ops::attention_fwd(q, k, v, cu_t, shape, out, lse);
            ops::attention_bwd(q, k, v, out, lse, dout, cu_t, shape, dq, dk, dv);
          },
          3, nt);
      std::printf("%-6s %-8d %9.2f %8.1f [%7.1f] %11.2f %8.1f [%7.1f]\n", dtype_name(dt), nt, tf.wall * 1e3,
                  fwd_flops / tf.wall * 1e-9, fwd_flops / tf.cpu * 1e-9, tfb.wall * 1e3, fb_flops / tfb.wall * 1e-9,
                  fb_flops / tfb.cpu * 1e-9);
    }
  }
  return 0;
}
