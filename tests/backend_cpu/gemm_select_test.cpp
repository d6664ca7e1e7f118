// GEMM library selection: the OpenBLAS core table, the reload that corrects a
// wrong core, KESTREL_BLAS parsing, the per-machine cache, the per-class
// pick, and every installed library's sgemm against a double reference.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>

#include "backend/cpu/blas_select.h"
#include "backend/cpu/gemm.h"

namespace kestrel::cpu {
namespace {

CpuFeatures avx2_cpu(const char* vendor) {
  CpuFeatures f;
  f.vendor = vendor;
  f.family = 6;
  f.fma = f.avx2 = f.f16c = f.os_ymm = true;
  return f;
}
CpuFeatures avx512_cpu(const char* vendor) {
  CpuFeatures f = avx2_cpu(vendor);
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512cd = f.os_zmm = true;
  return f;
}

struct CoreRow {
  const char* what;
  CpuFeatures cpu;
  const char* reported;
  const char* user;                  // OPENBLAS_CORETYPE set by the user ("" = unset)
  std::vector<std::string> force;    // cores tried, in order
  bool below_isa;
};

TEST(OpenblasCore, ChoiceTable) {
  CpuFeatures zen4 = avx512_cpu("AuthenticAMD");
  zen4.family = 25;
  CpuFeatures no_zmm_state = avx512_cpu("GenuineIntel");
  no_zmm_state.os_zmm = false;  // OS does not save zmm: AVX-512 is not usable
  CpuFeatures sse_only;
  sse_only.vendor = "GenuineIntel";
  const CoreRow rows[] = {
      {"unknown AVX-512 Intel guessed Prescott", avx512_cpu("GenuineIntel"), "Prescott", "", {"SkylakeX", "Haswell", "Sandybridge"}, false},
      {"AVX-512 Intel guessed Haswell", avx512_cpu("GenuineIntel"), "Haswell", "", {"SkylakeX", "Haswell", "Sandybridge"}, false},
      {"AVX-512 Intel, SkylakeX", avx512_cpu("GenuineIntel"), "SkylakeX", "", {}, false},
      {"AVX-512 Intel, Cooperlake", avx512_cpu("GenuineIntel"), "Cooperlake", "", {}, false},
      {"AVX-512 Intel, newer core name", avx512_cpu("GenuineIntel"), "GraniteRapids", "", {}, false},
      {"Zen 3 guessed Prescott", avx2_cpu("AuthenticAMD"), "Prescott", "", {"Zen", "Haswell", "Sandybridge"}, false},
      {"Zen 3, Zen", avx2_cpu("AuthenticAMD"), "Zen", "", {}, false},
      {"Zen 3, Haswell", avx2_cpu("AuthenticAMD"), "Haswell", "", {}, false},
      {"Zen 4 guessed Zen", zen4, "Zen", "", {"SkylakeX", "Zen", "Haswell", "Sandybridge"}, false},
      {"Zen 4, SkylakeX", zen4, "SkylakeX", "", {}, false},
      {"Haswell-only Intel guessed Sandybridge", avx2_cpu("GenuineIntel"), "Sandybridge", "", {"Haswell", "Sandybridge"}, false},
      {"Haswell-only Intel, Haswell", avx2_cpu("GenuineIntel"), "Haswell", "", {}, false},
      {"AVX-512 without OS zmm state, Haswell", no_zmm_state, "Haswell", "", {}, false},
      {"pre-AVX machine, Prescott", sse_only, "Prescott", "", {}, false},
      {"user asks Prescott on AVX-512", avx512_cpu("GenuineIntel"), "Prescott", "Prescott", {}, true},
      {"user asks Haswell on AVX-512", avx512_cpu("GenuineIntel"), "Haswell", "Haswell", {}, true},
      {"user asks SkylakeX on AVX-512", avx512_cpu("GenuineIntel"), "SkylakeX", "SkylakeX", {}, false},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.what);
    const CoreChoice c = choose_openblas_core(r.cpu, r.reported, r.user);
    EXPECT_EQ(c.force, r.force);
    EXPECT_EQ(c.below_isa, r.below_isa);
    if (!r.force.empty()) {
      EXPECT_NE(c.reason.find(std::string("reported ") + r.reported), std::string::npos) << c.reason;
    }
    if (*r.user) {
      EXPECT_NE(c.reason.find("set by the user"), std::string::npos) << c.reason;
    }
  }
}

TEST(OpenblasCore, LevelNames) {
  EXPECT_EQ(openblas_core_level("SKYLAKEX"), CoreLevel::Avx512);
  EXPECT_EQ(openblas_core_level("sapphirerapids"), CoreLevel::Avx512);
  EXPECT_EQ(openblas_core_level("Zen"), CoreLevel::Avx2);
  EXPECT_EQ(openblas_core_level("Sandybridge"), CoreLevel::Avx);
  EXPECT_EQ(openblas_core_level("Prescott"), CoreLevel::PreAvx);
  EXPECT_EQ(openblas_core_level("Zen5000"), CoreLevel::Unknown);
  EXPECT_EQ(blis_arch_level("skx"), CoreLevel::Avx512);
  EXPECT_EQ(blis_arch_level("haswell"), CoreLevel::Avx2);  // what BLIS 0.9 picks on this AVX-512 Xeon
  EXPECT_EQ(blis_arch_level("zen3"), CoreLevel::Avx2);
  EXPECT_EQ(blis_arch_level("generic"), CoreLevel::PreAvx);
  EXPECT_EQ(blis_arch_level("a64fx"), CoreLevel::Unknown);
}

// The reload path for real: OpenBLAS is first initialised with a Prescott
// core, as it does on an AVX-512 CPU it does not know, and must come back
// with the machine's level. It runs in a fresh process (a death-test child
// re-executing this binary) because a library already initialised in this
// process cannot be initialised again.
TEST(OpenblasCore, ReloadCorrectsAWrongGuess) {
  if (machine_core_level(cpu_features()) < CoreLevel::Avx2) GTEST_SKIP() << "needs an AVX2 machine";
  if (!std::filesystem::exists(openblas_openmp_path())) GTEST_SKIP() << "libopenblas0-openmp not installed";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Result<std::string> r = openblas_reload_probe(openblas_openmp_path(), "Prescott");
        std::fprintf(stderr, "probe: %s\n", r.is_ok() ? r->c_str() : r.status().message().c_str());
        const std::string core = r.is_ok() ? r->substr(r->find("-> ") + 3) : "";
        const bool wide = openblas_core_level(core.substr(0, core.find(':'))) >= machine_core_level(cpu_features());
        std::_Exit(r.is_ok() && r->rfind("Prescott -> ", 0) == 0 && wide ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "probe: Prescott -> .*OPENBLAS_CORETYPE=.* set: it reported Prescott");
}

// The process's choice from the environment, each in a fresh process (the
// choice is made once per process): the child sets the variables, chooses,
// prints the GEMM line and exits 0 when it is what the variables ask for.
void expect_choice(const char* kestrel_blas, const char* coretype, const char* want_regex) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Set or cleared: the variables of the shell that runs the test must not leak in.
        kestrel_blas ? setenv("KESTREL_BLAS", kestrel_blas, 1) : unsetenv("KESTREL_BLAS");
        coretype ? setenv("OPENBLAS_CORETYPE", coretype, 1) : unsetenv("OPENBLAS_CORETYPE");
        Status st = gemm_init();
        std::fprintf(stderr, "init: %s\nsummary: %s\n", st.is_ok() ? "ok" : st.message().c_str(),
                     st.is_ok() ? gemm_summary().c_str() : "-");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), want_regex);
}

