// The small-M linear of decode steps: cpu::skinny_linear against the BLAS
// path (ops::linear_fwd), the weights packed once (cpu::packed_linear, where
// oneDNN packs: the rollout's path past 32 rows), the same with q|k|v and
// gate|up fused into one packed matrix each (the outputs copied apart), and
// a plain read of the same bytes, the skinny kernel
// at each kernel ISA level the machine has (avx2, avx512), on the weight
// matrices of the "small" config (8 layers of q,k,v,o,gate,up,down + the
// 8192 x 512 lm_head: 113 MB in f32), i.e. one decode step's worth of linears.
//
// Usage: bench_skinny_gemm_bench [--threads 1] [--reps 9] [--dtype f32|bf16] [--rows 1,2,4,8,16,32,64,128]
// Prints, per row count M, the median over interleaved repetitions of the
// wall time and the process CPU time of one pass over all matrices, and the
// weight bytes per second. The machine is shared: CPU time is the steadier
// number at 1 thread; the read row is the practical bound for M = 1.
#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/packed_linear.h"
#include "backend/cpu/skinny_gemm.h"
#include "core/cpu_features.h"
#include "core/parallel_for.h"
#include "core/rng.h"
#include "bench_timing.h"
#include "ops/linear.h"

using namespace kestrel;

namespace {

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

Tensor random_tensor(Shape shape, DType dt, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape), dt, MemCategory::Other);
  Philox rng{0xbe7cULL, seed};
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.02f * rng.normal(uint64_t(i)));
  return t;
}

// Sums every byte of the buffers as floats (bf16 pairs read as one float: the
// bytes are what matter): the read bandwidth the kernel could reach. 32
// partial sums keep the adds off the critical path.
float read_all(const std::vector<Tensor>& ws) {
  float total = 0.f;
#pragma omp parallel reduction(+ : total)
  {
    float acc[32] = {};
    for (const Tensor& w : ws) {
      const float* p = static_cast<const float*>(w.raw());
      const int64_t n = int64_t(w.nbytes() / 4), nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t b = n * id / nt / 32 * 32, e = id + 1 == nt ? n / 32 * 32 : n * (id + 1) / nt / 32 * 32;
      for (int64_t i = b; i < e; i += 32) {
#pragma omp simd
        for (int j = 0; j < 32; ++j) acc[j] += p[i + j];
      }
    }
    for (float v : acc) total += v;
  }
  return total;
}

// The rollout's previous small-M kernel (f32 only), kept for the before/after
// comparison: four adjacent weight rows interleaved per pass.
void previous_kernel(const Tensor& xt, const Tensor& wt, Tensor& yt) {
  const float* x = xt.data<float>();
  const float* w = wt.data<float>();
  float* y = yt.data<float>();
  const int64_t T = xt.size(0), in = xt.size(1), out = wt.size(0);
  const int64_t nblk = (out + 3) / 4;
  const bool par = out * in >= (int64_t(1) << 16) && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t n0 = blk * 4, nn = std::min<int64_t>(4, out - n0);
    const float* w0 = w + n0 * in;
    const float* w1 = w0 + (nn > 1 ? in : 0);
    const float* w2 = w0 + (nn > 2 ? 2 * in : 0);
    const float* w3 = w0 + (nn > 3 ? 3 * in : 0);
    for (int64_t t = 0; t < T; ++t) {
      const float* xr = x + t * in;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < in; ++k) {
        s0 += xr[k] * w0[k];
        s1 += xr[k] * w1[k];
        s2 += xr[k] * w2[k];
        s3 += xr[k] * w3[k];
      }
      const float r[4] = {s0, s1, s2, s3};
      for (int64_t j = 0; j < nn; ++j) y[t * out + n0 + j] = r[j];
    }
  }
}

