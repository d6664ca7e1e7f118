#include "backend/cpu/blas_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "core/status.h"

#ifndef KESTREL_LIBDIR
#define KESTREL_LIBDIR "/usr/lib/x86_64-linux-gnu"
#endif

namespace kestrel::cpu {

const char* provider_key(GemmProvider p) {
  switch (p) {
    case GemmProvider::OpenBLAS: return "openblas";
    case GemmProvider::BLIS: return "blis";
    case GemmProvider::OneDNN: return "dnnl";
  }
  return "?";
}

const char* provider_title(GemmProvider p) {
  switch (p) {
    case GemmProvider::OpenBLAS: return "OpenBLAS";
    case GemmProvider::BLIS: return "BLIS";
    case GemmProvider::OneDNN: return "oneDNN";
  }
  return "?";
}

// ---------------------------------------------------------------- core table

namespace {
std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = char(std::tolower(static_cast<unsigned char>(c)));
  return o;
}
}  // namespace

CoreLevel openblas_core_level(std::string_view corename) {
  // DYNAMIC_ARCH core names of OpenBLAS 0.3.x (driver/others/dynamic.c corename[]).
  static const std::pair<const char*, CoreLevel> kTable[] = {
      {"skylakex", CoreLevel::Avx512},   {"cooperlake", CoreLevel::Avx512}, {"sapphirerapids", CoreLevel::Avx512},
      {"haswell", CoreLevel::Avx2},      {"zen", CoreLevel::Avx2},          {"sandybridge", CoreLevel::Avx},
      {"bulldozer", CoreLevel::Avx},     {"piledriver", CoreLevel::Avx},    {"steamroller", CoreLevel::Avx},
      {"excavator", CoreLevel::Avx},     {"prescott", CoreLevel::PreAvx},   {"core2", CoreLevel::PreAvx},
      {"penryn", CoreLevel::PreAvx},     {"dunnington", CoreLevel::PreAvx}, {"nehalem", CoreLevel::PreAvx},
      {"atom", CoreLevel::PreAvx},       {"opteron", CoreLevel::PreAvx},    {"opteron_sse3", CoreLevel::PreAvx},
      {"barcelona", CoreLevel::PreAvx},  {"bobcat", CoreLevel::PreAvx},     {"nano", CoreLevel::PreAvx},
      {"katmai", CoreLevel::PreAvx},     {"coppermine", CoreLevel::PreAvx}, {"northwood", CoreLevel::PreAvx},
      {"banias", CoreLevel::PreAvx},     {"athlon", CoreLevel::PreAvx},     {"unknown", CoreLevel::PreAvx}};
  const std::string n = lower(corename);
  for (const auto& [name, level] : kTable)
    if (n == name) return level;
  return CoreLevel::Unknown;
}

CoreLevel blis_arch_level(std::string_view arch) {
  static const std::pair<const char*, CoreLevel> kTable[] = {
      {"skx", CoreLevel::Avx512},       {"knl", CoreLevel::Avx512},        {"zen4", CoreLevel::Avx512},
      {"zen5", CoreLevel::Avx512},      {"haswell", CoreLevel::Avx2},      {"zen", CoreLevel::Avx2},
      {"zen2", CoreLevel::Avx2},        {"zen3", CoreLevel::Avx2},         {"sandybridge", CoreLevel::Avx},
      {"bulldozer", CoreLevel::Avx},    {"piledriver", CoreLevel::Avx},    {"steamroller", CoreLevel::Avx},
      {"excavator", CoreLevel::Avx},    {"penryn", CoreLevel::PreAvx},     {"generic", CoreLevel::PreAvx}};
  const std::string n = lower(arch);
  for (const auto& [name, level] : kTable)
    if (n == name) return level;
  return CoreLevel::Unknown;
}

const char* core_level_name(CoreLevel l) {
  switch (l) {
    case CoreLevel::PreAvx: return "pre-AVX";
    case CoreLevel::Avx: return "AVX";
    case CoreLevel::Avx2: return "AVX2";
    case CoreLevel::Avx512: return "AVX-512";
    case CoreLevel::Unknown: break;
  }
  return "unknown";
}

CoreLevel machine_core_level(const CpuFeatures& f) {
  if (f.has_avx512()) return CoreLevel::Avx512;
  if (f.has_avx2_fma()) return CoreLevel::Avx2;
  if (f.os_ymm) return CoreLevel::Avx;
  return CoreLevel::PreAvx;
}