// Nothing may load a library before the child's setenv (the test body runs
// again in the child up to EXPECT_EXIT), so a library that is not installed is
// accepted as its "not loadable" error rather than probed first. OpenBLAS is
// required.
TEST(KestrelBlasEnv, ProcessChoice) {
  expect_choice("mkl", nullptr, "init: KESTREL_BLAS='mkl' is not a GEMM library: use one of auto, openblas, blis, dnnl");
  expect_choice("blis", nullptr, "summary: BLIS .*KESTREL_BLAS=blis|init: KESTREL_BLAS=blis: BLIS: ");
  expect_choice("dnnl", nullptr, "summary: oneDNN .*KESTREL_BLAS=dnnl|init: KESTREL_BLAS=dnnl: oneDNN: ");
  expect_choice("openblas", nullptr, "summary: OpenBLAS .*KESTREL_BLAS=openblas");
  // run_tests.sh's second kernel family: a user-set core is honoured and makes auto pick OpenBLAS.
  expect_choice(nullptr, "Haswell", "summary: OpenBLAS [^ ]+ Haswell .*set by the user.*because OPENBLAS_CORETYPE is set");
  if (machine_core_level(cpu_features()) > CoreLevel::PreAvx)
    expect_choice("auto", "Prescott", "summary: OpenBLAS [^ ]+ Prescott .*WARNING: OpenBLAS runs below this CPU's ISA");
}

