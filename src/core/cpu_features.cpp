#include "core/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace kestrel {

namespace {

struct Regs {
  uint32_t a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(uint32_t v, int i) { return (v >> i) & 1u; }

// XCR0 through xgetbv; only valid when CPUID.1:ECX.OSXSAVE is set.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  return s.substr(i);
}

CpuFeatures read_features() {
  CpuFeatures f;
  const Regs v = cpuid(0);
  const uint32_t max_leaf = v.a;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;

  if (max_leaf >= 1) {
    const Regs l1 = cpuid(1);
    const int base_family = int((l1.a >> 8) & 0xf), base_model = int((l1.a >> 4) & 0xf);
    const int ext_family = int((l1.a >> 20) & 0xff), ext_model = int((l1.a >> 16) & 0xf);
    f.family = base_family == 0xf ? base_family + ext_family : base_family;
    f.model = (base_family == 0x6 || base_family == 0xf) ? (ext_model << 4) + base_model : base_model;
    f.stepping = int(l1.a & 0xf);
    f.fma = bit(l1.c, 12);
    f.f16c = bit(l1.c, 29);
    if (bit(l1.c, 27)) {  // OSXSAVE
      const uint64_t x = xcr0();
      f.os_ymm = (x & 0x6) == 0x6;                // SSE + AVX state
      f.os_zmm = f.os_ymm && (x & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
      f.os_amx = (x & 0x60000) == 0x60000;        // XTILECFG + XTILEDATA
    }
  }
  if (max_leaf >= 7) {
    const Regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5);
    f.avx512f = bit(l7.b, 16);
    f.avx512dq = bit(l7.b, 17);
    f.avx512cd = bit(l7.b, 28);
    f.avx512bw = bit(l7.b, 30);
    f.avx512vl = bit(l7.b, 31);
    f.avx512_vnni = bit(l7.c, 11);
    f.avx512_fp16 = bit(l7.d, 23);
    f.amx_bf16 = bit(l7.d, 22);
    f.amx_tile = bit(l7.d, 24);
    f.amx_int8 = bit(l7.d, 25);
    if (l7.a >= 1) f.avx512_bf16 = bit(cpuid(7, 1).a, 5);
  }
  const uint32_t max_ext = cpuid(0x80000000u).a;
  if (max_ext >= 0x80000004u) {
    char brand[49] = {};
    for (uint32_t i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002u + i);
      std::memcpy(brand + 16 * i + 0, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    f.model_name = trim(brand);
  }
  if (f.model_name.empty()) f.model_name = "unknown CPU";
  return f;
}

// -1: not yet read from the environment.
std::atomic<int> g_kernel_isa{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_features();
  return f;
}

const char* isa_name(IsaLevel isa) { return isa == IsaLevel::Avx512 ? "avx512" : "avx2"; }

IsaLevel machine_isa() { return cpu_features().has_avx512() ? IsaLevel::Avx512 : IsaLevel::Avx2; }

Result<IsaLevel> isa_from_env(const char* value) {
  const std::string v = value ? value : "";
  if (v.empty() || v == "auto") return machine_isa();
  if (v == "avx2") return IsaLevel::Avx2;
  if (v == "avx512") {
    if (machine_isa() != IsaLevel::Avx512)
      return KS_ERR("KESTREL_ISA=avx512, but this CPU (", cpu_features().model_name,
                    ") lacks AVX-512 F/BW/VL/DQ or the OS does not enable it: use KESTREL_ISA=avx2 or auto");
    return IsaLevel::Avx512;
  }
  return KS_ERR("KESTREL_ISA='", v, "' is not a kernel ISA level: use auto, avx2 or avx512");
}

IsaLevel kernel_isa() {
  int cur = g_kernel_isa.load(std::memory_order_relaxed);
  if (cur >= 0) return IsaLevel(cur);
  Result<IsaLevel> r = isa_from_env(std::getenv("KESTREL_ISA"));
  if (!r.is_ok()) throw Error(r.status().message());
  int expected = -1;
  g_kernel_isa.compare_exchange_strong(expected, int(r.value()));
  return IsaLevel(g_kernel_isa.load());
}

void set_kernel_isa(IsaLevel isa) {
  KS_CHECK(isa == IsaLevel::Avx2 || machine_isa() == IsaLevel::Avx512, "set_kernel_isa(", isa_name(isa),
           "): this CPU does not support it");
  g_kernel_isa.store(int(isa));
}

std::string cpu_summary() {
  const CpuFeatures& f = cpu_features();
  std::string s = f.model_name + " (" + f.vendor + " family " + std::to_string(f.family) + " model " +
                  std::to_string(f.model) + "), ISA " + isa_name(kernel_isa());
  std::string ext;
  if (f.has_avx512()) {
    ext = "AVX-512 F/BW/VL/DQ";
    if (f.avx512_vnni) ext += " VNNI";
    if (f.avx512_bf16) ext += " BF16";
    if (f.avx512_fp16) ext += " FP16";
  } else if (f.has_avx2_fma()) {
    ext = "AVX2 FMA";
  } else {
    ext = "below AVX2+FMA";
  }
  if (f.has_amx()) ext += ", AMX";
  return s + " (" + ext + ")";
}

}  // namespace kestrel