CoreChoice choose_openblas_core(const CpuFeatures& f, std::string_view reported, std::string_view user_coretype) {
  CoreChoice c;
  const CoreLevel want = machine_core_level(f), got = openblas_core_level(reported);
  const std::string machine = std::string(core_level_name(want)) + " " + (f.vendor.empty() ? "CPU" : f.vendor);
  if (!user_coretype.empty()) {
    // The user's word wins (it is also how run_tests.sh asks for a second
    // kernel family), but a narrower core than the machine's is said loudly.
    c.reason = "OPENBLAS_CORETYPE=" + std::string(user_coretype) + " set by the user";
    if (got != CoreLevel::Unknown && got < want) {
      c.below_isa = true;
      c.reason += ": " + std::string(core_level_name(got)) + " kernels on an " + machine + " (slower; unset it)";
    }
    return c;
  }
  if (got == CoreLevel::Unknown) {
    c.reason = "core " + std::string(reported) + " is not in Kestrel's table: kept";
    return c;
  }
  if (got >= want) return c;
  // Below the machine: the widest family this OpenBLAS generation has for
  // the vendor, then the floors. SkylakeX and Cooperlake share their SGEMM
  // kernel (Cooperlake adds only BF16 ones), so SkylakeX serves every
  // AVX-512 CPU; Zen 4 is mapped to SkylakeX by OpenBLAS itself since 0.3.22.
  if (want == CoreLevel::Avx512) c.force = {"SkylakeX"};
  if (want >= CoreLevel::Avx2) {
    if (f.is_amd()) c.force.push_back("Zen");
    c.force.push_back("Haswell");
  }
  if (want >= CoreLevel::Avx) c.force.push_back("Sandybridge");
  c.reason = "it reported " + std::string(reported) + " on an " + machine;
  return c;
}

// ---------------------------------------------------------------- BlasLib

namespace {
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };
using cblas_sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                                float*, int);
using bli_sgemm_fn = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                              const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
using dnnl_sgemm_fn = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                              int64_t, float, float*, int64_t);
constexpr int kBlisNoTrans = 0, kBlisTrans = 8;  // BLIS_NO_TRANSPOSE, BLIS_TRANSPOSE (BLIS_BITVAL_TRANS)
}  // namespace

void BlasLib::sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
  switch (kind) {
    case GemmProvider::OpenBLAS:
      reinterpret_cast<cblas_sgemm_fn>(gemm)(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, int(M), int(N),
                                             int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
      return;
    case GemmProvider::BLIS:
      // BLIS's native API, row-major as (row stride, column stride) = (ld, 1).
      reinterpret_cast<bli_sgemm_fn>(gemm)(ta ? kBlisTrans : kBlisNoTrans, tb ? kBlisTrans : kBlisNoTrans, M, N, K,
                                           &alpha, A, lda, 1, B, ldb, 1, &beta, C, ldc, 1);
      return;
    case GemmProvider::OneDNN: {
      const int st = reinterpret_cast<dnnl_sgemm_fn>(gemm)(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B,
                                                           ldb, beta, C, ldc);
      KS_CHECK(st == 0, "dnnl_sgemm failed with status ", st, " (M=", M, " N=", N, " K=", K, ")");
      return;
    }
  }
}

void BlasLib::set_num_threads(int n) const {
  if (!set_threads) return;  // oneDNN's OMP build sizes every call by omp_get_max_threads()
  if (kind == GemmProvider::BLIS)
    reinterpret_cast<void (*)(int64_t)>(set_threads)(n);  // dim_t is 64-bit in Debian's BLIS
  else
    reinterpret_cast<void (*)(int)>(set_threads)(n);
}

std::string openblas_openmp_path() { return std::string(KESTREL_LIBDIR) + "/openblas-openmp/libopenblas.so.0"; }

// ---------------------------------------------------------------- OpenBLAS