// gemm_init settles the packed-weight switch too: a bad value stops the job
// there, naming the variable and its values (packed_choice.h).
TEST(KestrelBlasEnv, BadPackedWeightsSwitchStopsInit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv("KESTREL_BLAS");
        unsetenv("OPENBLAS_CORETYPE");
        setenv("KESTREL_PACKED_WEIGHTS", "yes", 1);
        Status st = gemm_init();
        std::fprintf(stderr, "init: %s\n", st.is_ok() ? "ok" : st.message().c_str());
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0),
      "init: KESTREL_PACKED_WEIGHTS='yes' is not a packing switch: use auto .*, 1 .* or 0");
}

TEST(KestrelBlasEnv, Values) {
  EXPECT_FALSE(blas_from_env(nullptr).value().has_value());
  EXPECT_FALSE(blas_from_env("").value().has_value());
  EXPECT_FALSE(blas_from_env("auto").value().has_value());
  EXPECT_EQ(blas_from_env("openblas").value(), GemmProvider::OpenBLAS);
  EXPECT_EQ(blas_from_env("blis").value(), GemmProvider::BLIS);
  EXPECT_EQ(blas_from_env("dnnl").value(), GemmProvider::OneDNN);
  auto bad = blas_from_env("mkl");
  ASSERT_FALSE(bad.is_ok());
  const std::string m = bad.status().message();
  EXPECT_NE(m.find("KESTREL_BLAS='mkl'"), std::string::npos) << m;
  EXPECT_NE(m.find("auto, openblas, blis, dnnl"), std::string::npos) << m;
  EXPECT_FALSE(blas_from_env("OpenBLAS").is_ok());  // exact spelling, as documented
}

