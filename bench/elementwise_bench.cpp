// Elementwise and row kernels on CPU: swiglu, rmsnorm, rope, logprob_entropy
// and add, forward and backward, f32 and bf16, at 1 and 2 threads, for each
// kernel ISA level (--isa, default all the machine runs, interleaved per case).
// Shapes: "rl" is the RL job of `kestrel train` with the built-in tiny model
// (T=6000 rows, hidden 128, ffn 384, 4 heads / 2 kv heads of 32, the built-in
// arith tokenizer's vocabulary); "large" is a Qwen2.5-0.5B-sized layer over
// 512 rows (hidden 896, ffn 4864, 14 / 2 heads of 64, vocab 151936).
// Reported: best-of-N wall time, ns per element of the kernel's main buffer,
// and GB/s of the bytes it must move (each input read once, each output
// written once), from wall time and, in brackets, from CPU time per thread.
// Usage: bench_elementwise_bench [--shape rl|large|both] [--threads 1,2] [--reps 7] [--only NAME]
//        [--isa all|avx2,avx512]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "bench_isa.h"
#include "bench_timing.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "data/builtin_tokenizer.h"
#include "ops/activation.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/rope.h"

using namespace kestrel;

namespace {

Tensor randn(Shape s, DType dt, uint64_t stream, float scale = 1.f) {
  Tensor f = Tensor::empty(std::move(s), DType::F32);
  float* p = f.data<float>();
  Philox rng{42, stream};
  for (int64_t i = 0; i < f.numel(); ++i) p[i] = scale * float(rng.normal(uint64_t(i)));
  return dt == DType::F32 ? f : f.to(dt, MemCategory::Activations);
}

using bench::Timing;
using bench::time_best;

struct Shapes {
  const char* name;
  int64_t T, D, F, V, heads, kv, head_dim;
};

struct Kernel {
  std::string name;
  int64_t elements;  // of the main buffer
  double bytes;      // must-move bytes
  std::function<void()> run;
};

void bench_shape(const Shapes& s, DType dt, const std::vector<int>& threads, const std::vector<IsaLevel>& isas, int reps,
                 const std::string& only) {
  const int64_t T = s.T, D = s.D, F = s.F, V = s.V, hd = s.head_dim;
  const double es = double(dtype_size(dt));
  std::printf("\n%s shape, %s: T=%lld D=%lld F=%lld V=%lld heads=%lld/%lld head_dim=%lld\n", s.name, dtype_name(dt),
              (long long)T, (long long)D, (long long)F, (long long)V, (long long)s.heads, (long long)s.kv,
              (long long)hd);
  // swiglu: [T, F]
  const Tensor gate = randn({T, F}, dt, 1, 2.f), up = randn({T, F}, dt, 2), dh = randn({T, F}, dt, 3);
  Tensor h = Tensor::empty({T, F}, dt), dgate = Tensor::empty({T, F}, dt), dup = Tensor::empty({T, F}, dt);
  // rmsnorm and add: [T, D]
  const Tensor x = randn({T, D}, dt, 4), w = randn({D}, dt, 5), dy = randn({T, D}, dt, 6);
  Tensor y = Tensor::empty({T, D}, dt), dx = Tensor::empty({T, D}, dt), rstd = Tensor::empty({T}, DType::F32);
  Tensor dw = Tensor::zeros({D}, DType::F32);
  ops::rmsnorm_fwd(x, w, 1e-6f, y, rstd);
  // rope: q [T, heads*hd] and k [T, kv*hd], packed sequences of 256 tokens.
  Tensor q = randn({T, s.heads * hd}, dt, 7), k = randn({T, s.kv * hd}, dt, 8);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t % 256);
  const Tensor pos_t = Tensor::from_ints(pos, {T});
  ops::RopeConfig rc;
  rc.head_dim = hd;
  rc.theta = 1e6;
  const ops::RopeTable table = ops::make_rope_table(rc, 256);
  // logprob_entropy: logits [T, V]
  const Tensor logits = randn({T, V}, dt, 9, 3.f);
  std::vector<int32_t> tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tg[size_t(t)] = int32_t((t * 7919) % V);
  const Tensor tgt = Tensor::from_ints(tg, {T});
  Tensor logprob = Tensor::empty({T}, DType::F32), entropy = Tensor::empty({T}, DType::F32);
  Tensor lse = Tensor::empty({T}, DType::F32), dlogits = Tensor::empty({T, V}, dt);
  const Tensor dlp = randn({T}, DType::F32, 10), dent = randn({T}, DType::F32, 11);
  ops::logprob_entropy_fwd(logits, tgt, logprob, &entropy, lse);

