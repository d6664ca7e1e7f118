#include "backend/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "backend/cpu/blas_select.h"
#include "backend/cpu/packed_linear.h"
#include "core/parallel_for.h"
#include "core/status.h"

namespace kestrel::cpu {

namespace {

// Which library runs each transpose pattern, and the line that says so.
struct Plan {
  const BlasLib* by_class[kNumGemmClasses] = {};
  std::string summary;
};

std::atomic<const Plan*> g_plan{nullptr};  // what sgemm uses now
std::atomic<int> g_blas_threads{-1};      // thread count last given to the plan's libraries

// "<lib> for <classes>; <lib> for <classes>, T threads, a/b/c GFLOP/s (x@W^T/dY@W/dY^T@X), <how>".
std::string describe(const Plan& p, const GemmChoice* measured, const std::string& how) {
  std::vector<const BlasLib*> libs;
  for (const BlasLib* l : p.by_class)
    if (std::find(libs.begin(), libs.end(), l) == libs.end()) libs.push_back(l);
  std::string s;
  for (const BlasLib* l : libs) {
    if (!s.empty()) s += "; ";
    s += l->title;
    if (!l->note.empty()) s += " [" + l->note + "]";
    if (libs.size() > 1) {
      s += " for";
      const char* sep = " ";
      for (int k = 0; k < kNumGemmClasses; ++k)
        if (p.by_class[k] == l) {
          s += sep;
          s += gemm_class_name(GemmClass(k));
          sep = ", ";
        }
    }
  }
  const int threads = omp_get_max_threads();
  s += ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  if (measured && measured->gflops[0] > 0) {
    char buf[96];
    std::snprintf(buf, sizeof buf, ", %.0f/%.0f/%.0f GFLOP/s (x@W^T/dY@W/dY^T@X)", measured->gflops[0],
                  measured->gflops[1], measured->gflops[2]);
    s += buf;
  }
  for (const BlasLib* l : libs)
    if (l->below_isa) s += ", WARNING: " + std::string(provider_title(l->kind)) + " runs below this CPU's ISA";
  return s + ", " + how;
}

Plan single(const BlasLib* lib) {
  Plan p;
  for (auto& c : p.by_class) c = lib;
  return p;
}

// auto: candidates, then the cache or a fresh measurement. Appends notes
// (unreadable cache, failed write) to *notes.
Result<Plan> choose_auto(std::string* notes) {
  std::vector<const BlasLib*> loaded, candidates;
  std::string missing;
  for (int i = 0; i < kNumGemmProviders; ++i) {
    std::string why;
    if (const BlasLib* l = load_blas(GemmProvider(i), &why))
      loaded.push_back(l);
    else
      missing += (missing.empty() ? "" : "; ") + why;
  }
  if (loaded.empty())
    return KS_ERR("no GEMM library could be loaded (", missing,
                  "): install libopenblas0-openmp, libblis4 or libdnnl2 (scripts/install_deps.sh)");
  if (std::getenv("OPENBLAS_CORETYPE") && *std::getenv("OPENBLAS_CORETYPE")) {
    if (const BlasLib* ob = load_blas(GemmProvider::OpenBLAS)) {
      Plan p = single(ob);
      p.summary = describe(p, nullptr, "auto: OpenBLAS because OPENBLAS_CORETYPE is set");
      return p;
    }
  }
  for (const BlasLib* l : loaded)
    if (!l->below_isa) candidates.push_back(l);
  if (candidates.empty()) candidates = loaded;  // all below the ISA: still run, with the warning
  if (candidates.size() == 1) {
    Plan p = single(candidates[0]);
    p.summary = describe(p, nullptr, "auto: the only library at this CPU's ISA");
    return p;
  }
  const int threads = omp_get_max_threads();
  const std::string key = gemm_cache_key(cpu_features(), candidates, threads);
  const std::string dir = gemm_cache_dir();
  const std::string file = dir.empty() ? "" : gemm_cache_file(dir, key);
  std::optional<GemmChoice> choice;
  std::string how;
  if (!file.empty()) {
    Result<std::optional<GemmChoice>> r = read_gemm_cache(file, key);
    if (!r.is_ok())
      *notes += "GEMM: note: ignored the unreadable cache file (" + r.status().message() + "); measuring again\n";
    else if (r->has_value()) {
      choice = **r;
      how = "auto: cached in " + file;
      if (choice->doubtful())
        how += " (measured while other processes held the cores; delete it to measure again on a quiet machine)";
    }
  }
  auto find = [&](GemmProvider k) -> const BlasLib* {
    for (const BlasLib* l : candidates)
      if (l->kind == k) return l;
    return nullptr;
  };
  if (choice)
    for (GemmProvider k : choice->by_class)
      if (!find(k)) choice.reset();  // a library of the cached choice is gone: measure
  if (!choice) {
    const GemmMeasurement m = measure_gemm_providers(candidates);
    choice = pick_from_scores(m.scores);
    choice->cpu_share = m.cpu_share;
    char buf[160];
    std::snprintf(buf, sizeof buf, "auto: measured in %.1f s", m.seconds);
    how = buf;
    if (choice->doubtful()) {
      std::snprintf(buf, sizeof buf, " while other processes held the cores (%.0f%% ours: doubtful)",
                    100 * m.cpu_share);
      how += buf;
    }
    if (!file.empty()) {
      Result<GemmChoice> published = publish_gemm_cache(file, key, *choice);
      if (!published.is_ok()) {
        *notes += "GEMM: note: could not write the cache (" + published.status().message() + ")\n";
      } else {
        bool usable = true;  // the same machine's libraries, so always; checked all the same
        for (GemmProvider k : published->by_class) usable = usable && find(k) != nullptr;
        const bool theirs = usable && !std::equal(std::begin(published->by_class), std::end(published->by_class),
                                                  std::begin(choice->by_class));
        if (theirs) {
          choice = *published;
          how = "auto: measured, but another process published first: its choice, cached in " + file;
        } else {
          how += ", cached in " + file + (choice->doubtful() ? " (delete it to measure again)" : "");
        }
      }
    }
  }
  Plan p;
  for (int k = 0; k < kNumGemmClasses; ++k) p.by_class[k] = find(choice->by_class[k]);
  p.summary = describe(p, &*choice, how);
  return p;
}

Result<Plan> choose_default(std::string* notes) {
  KS_ASSIGN(std::optional<GemmProvider> forced, blas_from_env(std::getenv("KESTREL_BLAS")));
  // Deterministic mode runs its tiles as single-threaded calls from several
  // threads at once, so it needs a library whose calls run concurrently:
  // oneDNN, else BLIS (OpenBLAS 0.3's OpenMP build serialises calls made
  // inside a parallel region: measured, 2 threads ran at 1 thread's speed).
  // The choice depends only on what is installed, never on timing, so every
  // run and thread count on one machine uses the same library.
  if (!forced && deterministic()) {
    for (GemmProvider g : {GemmProvider::OneDNN, GemmProvider::BLIS, GemmProvider::OpenBLAS}) {
      const BlasLib* lib = load_blas(g);
      if (!lib) continue;
      Plan p = single(lib);
      p.summary = describe(p, nullptr,
                           g == GemmProvider::OpenBLAS
                               ? "deterministic mode (fixed tiles; OpenBLAS, the only library here: its tiles run "
                                 "one at a time, install libdnnl2 for parallel tiles)"
                               : "deterministic mode (fixed tiles, one library)");
      return p;
    }
    return KS_ERR("deterministic mode: no GEMM library could be loaded (install libdnnl2, libblis4 or "
                  "libopenblas0-openmp: scripts/install_deps.sh)");
  }
  if (!forced) return choose_auto(notes);
  std::string why;
  const BlasLib* lib = load_blas(*forced, &why);
  if (!lib)
    return KS_ERR("KESTREL_BLAS=", provider_key(*forced), ": ", why,
                  " (unset KESTREL_BLAS to use what is installed, or install it: scripts/install_deps.sh)");
  Plan p = single(lib);
  p.summary = describe(p, nullptr, std::string("KESTREL_BLAS=") + provider_key(*forced));
  return p;
}

struct DefaultState {
  std::once_flag once;
  Status status;
  std::unique_ptr<Plan> plan;
};
DefaultState& default_state() {
  static DefaultState s;
  return s;
}

const Plan* default_plan() {
  DefaultState& s = default_state();
  std::call_once(s.once, [&] {
    std::string notes;
    Result<Plan> r = choose_default(&notes);
    std::fputs(notes.c_str(), stderr);
    if (!r.is_ok()) {
      s.status = r.status();
      return;
    }
    s.plan = std::make_unique<Plan>(std::move(r).value());
    std::fprintf(stderr, "GEMM: %s\n", s.plan->summary.c_str());
  });
  return s.plan.get();
}

const Plan* active_plan() {
  const Plan* p = g_plan.load(std::memory_order_acquire);
  if (p) [[likely]]
    return p;
  p = default_plan();
  if (!p) throw Error(default_state().status.message());
  const Plan* expected = nullptr;
  g_plan.compare_exchange_strong(expected, p);  // a test may have installed its own meanwhile
  return g_plan.load(std::memory_order_acquire);
}

}  // namespace

Status gemm_init() {
  if (!default_plan()) return default_state().status;
  // The packed-weight verdict as well (packed_choice.h): a job then measures
  // it here, where the CLI has its ranks take turns (rank 0 measures, the
  // others read its cache), not inside its first rollout step; and a bad
  // KESTREL_PACKED_WEIGHTS stops it before any work.
  try {
    if (packed_linear_enabled()) dtype_packs_here(DType::F32);
  } catch (const Error& e) {
    return KS_ERR(e.what());
  }
  return Status::ok();
}

std::string gemm_summary() {
  std::string why;
  const std::string& plan = active_plan()->summary;
  if (!packed_linear_enabled(&why)) return plan + "; rollout weights not packed (" + why + ")";
  const bool f32 = dtype_packs_here(DType::F32, &why);
  return plan + (f32 ? "; rollout weights packed once per update by " + why
                     : "; f32 rollout weights not packed (" + why + ")");
}

std::array<GemmProvider, 3> gemm_choice() {
  static_assert(kNumGemmClasses == 3);
  const Plan* p = active_plan();
  std::array<GemmProvider, 3> out{};
  for (int k = 0; k < kNumGemmClasses; ++k) out[size_t(k)] = p->by_class[k]->kind;
  return out;
}

Status adopt_gemm_choice(const std::array<GemmProvider, 3>& choice, const std::string& why) {
  if (choice == gemm_choice()) return Status::ok();
  static std::mutex mu;
  static std::vector<std::unique_ptr<Plan>> adopted;  // kept: sgemm may hold a pointer to an earlier one
  auto plan = std::make_unique<Plan>();
  for (int k = 0; k < kNumGemmClasses; ++k) {
    std::string w;
    plan->by_class[k] = load_blas(choice[size_t(k)], &w);
    if (!plan->by_class[k])
      return KS_ERR("GEMM: cannot use ", provider_key(choice[size_t(k)]), " for ", gemm_class_name(GemmClass(k)), " (",
                    why, "): ", w, "; install the same libraries on every node or set KESTREL_BLAS");
  }
  plan->summary = describe(*plan, nullptr, why);
  std::lock_guard<std::mutex> lock(mu);
  adopted.push_back(std::move(plan));
  g_plan.store(adopted.back().get(), std::memory_order_release);
  g_blas_threads.store(-1);
  return Status::ok();
}

std::vector<GemmProvider> available_gemm_providers() {
  std::vector<GemmProvider> out;
  for (int i = 0; i < kNumGemmProviders; ++i)
    if (load_blas(GemmProvider(i))) out.push_back(GemmProvider(i));
  return out;
}

void use_gemm_provider(GemmProvider p) {
  static std::mutex mu;
  static std::unique_ptr<Plan> plans[kNumGemmProviders];
  std::string why;
  const BlasLib* lib = load_blas(p, &why);
  KS_CHECK(lib, "use_gemm_provider(", provider_key(p), "): ", why);
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = plans[int(p)];
  if (!slot) {
    slot = std::make_unique<Plan>(single(lib));
    slot->summary = describe(*slot, nullptr, "set by use_gemm_provider");
  }
  g_plan.store(slot.get(), std::memory_order_release);
  g_blas_threads.store(-1);  // the newly routed library may hold another count
}

void use_default_gemm() {
  const Plan* p = default_plan();
  if (!p) throw Error(default_state().status.message());
  g_plan.store(p, std::memory_order_release);
  g_blas_threads.store(-1);
}

ScopedGemmProvider::ScopedGemmProvider(GemmProvider p) : saved_(g_plan.load(std::memory_order_acquire)) {
  use_gemm_provider(p);
}

ScopedGemmProvider::~ScopedGemmProvider() {
  g_plan.store(static_cast<const Plan*>(saved_), std::memory_order_release);
  g_blas_threads.store(-1);
}

void sync_blas_threads(int n) {
  if (n <= 0) n = omp_get_max_threads();
  if (g_blas_threads.exchange(n) == n) return;
  // The OpenMP builds run on OpenMP's own team and only need to be told its
  // size; the pthread OpenBLAS (a fallback) keeps a second pool, which never
  // runs while an OpenMP region does (GEMMs are called between regions).
  const Plan* p = active_plan();
  for (const BlasLib* l : p->by_class) l->set_num_threads(n);
}

namespace {

// Deterministic mode's tiles of C: fixed sizes, so the set of library calls
// (and each call's shape and operands) depends only on the problem, never on
// the thread count; each call runs single-threaded with all of K, so every
// element of C is computed by the same instruction sequence whichever
// thread runs its tile. 256 x 256 keeps a tile's A and B panels in L2 and
// leaves enough tiles for a few threads on the training step's shapes.
constexpr int64_t kDetTileM = 256, kDetTileN = 256;

void sgemm_tiled(const BlasLib* lib, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const int64_t tm = (M + kDetTileM - 1) / kDetTileM, tn = (N + kDetTileN - 1) / kDetTileN, tiles = tm * tn;
  // The library's own pool stays at one thread: the tiles are the parallelism.
  sync_blas_threads(1);
  const int team = omp_get_max_threads();
  const bool par = tiles > 1 && M * N * K >= (int64_t(1) << 18) && team > 1;
  // Serial tiles still run with a one-thread OpenMP setting: oneDNN sizes its
  // team from it (and splits K when it has threads to spare).
  if (!par) omp_set_num_threads(1);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / tn) * kDetTileM, j0 = (t % tn) * kDetTileN;
    const int64_t mi = std::min(kDetTileM, M - i0), nj = std::min(kDetTileN, N - j0);
    // Rows i0.. of op(A): rows of A, or columns when A is stored transposed; likewise for op(B)'s columns.
    const float* a = trans_a ? A + i0 : A + i0 * lda;
    const float* b = trans_b ? B + j0 * ldb : B + j0;
    lib->sgemm(trans_a, trans_b, mi, nj, K, alpha, a, lda, b, ldb, beta, C + i0 * ldc + j0, ldc);
  }
  if (!par) omp_set_num_threads(team);
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  KS_CHECK(M >= 0 && N >= 0 && K >= 0, "sgemm: negative size M=", M, " N=", N, " K=", K);
  KS_CHECK(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N, "sgemm: leading dimension too small");
  KS_CHECK(M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && K < (int64_t(1) << 31),
           "sgemm: dimension over the 32-bit BLAS interface limit");
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.f) {
    // BLAS would scale C by beta; do it here so beta == 0 also clears NaN garbage.
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  const Plan* p = active_plan();
  if (deterministic()) {
    sgemm_tiled(p->by_class[int(gemm_class(trans_a, trans_b))], trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                beta, C, ldc);
    return;
  }
  // Inside a parallel region the caller owns the threads: leave the pool size alone.
  if (!omp_in_parallel()) sync_blas_threads(omp_get_max_threads());
  p->by_class[int(gemm_class(trans_a, trans_b))]->sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                                        ldc);
}

}  // namespace kestrel::cpu