std::string temp_dir(const char* name) {
  auto d = std::filesystem::temp_directory_path() / (std::string("kestrel_gemm_") + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(GemmCache, WriteReadCorruptOtherKey) {
  const std::string dir = temp_dir("cache");
  const std::string key = "GenuineIntel|Xeon|family 6 model 167 stepping 1|OpenBLAS 0.3.21|threads 2";
  const std::string file = gemm_cache_file(dir + "/sub", key);
  EXPECT_EQ(file.rfind(dir + "/sub/gemm-", 0), 0u) << file;
  EXPECT_NE(gemm_cache_file(dir, key), gemm_cache_file(dir, key + "x"));  // the key picks the file
  EXPECT_FALSE(read_gemm_cache(file, key).value().has_value());            // absent

  GemmChoice c;
  c.by_class[0] = GemmProvider::OneDNN;
  c.by_class[2] = GemmProvider::BLIS;
  c.gflops[0] = 181.5;
  c.gflops[1] = 170;
  c.gflops[2] = 99;
  c.cpu_share = 0.5;                                     // measured while another process held a core
  ASSERT_TRUE(write_gemm_cache(file, key, c).is_ok());  // creates the folder
  auto back = read_gemm_cache(file, key);
  ASSERT_TRUE(back.is_ok() && back->has_value()) << back.status().message();
  for (int k = 0; k < kNumGemmClasses; ++k) {
    EXPECT_EQ((*back)->by_class[k], c.by_class[k]);
    EXPECT_DOUBLE_EQ((*back)->gflops[k], c.gflops[k]);
  }
  EXPECT_TRUE((*back)->doubtful());
  EXPECT_FALSE(read_gemm_cache(file, key + " other").value().has_value());  // another key's entry
  for (const char* junk : {"{not json", "[]", "{\"key\": 3}", "{\"key\": \"K\", \"classes\": {}}"}) {
    SCOPED_TRACE(junk);
    const std::string k = std::string(junk).find("\"K\"") != std::string::npos ? "K" : key;
    std::ofstream(file) << junk;
    auto r = read_gemm_cache(file, k);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();
  }
  ASSERT_TRUE(write_gemm_cache(file, key, c).is_ok());  // a corrupt file is simply rewritten
  EXPECT_TRUE(read_gemm_cache(file, key).value().has_value());
  std::filesystem::remove_all(dir);
}

// Processes that measured at once: the first to publish decides for all.
TEST(GemmCache, FirstPublisherWins) {
  const std::string dir = ::testing::TempDir() + "/kestrel_gemm_publish";
  std::filesystem::remove_all(dir);
  const std::string file = dir + "/gemm-test.json", key = "publish-key";
  std::filesystem::create_directories(dir);
  GemmChoice first, second;
  first.by_class[0] = GemmProvider::OneDNN;
  second.by_class[0] = GemmProvider::OpenBLAS;
  auto a = publish_gemm_cache(file, key, first);
  ASSERT_TRUE(a.is_ok()) << a.status().message();
  EXPECT_EQ(a->by_class[0], GemmProvider::OneDNN);
  auto b = publish_gemm_cache(file, key, second);  // too late: gets the first one's
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(b->by_class[0], GemmProvider::OneDNN);
  { std::ofstream(file) << "{not json"; }  // a corrupt entry is replaced by the publisher
  auto c = publish_gemm_cache(file, key, second);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->by_class[0], GemmProvider::OpenBLAS);
  EXPECT_EQ(read_gemm_cache(file, key).value()->by_class[0], GemmProvider::OpenBLAS);
  for (const auto& e : std::filesystem::directory_iterator(dir))  // no temp files left behind
    EXPECT_EQ(e.path().filename().string().find(".publish."), std::string::npos) << e.path();
  std::filesystem::remove_all(dir);
}

TEST(GemmCache, KeyNamesMachineLibrariesAndThreads) {
  BlasLib a, b;
  a.version = "OpenBLAS 0.3.21 core SkylakeX";
  b.version = "oneDNN 2.6.3 avx512_core_amx";
  CpuFeatures f = avx512_cpu("GenuineIntel");
  f.model = 167;
  f.stepping = 1;
  const std::string k = gemm_cache_key(f, {&a, &b}, 2);
  for (const char* part : {"GenuineIntel", "model 167", "stepping 1", "OpenBLAS 0.3.21", "oneDNN 2.6.3", "threads 2"})
    EXPECT_NE(k.find(part), std::string::npos) << part << " in " << k;
  EXPECT_NE(k, gemm_cache_key(f, {&a, &b}, 1));
  EXPECT_NE(k, gemm_cache_key(f, {&a}, 2));
}

TEST(GemmPick, BestOverallThenPerClassWithMargin) {
  BlasLib ob, dn, bl;
  ob.kind = GemmProvider::OpenBLAS;
  dn.kind = GemmProvider::OneDNN;
  bl.kind = GemmProvider::BLIS;
  // oneDNN leads forward and dX, OpenBLAS dW by a wide margin: the overall
  // best is OpenBLAS (harmonic mean), oneDNN takes the classes it leads by > 5%.
  GemmChoice c = pick_from_scores({{&ob, {170, 170, 172}}, {&dn, {190, 176, 125}}, {&bl, {110, 110, 105}}});
  EXPECT_EQ(c.by_class[0], GemmProvider::OneDNN);
  EXPECT_EQ(c.by_class[1], GemmProvider::OpenBLAS);  // 176 < 1.05 x 170: a near tie keeps the overall best
  EXPECT_EQ(c.by_class[2], GemmProvider::OpenBLAS);
  EXPECT_DOUBLE_EQ(c.gflops[0], 190);
  EXPECT_DOUBLE_EQ(c.gflops[2], 172);
  c = pick_from_scores({{&bl, {50, 50, 50}}});
  EXPECT_EQ(c.by_class[1], GemmProvider::BLIS);
}

// The micro-benchmark itself: every candidate gets a rate per class, within its budget.
TEST(GemmMeasure, RatesEveryLibrary) {
  std::vector<const BlasLib*> libs;
  for (GemmProvider p : available_gemm_providers()) libs.push_back(load_blas(p));
  const GemmMeasurement m = measure_gemm_providers(libs);
  ASSERT_EQ(m.scores.size(), libs.size());
  double best = 0;
  for (const auto& s : m.scores)
    for (double g : s.gflops) best = std::max(best, g);
  EXPECT_GT(best, 1.0);      // GFLOP/s: a real GEMM ran
  EXPECT_LT(m.seconds, 30);  // budget 2.5 s after the first rep; generous for a loaded machine
  EXPECT_GT(m.cpu_share, 0);
  EXPECT_LE(m.cpu_share, 1);
  const GemmChoice c = pick_from_scores(m.scores);
  for (double g : c.gflops) EXPECT_GT(g, 0);
}

// Every installed library, every transpose pattern, beta 0 (C holds NaN) and
// beta 1, odd sizes; against a double reference.
TEST(GemmProviders, EachMatchesReference) {
  const auto providers = available_gemm_providers();
  ASSERT_FALSE(providers.empty());
  const int64_t M = 37, N = 29, K = 70;
  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C0(size_t(M * N));
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.11f * float(i));
  for (size_t i = 0; i < C0.size(); ++i) C0[i] = 0.01f * float(i % 13);
  for (GemmProvider p : providers) {
    ScopedGemmProvider scope(p);
    EXPECT_NE(gemm_summary().find(provider_title(p)), std::string::npos) << gemm_summary();
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.f, 1.f}) {
          SCOPED_TRACE(std::string(provider_key(p)) + (ta ? " A^T" : " A") + (tb ? " B^T" : " B") +
                       " beta=" + std::to_string(beta));
          // A is stored [M,K] or [K,M]; B [K,N] or [N,K] (the same numbers, read transposed).
          const int64_t lda = ta ? M : K, ldb = tb ? K : N;
          std::vector<float> C = beta == 0.f ? std::vector<float>(C0.size(), NAN) : C0;
          sgemm(ta, tb, M, N, K, 1.5f, A.data(), lda, B.data(), ldb, beta, C.data(), N);
          double worst = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double s = 0;
              for (int64_t k = 0; k < K; ++k)
                s += double(A[size_t(ta ? k * lda + i : i * lda + k)]) * double(B[size_t(tb ? j * ldb + k : k * ldb + j)]);
              const double want = 1.5 * s + (beta == 0.f ? 0.0 : double(C0[size_t(i * N + j)]));
              worst = std::max(worst, std::abs(double(C[size_t(i * N + j)]) - want));
            }
          EXPECT_LT(worst, 1e-4);
        }
  }
}

