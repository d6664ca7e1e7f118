// The MoE grouped GEMM: one ops::grouped_linear_fwd / grouped_linear_bwd call
// over every expert's rows against one ops::linear_fwd / linear_bwd call per
// non-empty expert on the same row groups, on a Qwen3-MoE-like layer slice
// (hidden D = 512, expert ffn F = 256, E = 16 experts, top-4): the experts'
// fused gate_up projection [2F, D] and the down projection [D, F], in f32 and
// bf16. Routings:
//   balanced: T = 512 tokens through a softmax top-4 router on random logits;
//   skewed:   the same with three hot experts and two that get no token;
//   decode:   T = 8 tokens (groups of 0..4 rows: the grouped call's skinny path).
//             A decode step streams every layer's experts from memory once, so
//             this case cycles through enough layers' weights (~96 MB) to miss
//             the last-level cache; times are per layer.
// Backward is dX and dW of every expert (dW accumulated, f32).
//
// Usage: bench_moe_gemm_bench [--threads N] [--reps R] [--tokens T]
// Prints the machine header and a markdown table: best-of-R wall and CPU time
// per pass, and the ratio per-expert / grouped (> 1: the grouped call is faster).
#include <omp.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "ops/linear.h"
#include "ops/moe.h"

using namespace kestrel;

namespace {

constexpr int64_t kD = 512, kF = 256, kE = 16, kTopK = 4;

std::vector<float> randn(int64_t n, uint64_t seed, float scale) {
  Philox rng{0x30e5ULL, seed};
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * rng.normal(uint64_t(i));
  return v;
}

Tensor random_tensor(Shape shape, DType dt, uint64_t seed, float scale = 0.05f) {
  const Tensor f = Tensor::from_vector(randn(shape_numel(shape), seed, scale), shape, MemCategory::Other);
  return dt == DType::F32 ? f : f.to(dt, MemCategory::Other);
}

// Rows per expert of T tokens routed top-k by a softmax router; skewed adds
// +2 to experts 0..2 and -30 to experts 14, 15 (never chosen).
std::vector<int64_t> route(int64_t T, bool skewed, uint64_t seed) {
  std::vector<float> logits = randn(T * kE, seed, 1.f);
  if (skewed)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < kE; ++e) logits[size_t(t * kE + e)] += e < 3 ? 2.f : e >= 14 ? -30.f : 0.f;
  ops::MoeRouterConfig cfg;
  cfg.num_experts = kE;
  cfg.top_k = kTopK;
  cfg.norm_topk_prob = true;
  Tensor idx = Tensor::empty({T, kTopK}, DType::I32), w = Tensor::empty({T, kTopK}, DType::F32),
         scores = Tensor::empty({T, kE}, DType::F32);
  ops::moe_router_fwd(Tensor::from_vector(logits, {T, kE}), nullptr, cfg, idx, w, scores);
  return ops::moe_routing(idx, kE).group_sizes;
}

std::string sizes_str(const std::vector<int64_t>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " " : "") + std::to_string(s[i]);
  return out;
}

struct Linear {
  const char* name;
  int64_t in, out;
};

