#include "backend/cpu/blas_select.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "core/files.h"

namespace kestrel::cpu {

Result<std::optional<GemmProvider>> blas_from_env(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return std::optional<GemmProvider>();
  for (int i = 0; i < kNumGemmProviders; ++i)
    if (v == provider_key(GemmProvider(i))) return std::optional<GemmProvider>(GemmProvider(i));
  return KS_ERR("KESTREL_BLAS='", v, "' is not a GEMM library: use one of auto, openblas, blis, dnnl (or unset it)");
}

const char* gemm_class_name(GemmClass c) {
  switch (c) {
    case GemmClass::NT: return "x@W^T";
    case GemmClass::NN: return "dY@W";
    case GemmClass::TN: return "dY^T@X";
  }
  return "?";
}

// ---------------------------------------------------------------- micro-benchmark

namespace {

struct BenchShape {
  GemmClass cls;
  int64_t M, N, K;
  float beta;    // dW accumulates into the gradient (beta 1), as the training step does
  double count;  // how many GEMMs of this shape one step runs (a class's rate weighs shapes by it)
};
// The small model's training step at T = 2048 tokens (a micro-batch as the
// benchmarks and the built-in run pack them), each shape weighted by how
// often a layer runs it; the lm_head at half the small model's vocabulary
// (the same rate in half the time), a quarter per layer as an 8-layer model
// runs it. At T = 1024 the libraries ranked differently from the step they
// then ran (docs/benchmarks.md), so the shapes are the step's own. Rollout
// decode shapes are not in the mix: the rollout's GEMMs of more than 32 rows
// run on weights packed by oneDNN (packed_linear.h), not through this choice.
//   NT  y = x @ W^T : gate/up 512->1536, q/o 512->512, k/v 512->128, lm_head
//   NN  dX = dY @ W : gate/up/down, q/o, k/v and lm_head shapes
//   TN  dW += dY^T X : gate/up/down, q/o, k/v and lm_head weight gradients (K = T)
const BenchShape kShapes[] = {
    {GemmClass::NT, 2048, 1536, 512, 0.f, 2}, {GemmClass::NT, 2048, 512, 512, 0.f, 2},
    {GemmClass::NT, 2048, 128, 512, 0.f, 2},  {GemmClass::NT, 2048, 512, 1536, 0.f, 1},
    {GemmClass::NT, 2048, 4096, 512, 0.f, 0.25},  // lm_head, per layer of an 8-layer model: 2 / 8
    {GemmClass::NN, 2048, 512, 1536, 0.f, 2}, {GemmClass::NN, 2048, 1536, 512, 0.f, 1},
    {GemmClass::NN, 2048, 512, 512, 0.f, 2},  {GemmClass::NN, 2048, 512, 128, 0.f, 2},
    {GemmClass::NN, 2048, 512, 4096, 0.f, 0.25},
    {GemmClass::TN, 1536, 512, 2048, 1.f, 2}, {GemmClass::TN, 512, 1536, 2048, 1.f, 1},
    {GemmClass::TN, 512, 512, 2048, 1.f, 2},  {GemmClass::TN, 128, 512, 2048, 1.f, 2},
    {GemmClass::TN, 4096, 512, 2048, 1.f, 0.25},
};
// Part of the cache key: a cached choice made on another shape table is measured again.
constexpr const char* kShapeTableVersion = "shapes 2";

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

GemmMeasurement measure_gemm_providers(const std::vector<const BlasLib*>& libs) {
  const double t_start = now_s(), cpu_start = process_cpu_s();
  size_t na = 0, nb = 0, nc = 0;
  for (const auto& s : kShapes) {
    na = std::max(na, size_t(s.M * s.K));
    nb = std::max(nb, size_t(s.K * s.N));
    nc = std::max(nc, size_t(s.M * s.N));
  }
  // Values in [-0.5, 0.5): no denormals, no overflow; the content does not change the speed.
  std::vector<float> A(na), B(nb), C(nc);
  for (size_t i = 0; i < na; ++i) A[i] = float((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  for (size_t i = 0; i < nb; ++i) B[i] = float((i * 40503u) % 997) * 1e-3f - 0.5f;
  const int threads = omp_get_max_threads();
  auto run = [&](const BlasLib* lib, const BenchShape& s) {
    const bool ta = s.cls == GemmClass::TN, tb = s.cls == GemmClass::NT;
    lib->sgemm(ta, tb, s.M, s.N, s.K, 1.f, A.data(), ta ? s.M : s.K, B.data(), tb ? s.K : s.N, s.beta, C.data(), s.N);
  };
  const size_t ns = std::size(kShapes);
  std::vector<std::vector<double>> best(libs.size(), std::vector<double>(ns, 1e30));
  // Warm-up pass, untimed: thread start, packing buffers, and oneDNN's JIT,
  // which generates each shape's kernel on its first call (it made oneDNN
  // look 2x slower than it runs, so auto never picked it).
  for (size_t li = 0; li < libs.size(); ++li) {
    libs[li]->set_num_threads(threads);
    for (const auto& s : kShapes) run(libs[li], s);
  }
  // Screening pass, timed: a library over 1.5x slower than the fastest there
  // cannot win a class by the margins that matter and is not timed again
  // (keeps the run short when BLIS trails).
  std::vector<double> warm(libs.size());
  for (size_t li = 0; li < libs.size(); ++li) {
    const double t0 = now_s();
    for (const auto& s : kShapes) run(libs[li], s);
    warm[li] = now_s() - t0;
  }
  const double fastest = *std::min_element(warm.begin(), warm.end());
  constexpr int kReps = 3;
  constexpr double kBudgetS = 2.5;
  for (int r = 0; r < kReps && (r == 0 || now_s() - t_start < kBudgetS); ++r)
    for (size_t li = 0; li < libs.size(); ++li) {
      if (warm[li] > 1.5 * fastest) continue;
      for (size_t si = 0; si < ns; ++si) {
        const double t0 = now_s();
        run(libs[li], kShapes[si]);
        best[li][si] = std::min(best[li][si], now_s() - t0);
      }
    }
  GemmMeasurement m;
  for (size_t li = 0; li < libs.size(); ++li) {
    ProviderScore ps{libs[li], {0, 0, 0}};
    for (int c = 0; c < kNumGemmClasses; ++c) {
      double fl = 0, sec = 0;
      for (size_t si = 0; si < ns; ++si)
        if (int(kShapes[si].cls) == c) {
          fl += kShapes[si].count * 2.0 * double(kShapes[si].M * kShapes[si].N * kShapes[si].K);
          sec += kShapes[si].count * best[li][si];
        }
      ps.gflops[c] = fl / sec * 1e-9;
    }
    m.scores.push_back(ps);
  }
  m.seconds = now_s() - t_start;
  m.cpu_share = std::min(1.0, (process_cpu_s() - cpu_start) / (m.seconds * threads));
  return m;
}

GemmChoice pick_from_scores(const std::vector<ProviderScore>& scores) {
  GemmChoice c;
  if (scores.empty()) return c;
  // Per-class flop weights of a training step: forward, dX and dW have the
  // same flops, so the overall rank is the harmonic mean of the three rates.
  auto total_time = [](const ProviderScore& s) {
    double t = 0;
    for (double g : s.gflops) t += 1.0 / std::max(g, 1e-9);
    return t;
  };
  const ProviderScore* best = &scores[0];
  for (const auto& s : scores)
    if (total_time(s) < total_time(*best)) best = &s;
  for (int k = 0; k < kNumGemmClasses; ++k) {
    const ProviderScore* pick = best;
    for (const auto& s : scores)
      if (s.gflops[k] > 1.05 * best->gflops[k] && s.gflops[k] > pick->gflops[k]) pick = &s;
    c.by_class[k] = pick->lib->kind;
    c.gflops[k] = pick->gflops[k];
  }
  return c;
}

// ---------------------------------------------------------------- cache

std::string gemm_cache_key(const CpuFeatures& f, const std::vector<const BlasLib*>& libs, int threads) {
  std::string k = f.vendor + "|" + f.model_name + "|family " + std::to_string(f.family) + " model " +
                  std::to_string(f.model) + " stepping " + std::to_string(f.stepping);
  for (const BlasLib* l : libs) k += "|" + l->version;
  return k + "|threads " + std::to_string(threads) + "|" + kShapeTableVersion;
}

std::string gemm_cache_dir() {
  if (const char* c = std::getenv("KESTREL_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kestrel";
  return "";
}

std::string cache_file(const std::string& dir, const char* prefix, const std::string& key) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof name, "%s-%016llx.json", prefix, static_cast<unsigned long long>(h));
  return dir + "/" + name;
}

std::string gemm_cache_file(const std::string& dir, const std::string& key) { return cache_file(dir, "gemm", key); }

Result<std::optional<nlohmann::json>> read_cache_entry(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::optional<nlohmann::json>();
  KS_ASSIGN(std::string text, read_file(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return KS_ERR(path, ": not JSON");
  if (!j.contains("key") || !j["key"].is_string()) return KS_ERR(path, ": no \"key\"");
  if (j["key"].get<std::string>() != key) return std::optional<nlohmann::json>();
  return std::optional<nlohmann::json>(std::move(j));
}

Result<std::optional<GemmChoice>> read_gemm_cache(const std::string& path, const std::string& key) {
  KS_ASSIGN(std::optional<nlohmann::json> entry, read_cache_entry(path, key));
  if (!entry) return std::optional<GemmChoice>();
  nlohmann::json& j = *entry;
  if (!j.contains("classes") || !j["classes"].is_object()) return KS_ERR(path, ": no \"classes\"");
  GemmChoice c;
  for (int k = 0; k < kNumGemmClasses; ++k) {
    const char* cls = gemm_class_name(GemmClass(k));
    const auto& e = j["classes"];
    if (!e.contains(cls) || !e[cls].is_object() || !e[cls].contains("provider") || !e[cls]["provider"].is_string() ||
        !e[cls].contains("gflops") || !e[cls]["gflops"].is_number())
      return KS_ERR(path, ": class ", cls, " missing or malformed");
    auto p = blas_from_env(e[cls]["provider"].get<std::string>().c_str());
    if (!p.is_ok() || !p->has_value()) return KS_ERR(path, ": class ", cls, ": unknown provider");
    c.by_class[k] = **p;
    c.gflops[k] = e[cls]["gflops"].get<double>();
  }
  if (j.contains("cpu_share")) {
    if (!j["cpu_share"].is_number()) return KS_ERR(path, ": cpu_share is not a number");
    c.cpu_share = j["cpu_share"].get<double>();
  }
  return std::optional<GemmChoice>(c);
}

std::string gemm_cache_text(const std::string& key, const GemmChoice& c) {
  nlohmann::json j;
  j["key"] = key;
  for (int k = 0; k < kNumGemmClasses; ++k)
    j["classes"][gemm_class_name(GemmClass(k))] = {{"provider", provider_key(c.by_class[k])}, {"gflops", c.gflops[k]}};
  j["cpu_share"] = c.cpu_share;
  std::string text = j.dump(1);
  text += '\n';
  return text;
}

Status write_gemm_cache(const std::string& path, const std::string& key, const GemmChoice& c) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return KS_ERR("cannot create ", std::filesystem::path(path).parent_path().string(), ": ", ec.message());
  return write_file_atomic(path, gemm_cache_text(key, c));
}

Result<bool> publish_file_once(const std::string& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return KS_ERR("cannot create ", std::filesystem::path(path).parent_path().string(), ": ", ec.message());
  std::string tmp = path;
  tmp += ".publish.";
  tmp += std::to_string(getpid());
  KS_TRY(write_file_atomic(tmp, text));
  const int rc = ::link(tmp.c_str(), path.c_str());  // fails with EEXIST when another process published first
  const int err = errno;
  ::unlink(tmp.c_str());
  if (rc == 0) return true;
  if (err != EEXIST) return KS_ERR("cannot publish ", path, ": ", std::strerror(err));
  return false;
}

Result<GemmChoice> publish_gemm_cache(const std::string& path, const std::string& key, const GemmChoice& c) {
  return publish_verdict(path, key, gemm_cache_text(key, c), c, read_gemm_cache);
}

}  // namespace kestrel::cpu