namespace {

BlasLib* new_lib(GemmProvider kind) {
  auto* l = new BlasLib;
  l->kind = kind;
  return l;
}

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

std::string corename_of(void* h) {
  auto f = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_corename"));
  return f ? f() : "";
}

// OPENBLAS_CORETYPE set to `value` (nullopt: unset) for the life of the object,
// then restored. The library reads it once, in its constructor, so only the
// dlopen inside the scope sees it. setenv is not thread-safe against a
// concurrent getenv: the CLI loads the GEMM at startup, before threads exist.
class CoretypeScope {
 public:
  explicit CoretypeScope(const std::optional<std::string>& value) {
    if (const char* v = std::getenv("OPENBLAS_CORETYPE")) saved_ = v;
    if (value)
      setenv("OPENBLAS_CORETYPE", value->c_str(), 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
  }
  ~CoretypeScope() {
    if (saved_)
      setenv("OPENBLAS_CORETYPE", saved_->c_str(), 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
  }

 private:
  std::optional<std::string> saved_;
};

struct OpenblasLoad {
  void* handle = nullptr;
  std::string first_core, core, note;
  bool below_isa = false;
};

// dlopen `path` (RTLD_LOCAL: its cblas_ symbols never interpose on another
// library's), check its core, reload with OPENBLAS_CORETYPE when below the
// machine. `first_env` is the OPENBLAS_CORETYPE of the first load (the
// user's, or a simulated guess in tests); `user` is what counts as the user's.
Result<OpenblasLoad> load_openblas_at(const std::string& path, const std::optional<std::string>& first_env,
                                      const std::string& user) {
  if (void* already = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    // Someone (an embedding process) initialised it already: its core is fixed.
    OpenblasLoad l{already, corename_of(already), corename_of(already), "", false};
    const CoreChoice c = choose_openblas_core(cpu_features(), l.core, user);
    l.below_isa = c.below_isa || !c.force.empty();
    l.note = c.force.empty() ? c.reason : "already loaded by the process with core " + l.core + ": kept";
    return l;
  }
  OpenblasLoad l;
  {
    CoretypeScope env(first_env);
    l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (!l.handle) return KS_ERR(dl_error());
  l.first_core = l.core = corename_of(l.handle);
  const CoreChoice c = choose_openblas_core(cpu_features(), l.core, user);
  l.note = c.reason;
  l.below_isa = c.below_isa;
  if (c.force.empty()) return l;
  const CoreLevel want = machine_core_level(cpu_features());
  for (const std::string& core : c.force) {
    // Unload fully (no other reference: checked with RTLD_NOLOAD above), so
    // the reload runs the constructor, and with it the core choice, again.
    dlclose(l.handle);
    {
      CoretypeScope env(core);
      l.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (!l.handle) return KS_ERR("reload with OPENBLAS_CORETYPE=", core, ": ", dl_error());
    l.core = corename_of(l.handle);
    const CoreLevel got = openblas_core_level(l.core);
    if (got >= want || got == CoreLevel::Unknown) {
      l.note = "OPENBLAS_CORETYPE=" + core + " set: " + c.reason;
      return l;
    }
  }
  l.below_isa = true;
  l.note = c.reason + "; no core at the machine's level in this build, kept " + l.core;
  return l;
}

const BlasLib* load_openblas(std::string* why) {
  const char* user_env = std::getenv("OPENBLAS_CORETYPE");
  const std::string user = user_env ? user_env : "";
  const std::optional<std::string> first = user_env ? std::optional<std::string>(user) : std::nullopt;
  std::string errors;
  for (const std::string& path : {openblas_openmp_path(), std::string("libopenblas.so.0")}) {
    Result<OpenblasLoad> r = load_openblas_at(path, first, user);
    if (!r.is_ok()) {
      errors += (errors.empty() ? "" : "; ") + r.status().message();
      continue;
    }
    void* h = r->handle;
    auto* lib = new_lib(GemmProvider::OpenBLAS);
    lib->handle = h;
    lib->gemm = dlsym(h, "cblas_sgemm");
    lib->set_threads = dlsym(h, "openblas_set_num_threads");
    if (!lib->gemm || !lib->set_threads) {
      errors += path + ": no cblas_sgemm/openblas_set_num_threads";
      delete lib;
      continue;
    }
    auto parallel = reinterpret_cast<int (*)()>(dlsym(h, "openblas_get_parallel"));
    auto config = reinterpret_cast<const char* (*)()>(dlsym(h, "openblas_get_config"));
    const int mode = parallel ? parallel() : -1;  // 0 serial, 1 pthread, 2 openmp
    const std::string cfg = config ? config() : "OpenBLAS";
    // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... SkylakeX MAX_THREADS=64": the version is the second word.
    std::string ver = cfg.substr(0, cfg.find(' ', 9));
    lib->title = ver + " " + r->core + (mode == 2 ? " (openmp)" : mode == 1 ? " (pthread)" : " (serial)");
    lib->version = cfg + " core " + r->core;
    lib->note = r->note;
    lib->below_isa = r->below_isa;
    return lib;
  }
  if (why) *why = "OpenBLAS: " + errors;
  return nullptr;
}

const BlasLib* load_blis(std::string* why) {
  // Debian's libblis.so.4 alternative; the OpenMP build is the one installed by scripts/install_deps.sh.
  void* h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (why) *why = "BLIS: " + dl_error();
    return nullptr;
  }
  auto* lib = new_lib(GemmProvider::BLIS);
  lib->handle = h;
  lib->gemm = dlsym(h, "bli_sgemm");
  lib->set_threads = dlsym(h, "bli_thread_set_num_threads");
  auto version = reinterpret_cast<const char* (*)()>(dlsym(h, "bli_info_get_version_str"));
  auto arch_id = reinterpret_cast<int (*)()>(dlsym(h, "bli_arch_query_id"));
  auto arch_str = reinterpret_cast<const char* (*)(int)>(dlsym(h, "bli_arch_string"));
  if (!lib->gemm || !lib->set_threads) {
    if (why) *why = "BLIS: libblis.so.4 lacks bli_sgemm/bli_thread_set_num_threads";
    delete lib;
    return nullptr;
  }
  const std::string arch = arch_id && arch_str ? arch_str(arch_id()) : "?";
  lib->title = std::string("BLIS ") + (version ? version() : "?") + " " + arch;
  lib->version = lib->title;
  // BLIS has no override that is safe to set: BLIS_ARCH_TYPE naming a
  // sub-configuration the build lacks (Debian's has no "skx") aborts the
  // process. So a narrow one is only reported, and auto passes BLIS over.
  const CoreLevel got = blis_arch_level(arch), want = machine_core_level(cpu_features());
  lib->below_isa = got != CoreLevel::Unknown && got < want;
  if (lib->below_isa)
    lib->note = "BLIS picked its " + arch + " (" + core_level_name(got) + ") kernels on an " + core_level_name(want) +
                " CPU";
  return lib;
}

const BlasLib* load_dnnl(std::string* why) {
  void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    if (why) *why = "oneDNN: " + dl_error() + " (install libdnnl2: scripts/install_deps.sh)";
    return nullptr;
  }
  struct Version {
    int major, minor, patch;
    const char* hash;
    unsigned cpu_runtime, gpu_runtime;
  };
  auto version = reinterpret_cast<const Version* (*)()>(dlsym(h, "dnnl_version"));
  auto isa = reinterpret_cast<int (*)()>(dlsym(h, "dnnl_get_effective_cpu_isa"));
  auto* lib = new_lib(GemmProvider::OneDNN);
  lib->handle = h;
  lib->gemm = dlsym(h, "dnnl_sgemm");
  const Version* v = version ? version() : nullptr;
  // Only the OpenMP runtime (DNNL_RUNTIME_OMP = 2) shares Kestrel's threads;
  // a TBB or threadpool build would bring its own pool.
  if (!lib->gemm || !v || v->cpu_runtime != 2u) {
    if (why) *why = "oneDNN: libdnnl.so.2 lacks dnnl_sgemm or is not the OpenMP build";
    delete lib;
    return nullptr;
  }
  std::string isa_name = "?";
  if (isa) switch (isa()) {  // dnnl_cpu_isa_t of oneDNN 2.x
      case 0x1: isa_name = "sse41"; break;
      case 0x3: isa_name = "avx"; break;
      case 0x7: isa_name = "avx2"; break;
      case 0x407: isa_name = "avx2_vnni"; break;
      case 0x27: isa_name = "avx512_core"; break;
      case 0x67: isa_name = "avx512_core_vnni"; break;
      case 0xe7: isa_name = "avx512_core_bf16"; break;
      case 0x3e7: isa_name = "avx512_core_amx"; break;
      default: {
        char b[32];
        std::snprintf(b, sizeof b, "isa 0x%x", isa());
        isa_name = b;
      }
    }
  lib->title = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
               " " + isa_name;
  lib->version = lib->title + (v->hash ? std::string(" ") + v->hash : "");
  return lib;
}

}  // namespace

const BlasLib* load_blas(GemmProvider p, std::string* why_not) {
  // Loaded once, never unloaded: a GEMM may run on another thread at exit.
  static std::mutex mu;
  static const BlasLib* libs[kNumGemmProviders] = {};
  static std::string errors[kNumGemmProviders];
  static bool tried[kNumGemmProviders] = {};
  std::lock_guard<std::mutex> lock(mu);
  const int i = int(p);
  if (!tried[i]) {
    tried[i] = true;
    libs[i] = p == GemmProvider::OpenBLAS ? load_openblas(&errors[i])
              : p == GemmProvider::BLIS   ? load_blis(&errors[i])
                                          : load_dnnl(&errors[i]);
  }
  if (!libs[i] && why_not) *why_not = errors[i];
  return libs[i];
}

Result<std::string> openblas_reload_probe(const std::string& path, const std::string& simulated_guess) {
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(h);
    return KS_ERR("openblas_reload_probe: ", path, " is already loaded in this process");
  }
  KS_ASSIGN(OpenblasLoad l, load_openblas_at(path, simulated_guess, ""));
  std::string out = l.first_core + " -> " + l.core + ": " + l.note;
  dlclose(l.handle);
  return out;
}

}  // namespace kestrel::cpu