// One row of the table per (pass): grouped vs per-expert, best of reps.
// layers: distinct weight sets walked per timed pass (times are per layer).
void bench_linear(const char* routing, DType dt, const Linear& lin, const std::vector<int64_t>& sizes, int64_t layers,
                  int reps, int threads) {
  int64_t N = 0;
  for (int64_t s : sizes) N += s;
  uint64_t seed = 100;
  std::vector<std::vector<Tensor>> w(static_cast<size_t>(layers)), dw(static_cast<size_t>(layers));  // [layer][expert]
  std::vector<std::vector<const Tensor*>> wp(static_cast<size_t>(layers));
  std::vector<std::vector<Tensor*>> dwp(static_cast<size_t>(layers));
  for (size_t l = 0; l < size_t(layers); ++l) {
    for (int64_t e = 0; e < kE; ++e) {
      w[l].push_back(random_tensor({lin.out, lin.in}, dt, seed++));
      dw[l].push_back(Tensor::zeros({lin.out, lin.in}, DType::F32, MemCategory::Other));
    }
    for (int64_t e = 0; e < kE; ++e) {
      wp[l].push_back(&w[l][size_t(e)]);
      dwp[l].push_back(&dw[l][size_t(e)]);
    }
  }
  const Tensor x = random_tensor({N, lin.in}, dt, seed++, 1.f), dy = random_tensor({N, lin.out}, dt, seed++, 1.f);
  Tensor y = Tensor::empty({N, lin.out}, dt), dx = Tensor::empty({N, lin.in}, dt);

  auto grouped_fwd = [&] {
    for (size_t l = 0; l < size_t(layers); ++l) ops::grouped_linear_fwd(x, sizes, wp[l], y);
  };
  auto grouped_bwd = [&] {
    for (size_t l = 0; l < size_t(layers); ++l) ops::grouped_linear_bwd(x, sizes, wp[l], dy, &dx, dwp[l]);
  };
  // The per-expert path: the caller slices each group and calls the dense op.
  auto per_expert = [&](bool backward) {
    for (size_t l = 0; l < size_t(layers); ++l) {
      int64_t r0 = 0;
      for (int64_t e = 0; e < kE; ++e) {
        const int64_t n = sizes[size_t(e)];
        if (n == 0) continue;
        const Tensor xe = x.slice_rows(r0, r0 + n);
        if (backward) {
          Tensor dxe = dx.slice_rows(r0, r0 + n);
          ops::linear_bwd(xe, w[l][size_t(e)], dy.slice_rows(r0, r0 + n), &dxe, &dw[l][size_t(e)], nullptr);
        } else {
          Tensor ye = y.slice_rows(r0, r0 + n);
          ops::linear_fwd(xe, w[l][size_t(e)], nullptr, ye);
        }
        r0 += n;
      }
    }
  };
  struct Pass {
    const char* name;
    double flops;
    bench::Timing grouped, per;
  };
  const double f = 2.0 * double(N) * double(lin.in) * double(lin.out);
  Pass passes[3] = {{"fwd", f, {}, {}}, {"bwd (dx+dw)", 2 * f, {}, {}}, {"fwd+bwd", 3 * f, {}, {}}};
  passes[0].grouped = bench::time_best(grouped_fwd, reps, threads);
  passes[0].per = bench::time_best([&] { per_expert(false); }, reps, threads);
  passes[1].grouped = bench::time_best(grouped_bwd, reps, threads);
  passes[1].per = bench::time_best([&] { per_expert(true); }, reps, threads);
  passes[2].grouped = {passes[0].grouped.wall + passes[1].grouped.wall, passes[0].grouped.cpu + passes[1].grouped.cpu};
  passes[2].per = {passes[0].per.wall + passes[1].per.wall, passes[0].per.cpu + passes[1].per.cpu};
  for (Pass& p : passes)
    for (bench::Timing* t : {&p.grouped, &p.per}) *t = {t->wall / double(layers), t->cpu / double(layers)};
  for (const Pass& p : passes)
    std::printf("| %s | %s | %s [%lld, %lld] | %s | %.3f | %.3f | %.3f | %.3f | %.1f | %.2f |\n", routing,
                dtype_name(dt), lin.name, (long long)lin.out, (long long)lin.in, p.name, 1e3 * p.grouped.wall,
                1e3 * p.per.wall, 1e3 * p.grouped.cpu, 1e3 * p.per.cpu, p.flops / p.grouped.wall * 1e-9,
                p.per.wall / p.grouped.wall);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads(), reps = 7;
  int64_t T = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads")
      threads = std::stoi(next());
    else if (a == "--reps")
      reps = std::stoi(next());
    else if (a == "--tokens")
      T = std::stoll(next());
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--reps R] [--tokens T]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  bench::print_machine_header("# ");
  std::printf("# MoE grouped GEMM: D %lld, expert F %lld, E %lld, top-%lld; best of %d\n", (long long)kD, (long long)kF,
              (long long)kE, (long long)kTopK, reps);
  struct Routing {
    const char* name;
    std::vector<int64_t> sizes;
    bool cold;  // weights streamed from memory (decode)
  };
  const Routing routings[] = {{"balanced", route(T, false, 1), false},
                              {"skewed", route(T, true, 2), false},
                              {"decode", route(8, false, 3), true}};
  for (const Routing& r : routings) std::printf("# %s rows per expert: %s\n", r.name, sizes_str(r.sizes).c_str());
  std::printf(
      "\n| routing | dtype | linear [out, in] | pass | grouped ms | per-expert ms | grouped CPU ms | "
      "per-expert CPU ms | grouped GFLOP/s | per-expert / grouped |\n|---|---|---|---|---|---|---|---|---|---|\n");
  const Linear linears[] = {{"gate_up", kD, 2 * kF}, {"down", kF, kD}};
  for (DType dt : {DType::F32, DType::BF16})
    for (const Routing& r : routings)
      for (const Linear& lin : linears) {
        const int64_t layer_bytes = kE * lin.in * lin.out * int64_t(dtype_size(dt));
        const int64_t layers = r.cold ? (int64_t(96) << 20) / layer_bytes + 1 : 1;
        bench_linear(r.name, dt, lin, r.sizes, layers, reps, threads);
      }
  return 0;
}