  const double tf = double(T * F), td = double(T * D), tv = double(T * V), tq = double(T * (s.heads + s.kv) * hd);
  const std::vector<Kernel> kernels = {
      {"swiglu_fwd", T * F, 3 * tf * es, [&] { ops::swiglu_fwd(gate, up, h); }},
      {"swiglu_bwd", T * F, 5 * tf * es, [&] { ops::swiglu_bwd(gate, up, dh, dgate, dup); }},
      {"rmsnorm_fwd", T * D, 2 * td * es, [&] { ops::rmsnorm_fwd(x, w, 1e-6f, y, rstd); }},
      {"rmsnorm_bwd", T * D, 3 * td * es, [&] { ops::rmsnorm_bwd(x, w, rstd, dy, dx, dw); }},
      {"rope_fwd(q,k)", T * (s.heads + s.kv) * hd, 2 * tq * es,
       [&] {
         ops::rope_fwd(q, pos_t, table, s.heads);
         ops::rope_fwd(k, pos_t, table, s.kv);
       }},
      {"rope_bwd(q,k)", T * (s.heads + s.kv) * hd, 2 * tq * es,
       [&] {
         ops::rope_bwd(q, pos_t, table, s.heads);
         ops::rope_bwd(k, pos_t, table, s.kv);
       }},
      {"logprob_ent_fwd", T * V, tv * es, [&] { ops::logprob_entropy_fwd(logits, tgt, logprob, &entropy, lse); }},
      {"logprob_ent_bwd", T * V, 2 * tv * es,
       [&] { ops::logprob_entropy_bwd(logits, tgt, lse, dlp, &dent, dlogits); }},
      {"add", T * D, 3 * td * es, [&] { ops::add(x, dy, y); }},
  };
  std::printf("%-16s %-7s %4s %10s %9s %17s\n", "kernel", "isa", "thr", "ms", "ns/elem", "GB/s [cpu]");
  for (const Kernel& kn : kernels) {
    if (!only.empty() && kn.name.find(only) == std::string::npos) continue;
    for (int nt : threads)
      for (IsaLevel isa : isas) {
        set_num_threads(nt);
        set_kernel_isa(isa);
        // Big kernels (the [T, V] logits) take fewer repetitions.
        const int r = kn.bytes > 2e8 ? std::max(2, reps / 3) : reps;
        const Timing t = time_best(kn.run, r, nt);
        std::printf("%-16s %-7s %4d %10.3f %9.3f %7.1f [%7.1f]\n", kn.name.c_str(), isa_name(isa), nt, t.wall * 1e3,
                    t.wall * 1e9 / double(kn.elements), kn.bytes / t.wall * 1e-9, kn.bytes / t.cpu * 1e-9);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "both", only;
  int reps = 7;
  std::vector<int> threads{1, 2};
  std::vector<IsaLevel> isas = bench::parse_isas("all");
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--shape") shape = v;
    else if (a == "--reps") reps = std::max(1, std::atoi(v));
    else if (a == "--only") only = v;
    else if (a == "--isa") {
      isas = bench::parse_isas(v);
      if (isas.empty()) return 2;
    }
    else if (a == "--threads") {
      threads.clear();
      for (const char* p = v; *p; p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p))
        threads.push_back(std::atoi(p));
    } else {
      std::fprintf(stderr, "unknown option %s (options: --shape rl|large|both, --threads 1,2, --reps N, --only NAME, --isa all|avx2,avx512)\n",
                   a.c_str());
      return 2;
    }
  }
  if (shape != "rl" && shape != "large" && shape != "both") {
    std::fprintf(stderr, "--shape must be rl, large or both, not %s\n", shape.c_str());
    return 2;
  }
  std::printf("%s\n", cpu_summary().c_str());
  std::vector<Shapes> shapes;
  if (shape != "large") shapes.push_back({"rl", 6000, 128, 384, data::arith_tokenizer().vocab_size, 4, 2, 32});
  if (shape != "rl") shapes.push_back({"large", 512, 896, 4864, 151936, 14, 2, 64});
  for (const Shapes& s : shapes)
    for (DType dt : {DType::F32, DType::BF16}) bench_shape(s, dt, threads, isas, reps, only);
  return 0;
}