// 1 and 2 threads agree to f32 rounding with every library, and give the same
// bits with the ones that split only M and N across threads. Not every library
// does at every core: OpenBLAS 0.3.21's Haswell kernels (what it runs on AVX2
// machines and under OPENBLAS_CORETYPE=Haswell) round differently at 1 and 2
// threads on both shapes here, and oneDNN 2.6 splits K from 8 threads on for
// small M x N with a long K. What Kestrel promises is bits repeatable for a
// fixed thread count (RepeatableAtFixedThreadCount); across thread counts,
// two f32 orderings of a K-term dot product each lie within K * 2^-24 *
// sum_k |a_k b_k| of the exact value, so they differ by at most twice that.
TEST(GemmProviders, ThreadCountsAgreeToRounding) {
  const int saved = omp_get_max_threads();
  for (GemmProvider p : available_gemm_providers()) {
    ScopedGemmProvider scope(p);
    for (bool ta : {false, true}) {
      SCOPED_TRACE(std::string(provider_key(p)) + (ta ? " dW shape" : " forward shape"));
      const int64_t M = ta ? 512 : 1024, N = 384, K = ta ? 1024 : 256;
      std::vector<float> A(size_t(M * K)), B(size_t(K * N));
      for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.013f * float(i));
      for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.007f * float(i));
      std::vector<std::vector<float>> out;
      for (int t : {1, 2}) {
        omp_set_num_threads(t);
        std::vector<float> C(size_t(M * N));
        sgemm(ta, !ta, M, N, K, 1.f, A.data(), ta ? M : K, B.data(), ta ? N : K, 0.f, C.data(), N);
        out.push_back(C);
      }
      // sum_k |a_k b_k| per element, as the same GEMM of |A| and |B|.
      std::vector<float> absA(A.size()), absB(B.size()), mag(size_t(M * N));
      for (size_t i = 0; i < A.size(); ++i) absA[i] = std::abs(A[i]);
      for (size_t i = 0; i < B.size(); ++i) absB[i] = std::abs(B[i]);
      sgemm(ta, !ta, M, N, K, 1.f, absA.data(), ta ? M : K, absB.data(), ta ? N : K, 0.f, mag.data(), N);
      double worst = 0;  // |difference| / its bound
      for (size_t i = 0; i < out[0].size(); ++i)
        worst = std::max(worst, std::abs(double(out[0][i]) - out[1][i]) /
                                    (2.0 * double(K) * std::ldexp(1.0, -24) * double(mag[i]) + 1e-30));
      EXPECT_LE(worst, 1.0);
    }
  }
  omp_set_num_threads(saved);
}

