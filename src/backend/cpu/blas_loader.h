// The GEMM libraries, loaded at run time (dlopen) instead of linked: nothing
// of a BLAS runs before Kestrel has looked at the machine, so OpenBLAS's
// kernel family (its "core", chosen in its library constructor from cpuid)
// can be corrected before the first GEMM, and one binary can use whichever
// of OpenBLAS, BLIS and oneDNN is installed and fastest.
//
// Every library here runs its threads on Kestrel's OpenMP runtime (libgomp):
// the OpenMP build of OpenBLAS, Debian's OpenMP BLIS, oneDNN's OMP build. The
// pthread OpenBLAS is the last resort (its own pool spins against OpenMP's).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/cpu_features.h"

namespace kestrel::cpu {

enum class GemmProvider { OpenBLAS = 0, BLIS = 1, OneDNN = 2 };
inline constexpr int kNumGemmProviders = 3;

const char* provider_key(GemmProvider p);    // "openblas", "blis", "dnnl": the KESTREL_BLAS values
const char* provider_title(GemmProvider p);  // "OpenBLAS", "BLIS", "oneDNN"

// ---------------------------------------------------------------- OpenBLAS core choice
// The vector width an OpenBLAS core name stands for (openblas_get_corename()
// spellings, any case). Unknown: a name this table does not know (a newer
// OpenBLAS), which is trusted.
enum class CoreLevel { Unknown = -1, PreAvx = 0, Avx = 1, Avx2 = 2, Avx512 = 3 };
CoreLevel openblas_core_level(std::string_view corename);
const char* core_level_name(CoreLevel l);  // "pre-AVX", "AVX", "AVX2", "AVX-512", "unknown"

// The same for a BLIS sub-configuration (bli_arch_string()): "skx" AVX-512,
// "haswell"/"zen3" AVX2, ... BLIS picks it by feature and FMA-unit count;
// 0.9 falls back to "haswell" on AVX-512 CPUs whose FMA units it cannot count.
CoreLevel blis_arch_level(std::string_view arch);

// The level this machine runs (AVX-512 only with F/BW/VL/DQ and zmm state).
CoreLevel machine_core_level(const CpuFeatures& f);

// What to do with the core OpenBLAS reported. Pure: features, the reported
// core and the user's OPENBLAS_CORETYPE (empty when unset) in, decision out.
struct CoreChoice {
  // Cores to set OPENBLAS_CORETYPE to before reloading, tried in order until
  // one reports the machine's level. Empty: keep the reported core.
  std::vector<std::string> force;
  std::string reason;      // for the GEMM log line; empty when nothing is worth saying
  bool below_isa = false;  // the kept core is below the machine's level (user's choice)
};
CoreChoice choose_openblas_core(const CpuFeatures& f, std::string_view reported, std::string_view user_coretype);

// ---------------------------------------------------------------- loaded libraries
// One loaded library. Entry points are raw dlsym results; sgemm() dispatches.
struct BlasLib {
  GemmProvider kind = GemmProvider::OpenBLAS;
  std::string title;    // "OpenBLAS 0.3.21 SkylakeX (openmp build)", "oneDNN 2.6.3 avx512_core_amx"
  std::string version;  // identifies the library build for the selection cache
  std::string note;     // why the OpenBLAS core was changed or kept (empty: nothing to say)
  bool below_isa = false;  // its kernels are narrower than the machine's ISA
  void* handle = nullptr;
  void* gemm = nullptr;         // cblas_sgemm / bli_sgemm / dnnl_sgemm
  void* set_threads = nullptr;  // openblas_set_num_threads(int) / bli_thread_set_num_threads(dim_t); null: OpenMP's

  // Row-major C[M,N] = alpha op(A) op(B) + beta C, sizes already checked (< 2^31).
  void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
             const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const;
  void set_num_threads(int n) const;
};

// Loads provider p once per process (thread-safe; later calls return the same
// object). nullptr when it is not installed or not usable; *why_not says why.
// OpenBLAS: the OpenMP build first, then the default libopenblas.so.0; its
// core is checked against the machine with choose_openblas_core and, when
// below it, the library is unloaded and loaded again with OPENBLAS_CORETYPE
// set for the reload only (the user's environment is restored after).
const BlasLib* load_blas(GemmProvider p, std::string* why_not = nullptr);

// The OpenBLAS reload path on its own, for tests: loads `path` with
// OPENBLAS_CORETYPE=simulated_guess as if OpenBLAS had guessed that core,
// then applies choose_openblas_core (no user setting) and reloads as
// load_blas would. Returns "<first core> -> <final core>: <reason>", or an
// error when the library is absent or already loaded in this process (a
// loaded library cannot be re-initialised). The handle is closed after.
Result<std::string> openblas_reload_probe(const std::string& path, const std::string& simulated_guess);

// Where load_blas looks for the OpenMP OpenBLAS.
std::string openblas_openmp_path();

}  // namespace kestrel::cpu
