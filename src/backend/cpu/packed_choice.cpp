#include "backend/cpu/packed_choice.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend/cpu/blas_loader.h"
#include "backend/cpu/blas_select.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/packed_linear.h"
#include "core/cpu_features.h"

namespace kestrel::cpu {

Result<PackSwitch> pack_switch_from_env(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return PackSwitch::Auto;
  if (v == "1") return PackSwitch::On;
  if (v == "0") return PackSwitch::Off;
  return KS_ERR("KESTREL_PACKED_WEIGHTS='", v,
                "' is not a packing switch: use auto (measure once per machine, the default), 1 (always pack) or 0 "
                "(never pack), or unset it");
}

PackSwitch pack_switch() {
  Result<PackSwitch> sw = pack_switch_from_env(std::getenv("KESTREL_PACKED_WEIGHTS"));
  if (!sw.is_ok()) throw Error(sw.status().message());
  return *sw;
}

bool packed_wins(double packed_gflops, double blas_gflops) { return blas_gflops < 1.05 * packed_gflops; }

namespace {

// A layer's linears of the small config (bench/configs/small.json: hidden
// 512, intermediate 1536, 2 KV heads of 64) at a decode batch of 64 and of
// 256 rows, the rollout's largest: out x in, times per layer.
struct PackShape {
  int64_t out, in, count;
};
constexpr PackShape kLinears[] = {{1536, 512, 2}, {512, 1536, 1}, {512, 512, 2}, {128, 512, 2}};
constexpr int64_t kRows[] = {64, 256};
// Part of the cache key: a verdict made on another table is measured again.
constexpr const char* kPackTableVersion = "packed decode 1";

// Host buffers outside Kestrel's allocator: the measurement may run in the
// middle of a run, and must not show in its memory statistics.
struct Buffer {
  std::shared_ptr<std::vector<float>> data;
  Tensor t;
};
Buffer buffer(int64_t rows, int64_t cols, uint32_t mul) {  // values in [-0.5, 0.5): no denormals
  Buffer b{std::make_shared<std::vector<float>>(size_t(rows * cols)), {}};
  for (size_t i = 0; i < b.data->size(); ++i) (*b.data)[i] = float((uint64_t(i) * mul) % 1000) * 1e-3f - 0.5f;
  b.t = Tensor::from_blob(b.data->data(), {rows, cols}, DType::F32, b.data);
  return b;
}

// Times the packed product against sgemm (the x@W^T library of this
// process's GEMM choice) on kLinears x kRows, interleaved, best of 3 passes
// after an untimed one (thread start, oneDNN's JIT, packing buffers).
PackedF32Verdict measure() {
  const double t_start = now_s(), cpu_start = process_cpu_s();
  const int threads = omp_get_max_threads();
  constexpr size_t nl = std::size(kLinears), nr = std::size(kRows);
  std::vector<Buffer> weights, xs, ys;  // xs, ys: [row count][linear]
  std::vector<std::shared_ptr<const PackedLinearWeight>> packs;
  for (const PackShape& s : kLinears) {
    weights.push_back(buffer(s.out, s.in, 40503u));
    packs.push_back(detail::pack_linear_weight_unmeasured(weights.back().t, /*outside_allocator=*/true));
    KS_CHECK(packs.back(), "packed_f32_verdict: oneDNN would not pack a ", s.out, "x", s.in, " f32 weight");
  }
  for (int64_t m : kRows)
    for (const PackShape& s : kLinears) {
      xs.push_back(buffer(m, s.in, 2654435761u));
      ys.push_back(buffer(m, s.out, 1u));
    }
  double flops = 0;
  for (int64_t m : kRows)
    for (const PackShape& s : kLinears) flops += double(s.count) * 2.0 * double(m * s.out * s.in);
  auto pass = [&](bool packed) {
    const double t0 = now_s();
    for (size_t r = 0; r < nr; ++r)
      for (size_t i = 0; i < nl; ++i) {
        const PackShape& s = kLinears[i];
        const Tensor& x = xs[r * nl + i].t;
        Tensor& y = ys[r * nl + i].t;
        for (int64_t c = 0; c < s.count; ++c) {
          if (packed)
            packed_linear(*packs[i], x, nullptr, y);
          else
            sgemm(false, true, kRows[r], s.out, s.in, 1.f, static_cast<const float*>(x.raw()), s.in,
                  static_cast<const float*>(weights[i].t.raw()), s.in, 0.f, static_cast<float*>(y.raw()), s.out);
        }
      }
    return now_s() - t0;
  };
  pass(true);
  pass(false);
  double best_packed = 1e30, best_blas = 1e30;
  for (int r = 0; r < 3; ++r) {
    best_packed = std::min(best_packed, pass(true));
    best_blas = std::min(best_blas, pass(false));
  }
  PackedF32Verdict v;
  v.packed_gflops = flops / best_packed * 1e-9;
  v.blas_gflops = flops / best_blas * 1e-9;
  v.pack = packed_wins(v.packed_gflops, v.blas_gflops);
  const double secs = now_s() - t_start;
  v.cpu_share = std::min(1.0, (process_cpu_s() - cpu_start) / (secs * threads));
  char buf[64];
  std::snprintf(buf, sizeof buf, "measured in %.2f s", secs);
  v.how = buf;
  return v;
}

PackedF32Verdict measured_or_cached() {
  const std::string key = packed_cache_key(omp_get_max_threads());
  const std::string dir = gemm_cache_dir();
  const std::string file = dir.empty() ? "" : packed_cache_file(dir, key);
  std::string note;
  if (!file.empty()) {
    Result<std::optional<PackedF32Verdict>> r = read_packed_cache(file, key);
    if (!r.is_ok())
      note = "; ignored the unreadable cache file (" + r.status().message() + ")";
    else if (r->has_value())
      return **r;
  }
  PackedF32Verdict v = measure();
  v.how += note;
  if (file.empty()) return v;
  PackedF32Verdict cached = v;
  cached.how += ", cached in " + file;
  Result<PackedF32Verdict> used = publish_verdict(file, key, packed_cache_text(key, v), cached, read_packed_cache);
  if (used.is_ok()) return *used;  // ours, or the verdict of the process that published first: all agree
  v.how += "; could not write the cache (" + used.status().message() + ")";
  return v;
}

}  // namespace

const PackedF32Verdict& packed_f32_verdict() {
  static const PackedF32Verdict on{true, 0, 0, 1.0, "KESTREL_PACKED_WEIGHTS=1"};
  static const PackedF32Verdict off{false, 0, 0, 1.0, "KESTREL_PACKED_WEIGHTS=0"};
  if (const PackSwitch sw = pack_switch(); sw != PackSwitch::Auto) return sw == PackSwitch::On ? on : off;
  static std::once_flag once;
  static PackedF32Verdict v;
  std::call_once(once, [] { v = measured_or_cached(); });
  return v;
}

std::string describe_packed_f32(const PackedF32Verdict& v) {
  if (v.packed_gflops <= 0) return v.how;
  char buf[96];
  std::snprintf(buf, sizeof buf, "packed %.0f vs BLAS %.0f GFLOP/s at decode rows, ", v.packed_gflops, v.blas_gflops);
  std::string s = buf + v.how;
  if (v.cpu_share < GemmChoice::kBusyShare)
    s += " (measured while other processes held the cores; delete the file to measure again)";
  return s;
}

std::string packed_cache_key(int threads) {
  const CpuFeatures& f = cpu_features();
  std::string k = f.vendor + "|" + f.model_name + "|family " + std::to_string(f.family) + " model " +
                  std::to_string(f.model) + " stepping " + std::to_string(f.stepping);
  const BlasLib* nt = load_blas(gemm_choice()[size_t(GemmClass::NT)]);
  const BlasLib* dnnl = load_blas(GemmProvider::OneDNN);
  k += "|x@W^T " + (nt ? nt->version : std::string("?")) + "|packer " + (dnnl ? dnnl->version : std::string("?"));
  for (const char* e : {"OPENBLAS_CORETYPE", "DNNL_MAX_CPU_ISA"}) {
    const char* v = std::getenv(e);
    k += std::string("|") + e + "=" + (v ? v : "");
  }
  return k + "|threads " + std::to_string(threads) + "|" + kPackTableVersion;
}

std::string packed_cache_file(const std::string& dir, const std::string& key) {
  return cache_file(dir, "packed", key);
}

Result<std::optional<PackedF32Verdict>> read_packed_cache(const std::string& path, const std::string& key) {
  KS_ASSIGN(std::optional<nlohmann::json> entry, read_cache_entry(path, key));
  if (!entry) return std::optional<PackedF32Verdict>();
  nlohmann::json& j = *entry;
  for (const char* f : {"packed_gflops", "blas_gflops", "cpu_share"})
    if (!j.contains(f) || !j[f].is_number()) return KS_ERR(path, ": \"", f, "\" missing or not a number");
  if (!j.contains("pack") || !j["pack"].is_boolean()) return KS_ERR(path, ": \"pack\" missing or not a boolean");
  PackedF32Verdict v;
  v.pack = j["pack"].get<bool>();
  v.packed_gflops = j["packed_gflops"].get<double>();
  v.blas_gflops = j["blas_gflops"].get<double>();
  v.cpu_share = j["cpu_share"].get<double>();
  v.how = "cached in " + path;
  return std::optional<PackedF32Verdict>(v);
}

std::string packed_cache_text(const std::string& key, const PackedF32Verdict& v) {
  nlohmann::json j;
  j["key"] = key;
  j["pack"] = v.pack;
  j["packed_gflops"] = v.packed_gflops;
  j["blas_gflops"] = v.blas_gflops;
  j["cpu_share"] = v.cpu_share;
  return j.dump(1) + "\n";
}

}  // namespace kestrel::cpu