// Same inputs, same thread count, same bits, including the shapes where
// oneDNN splits K (8 threads: more than this machine may have is fine, the
// partition follows the team size).
TEST(GemmProviders, RepeatableAtFixedThreadCount) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(8);
  for (GemmProvider p : available_gemm_providers()) {
    ScopedGemmProvider scope(p);
    for (const auto& [M, N, K] : {std::array<int64_t, 3>{128, 512, 2048}, {64, 64, 8192}}) {
      SCOPED_TRACE(std::string(provider_key(p)) + " dW " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                   std::to_string(K));
      std::vector<float> A(size_t(M * K)), B(size_t(K * N));
      for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * float(i));
      for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.11f * float(i));
      std::vector<std::vector<float>> out;
      for (int rep = 0; rep < 3; ++rep) {
        std::vector<float> C(size_t(M * N));
        sgemm(true, false, M, N, K, 1.f, A.data(), M, B.data(), N, 0.f, C.data(), N);
        out.push_back(C);
      }
      EXPECT_TRUE(out[0] == out[1] && out[1] == out[2]);
    }
  }
  omp_set_num_threads(saved);
}

// The process's choice: KESTREL_BLAS or auto, described by gemm_summary().
TEST(GemmProviders, DefaultChoiceIsDescribed) {
  use_default_gemm();
  const std::string s = gemm_summary();
  EXPECT_NE(s.find(" thread"), std::string::npos) << s;
  EXPECT_TRUE(s.find("auto:") != std::string::npos || s.find("KESTREL_BLAS=") != std::string::npos) << s;
  std::vector<float> A(64 * 64, 1.f), C(64 * 64);
  sgemm(false, true, 64, 64, 64, 1.f, A.data(), 64, A.data(), 64, 0.f, C.data(), 64);
  EXPECT_EQ(C[0], 64.f);
}

}  // namespace
}  // namespace kestrel::cpu
