// Which loaded library runs which GEMM: KESTREL_BLAS parsing, the one-time
// micro-benchmark of the candidates on the shapes of a training step and of
// rollout prefill, and its cache per machine (so later processes start
// without measuring). gemm.cpp strings these together; they are separate so
// that tests can drive each part.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/blas_loader.h"
#include "core/files.h"
#include "core/status.h"

namespace kestrel::cpu {

// KESTREL_BLAS: null / "" / "auto" -> nullopt (choose); "openblas", "blis",
// "dnnl" -> that provider; anything else is an error naming the variable and
// the valid values.
Result<std::optional<GemmProvider>> blas_from_env(const char* value);

// The GEMMs of a dense layer come in three transpose patterns, and libraries
// differ per pattern (oneDNN 2.6 leads on x@W^T and dY@W on AVX-512 and
// trails on dY^T@X), so the choice is made per pattern.
enum class GemmClass { NT = 0, NN = 1, TN = 2 };  // x@W^T (forward), dY@W (dX), dY^T@X (dW)
inline constexpr int kNumGemmClasses = 3;
const char* gemm_class_name(GemmClass c);  // "x@W^T", "dY@W", "dY^T@X"
// The class a call belongs to; TT (unused by Kestrel) runs with NN's library.
inline GemmClass gemm_class(bool trans_a, bool trans_b) {
  return trans_a && !trans_b ? GemmClass::TN : trans_b && !trans_a ? GemmClass::NT : GemmClass::NN;
}

struct GemmChoice {
  GemmProvider by_class[kNumGemmClasses] = {GemmProvider::OpenBLAS, GemmProvider::OpenBLAS, GemmProvider::OpenBLAS};
  double gflops[kNumGemmClasses] = {0, 0, 0};  // measured rate of the chosen library per class; 0: not measured
  // Share of the measurement's wall time x threads that this process ran on
  // a core. Below kBusyShare another process took cores (a build, a second
  // test) and the ranking is doubtful: the log says so and how to measure
  // again (delete the file). It is not re-measured by itself: a cached
  // choice never changes under a run, so a resumed run rounds as before.
  double cpu_share = 1.0;
  bool doubtful() const { return cpu_share < kBusyShare; }
  static constexpr double kBusyShare = 0.85;
};

// One candidate's measured GFLOP/s per class.
struct ProviderScore {
  const BlasLib* lib;
  double gflops[kNumGemmClasses];
};

// The clocks of the micro-benchmarks (this one and packed_choice.h's):
// monotonic wall seconds and this process's CPU seconds (all threads), whose
// ratio tells whether other processes held the cores meanwhile.
double now_s();
double process_cpu_s();

struct GemmMeasurement {
  std::vector<ProviderScore> scores;
  double seconds = 0;      // wall time taken
  double cpu_share = 1.0;  // process CPU time / (wall time x threads)
};
// Times every library on the micro-benchmark shapes at the current OpenMP
// thread count, interleaved (rep r of every library before rep r + 1) so
// that a burst of load on a shared machine hits all of them alike; best of
// up to 3 reps, fewer past a 2.5 s budget. A library over 1.5x slower than
// the fastest on the warm-up pass is not timed further. About 0.5 s on 2
// idle cores with three libraries.
GemmMeasurement measure_gemm_providers(const std::vector<const BlasLib*>& libs);


// The choice from scores: the best library overall (by total time over all
// shapes), and per class another one only where it is at least 5% faster
// (a near tie keeps one library: fewer packing buffers, steadier numbers).
GemmChoice pick_from_scores(const std::vector<ProviderScore>& scores);

// ---------------------------------------------------------------- cache
// Key: CPU vendor/brand/family/model/stepping, every candidate's version
// string (a library upgrade re-measures) and the thread count.
std::string gemm_cache_key(const CpuFeatures& f, const std::vector<const BlasLib*>& libs, int threads);
// $KESTREL_CACHE, else $HOME/.cache/kestrel; "" when neither is set.
std::string gemm_cache_dir();
// <dir>/gemm-<64-bit hash of key, hex>.json: one small file per key, so
// processes with different keys never rewrite each other's entry.
std::string gemm_cache_file(const std::string& dir, const std::string& key);
// <dir>/<prefix>-<hash of key>.json: the same naming for the other per-machine
// verdicts (packed_choice.h's "packed").
std::string cache_file(const std::string& dir, const char* prefix, const std::string& key);

// A cache file's JSON when it holds key's entry; nullopt when there is no
// file or it is another key's (a hash collision); an error naming the file
// when it is not a JSON object with a "key". The GEMM choice's and the
// packed-weight verdict's readers (packed_choice.h) check their own fields.
Result<std::optional<nlohmann::json>> read_cache_entry(const std::string& path, const std::string& key);

// Entry fields: key, classes.{x@W^T,dY@W,dY^T@X}.{provider,gflops}, cpu_share.
// nullopt: no file, or a file for another key (a hash collision). An error:
// the file exists but is not a valid entry (the caller notes it and rewrites).
Result<std::optional<GemmChoice>> read_gemm_cache(const std::string& path, const std::string& key);
// The entry's text (JSON).
std::string gemm_cache_text(const std::string& key, const GemmChoice& c);
// Atomic (temp file + rename): a concurrent reader sees the old or new file.
Status write_gemm_cache(const std::string& path, const std::string& key, const GemmChoice& c);
// The choice every process of this machine will use: ours when we are the
// first to publish it, else the valid entry another process published while
// we measured (several processes starting at once on a fresh machine, e.g.
// ctest -j2, all measure; the first to finish decides for all of them, so a
// test that compares two runs cannot see two roundings). The file is created
// only if absent (link of a temp file); a corrupt one is replaced.
Result<GemmChoice> publish_gemm_cache(const std::string& path, const std::string& key, const GemmChoice& c);
// The first-writer-wins step on its own: creates path with text only if it
// does not exist (link of a complete temp file, so a reader never sees part
// of it). true: ours is published; false: another process's file was there
// first (unchanged).
Result<bool> publish_file_once(const std::string& path, const std::string& text);

// The per-machine verdict every process will use (the GEMM choice's, the
// packed-weight verdict's in packed_choice.h): `ours` (as `text`) when this
// process publishes first, else the entry another process published, read
// with read(path, key); a corrupt entry or another key's (a hash collision)
// is replaced by ours.
template <class T, class Read>
Result<T> publish_verdict(const std::string& path, const std::string& key, const std::string& text, const T& ours,
                          Read read) {
  KS_ASSIGN(const bool first, publish_file_once(path, text));
  if (first) return ours;
  Result<std::optional<T>> theirs = read(path, key);
  if (theirs.is_ok() && theirs->has_value()) return **theirs;
  KS_TRY(write_file_atomic(path, text));
  return ours;
}

}  // namespace kestrel::cpu