struct Stat {
  std::vector<double> wall, cpu;
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 9;
  DType dt = DType::F32;
  std::vector<int64_t> rows_list = {1, 2, 4, 8, 12, 16, 24, 32, 64, 128};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--dtype") dt = next() == "bf16" ? DType::BF16 : DType::F32;
    else if (a == "--rows") {
      rows_list.clear();
      std::string s = next();
      for (size_t p = 0; p < s.size();) {
        const size_t q = s.find(',', p);
        rows_list.push_back(std::stoll(s.substr(p, q == std::string::npos ? std::string::npos : q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--threads T] [--reps R] [--dtype f32|bf16] [--rows 1,2,4,...]\n", argv[0]);
      return 2;
    }
  }
  set_num_threads(threads);
  // [out, in] of one layer's q, k, v, o, gate, up, down in the small config.
  const int64_t shapes[7][2] = {{512, 512}, {128, 512}, {128, 512}, {512, 512}, {1536, 512}, {1536, 512}, {512, 1536}};
  std::vector<Tensor> ws;
  uint64_t seed = 1;
  for (int l = 0; l < 8; ++l)
    for (const auto& s : shapes) ws.push_back(random_tensor({s[0], s[1]}, dt, seed++));
  ws.push_back(random_tensor({8192, 512}, dt, seed++));  // lm_head
  int64_t bytes = 0, params = 0;
  for (const Tensor& w : ws) {
    bytes += int64_t(w.nbytes());
    params += w.numel();
  }
  bench::print_machine_header("# ");
  // The packs, made once (as the rollout does per weight update), timed.
  std::vector<std::shared_ptr<const cpu::PackedLinearWeight>> packs;
  {
    const double w0 = wall_now();
    for (const Tensor& w : ws) packs.push_back(cpu::pack_linear_weight(w));
    if (packs[0]) std::printf("# packing every weight once: %.1f ms\n", 1e3 * (wall_now() - w0));
  }
  // Fused q|k|v and gate|up weights of every layer, packed as one matrix
  // each: the "packed fused" path multiplies them in one call and copies the
  // result's column blocks out to the separate outputs, as a fused layer would.
  std::vector<std::shared_ptr<const cpu::PackedLinearWeight>> fused;  // [layer * 2 + {0: qkv, 1: gate|up}]
  if (packs[0])
    for (int l = 0; l < 8; ++l)
      for (auto [first, count] : {std::pair<int, int>{0, 3}, {4, 2}}) {
        int64_t rows = 0;
        for (int j = 0; j < count; ++j) rows += ws[size_t(l * 7 + first + j)].size(0);
        Tensor cat = Tensor::empty({rows, 512}, dt, MemCategory::Other);
        int64_t at = 0;
        for (int j = 0; j < count; ++j) {
          const Tensor& w = ws[size_t(l * 7 + first + j)];
          std::memcpy(static_cast<char*>(cat.raw()) + at * 512 * dtype_size(dt), w.raw(), w.nbytes());
          at += w.size(0);
        }
        fused.push_back(cpu::pack_linear_weight(cat));
      }
  std::printf("# skinny linear: small-config weights (%.1f MB, %s), %d threads, median of %d\n", double(bytes) / 1e6,
              dtype_name(dt), threads, reps);
  std::printf("| M | path | wall ms | CPU ms | weight GB/s (wall) | GFLOP/s (wall) |\n|---|---|---|---|---|---|\n");

  auto report = [&](int64_t M, const char* path, const Stat& s) {
    const double w = Stat::median(s.wall), c = Stat::median(s.cpu);
    std::printf("| %lld | %s | %.2f | %.2f | %.1f | %.1f |\n", (long long)M, path, 1e3 * w, 1e3 * c,
                double(bytes) / w / 1e9, 2.0 * double(M) * double(params) / w / 1e9);
  };
  {
    Stat s;
    volatile float sink = 0.f;
    for (int r = 0; r < reps; ++r) {
      const double w0 = wall_now(), c0 = cpu_now();
      sink = sink + read_all(ws);
      s.wall.push_back(wall_now() - w0);
      s.cpu.push_back(cpu_now() - c0);
    }
    report(0, "read only", s);
  }
  for (int64_t M : rows_list) {
    std::vector<Tensor> xs, ys;
    for (const Tensor& w : ws) {
      xs.push_back(random_tensor({M, w.size(1)}, dt, seed++));
      ys.push_back(Tensor::empty({M, w.size(0)}, dt, MemCategory::Activations));
    }
    const bool previous = M <= 8 && dt == DType::F32;
    // Paths 0 and 1: the skinny kernel at avx2 and at avx512 (where the
    // machine has it and the level takes M rows).
    const char* names[6] = {"skinny avx2", "skinny avx512", "previous kernel", "blas (ops::linear_fwd)",
                            "packed (cpu::packed_linear)", "packed fused qkv, gate|up"};
    // The fused outputs [M, q+k+v] and [M, gate+up] of the fused path.
    Tensor y_qkv = Tensor::empty({M, 768}, dt, MemCategory::Activations);
    Tensor y_gu = Tensor::empty({M, 3072}, dt, MemCategory::Activations);
    auto split = [&](const Tensor& src, int64_t src_cols, std::initializer_list<Tensor*> outs) {
      const size_t es = dtype_size(dt);
      int64_t c0 = 0;
      for (Tensor* o : outs) {
        const int64_t n = o->size(1);
        for (int64_t r = 0; r < M; ++r)
          std::memcpy(static_cast<char*>(o->raw()) + size_t(r * n) * es,
                      static_cast<const char*>(src.raw()) + size_t(r * src_cols + c0) * es, size_t(n) * es);
        c0 += n;
      }
    };
    auto fused_pass = [&] {
      for (int l = 0; l < 8; ++l) {
        const size_t b = size_t(l * 7);
        cpu::packed_linear(*fused[size_t(2 * l)], xs[b], nullptr, y_qkv);
        split(y_qkv, 768, {&ys[b], &ys[b + 1], &ys[b + 2]});
        cpu::packed_linear(*packs[b + 3], xs[b + 3], nullptr, ys[b + 3]);
        cpu::packed_linear(*fused[size_t(2 * l + 1)], xs[b + 4], nullptr, y_gu);
        split(y_gu, 3072, {&ys[b + 4], &ys[b + 5]});
        cpu::packed_linear(*packs[b + 6], xs[b + 6], nullptr, ys[b + 6]);
      }
      cpu::packed_linear(*packs.back(), xs.back(), nullptr, ys.back());
    };
    const bool has512 = machine_isa() == IsaLevel::Avx512;
    auto takes = [&](IsaLevel isa) {
      set_kernel_isa(isa);
      return cpu::skinny_linear_applies(xs[0], ws[0], nullptr, ys[0]);
    };
    const bool run[6] = {takes(IsaLevel::Avx2), has512 && takes(IsaLevel::Avx512), previous, true, packs[0] != nullptr,
                         !fused.empty() && fused[0] != nullptr};
    Stat stats[6];
    for (int r = 0; r < reps; ++r) {  // interleaved, so load changes hit every path alike
      for (int path = 0; path < 6; ++path) {
        if (!run[path]) continue;
        if (path <= 1) set_kernel_isa(path == 0 ? IsaLevel::Avx2 : IsaLevel::Avx512);
        const double w0 = wall_now(), c0 = cpu_now();
        if (path == 5) fused_pass();
        for (size_t i = 0; i < ws.size() && path != 5; ++i) {
          if (path <= 1) cpu::skinny_linear(xs[i], ws[i], nullptr, ys[i]);
          else if (path == 2) previous_kernel(xs[i], ws[i], ys[i]);
          else if (path == 3) ops::linear_fwd(xs[i], ws[i], nullptr, ys[i]);
          else cpu::packed_linear(*packs[i], xs[i], nullptr, ys[i]);
        }
        stats[path].wall.push_back(wall_now() - w0);
        stats[path].cpu.push_back(cpu_now() - c0);
      }
    }
    for (int path = 0; path < 6; ++path)
      if (!stats[path].wall.empty()) report(M, names[path], stats[path]);
  }
  return 0;
}
