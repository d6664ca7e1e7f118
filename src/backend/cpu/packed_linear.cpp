// Packed-weight linear layers through oneDNN's matmul primitive, called
// through its C API from the library blas_loader.h loaded (dlsym: nothing is
// linked, so a machine without libdnnl2 simply does not pack). The types come
// from oneDNN's headers (libdnnl-dev, the same 2.x series as libdnnl2).
#include "backend/cpu/packed_linear.h"

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl_types.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <vector>

#include "backend/cpu/blas_loader.h"
#include "backend/cpu/blas_select.h"
#include "backend/cpu/kernel_util.h"
#include "backend/cpu/packed_choice.h"
#include "backend/cpu/skinny_gemm.h"
#include "core/cpu_features.h"
#include "core/parallel_for.h"
#include "core/status.h"

namespace kestrel::cpu {

namespace {

// The C entry points used here, with oneDNN 2.x's signatures (dnnl.h).
struct DnnlApi {
  dnnl_status_t (*engine_create)(dnnl_engine_t*, dnnl_engine_kind_t, size_t);
  dnnl_status_t (*stream_create)(dnnl_stream_t*, dnnl_engine_t, unsigned);
  dnnl_status_t (*memory_desc_init_by_tag)(dnnl_memory_desc_t*, int, const dnnl_dims_t, dnnl_data_type_t,
                                           dnnl_format_tag_t);
  int (*memory_desc_equal)(const dnnl_memory_desc_t*, const dnnl_memory_desc_t*);
  size_t (*memory_desc_get_size)(const dnnl_memory_desc_t*);
  dnnl_status_t (*matmul_desc_init)(dnnl_matmul_desc_t*, const dnnl_memory_desc_t*, const dnnl_memory_desc_t*,
                                    const dnnl_memory_desc_t*, const dnnl_memory_desc_t*);
  dnnl_status_t (*primitive_desc_create)(dnnl_primitive_desc_t*, const_dnnl_op_desc_t, const_dnnl_primitive_attr_t,
                                         dnnl_engine_t, const_dnnl_primitive_desc_t);
  const dnnl_memory_desc_t* (*primitive_desc_query_md)(const_dnnl_primitive_desc_t, dnnl_query_t, int);
  dnnl_status_t (*primitive_desc_query)(const_dnnl_primitive_desc_t, dnnl_query_t, int, void*);
  dnnl_status_t (*primitive_desc_destroy)(dnnl_primitive_desc_t);
  dnnl_status_t (*reorder_primitive_desc_create)(dnnl_primitive_desc_t*, const dnnl_memory_desc_t*, dnnl_engine_t,
                                                 const dnnl_memory_desc_t*, dnnl_engine_t,
                                                 const_dnnl_primitive_attr_t);
  dnnl_status_t (*primitive_create)(dnnl_primitive_t*, const_dnnl_primitive_desc_t);
  dnnl_status_t (*primitive_execute)(const_dnnl_primitive_t, dnnl_stream_t, int, const dnnl_exec_arg_t*);
  dnnl_status_t (*primitive_destroy)(dnnl_primitive_t);
  dnnl_status_t (*memory_create)(dnnl_memory_t*, const dnnl_memory_desc_t*, dnnl_engine_t, void*);
  dnnl_status_t (*memory_destroy)(dnnl_memory_t);
  dnnl_status_t (*stream_wait)(dnnl_stream_t);

  dnnl_engine_t engine = nullptr;
  std::string impl;  // the implementation oneDNN picked for the probe, e.g. "gemm:jit"
};

template <class F>
bool bind(void* h, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(h, name));
  return f != nullptr;
}

dnnl_data_type_t dnnl_dt(DType d) { return d == DType::BF16 ? dnnl_bf16 : dnnl_f32; }

void check(dnnl_status_t st, const char* what) {
  KS_CHECK(st == dnnl_success, "oneDNN ", what, " failed with status ", int(st));
}

// A matmul primitive descriptor for [M (runtime), in] x [in, out] -> [M, out]
// with weights in the library's format (any) and an optional f32 bias.
dnnl_primitive_desc_t make_pd(const DnnlApi& a, int64_t out, int64_t in, DType wdt, DType ydt, bool bias) {
  dnnl_memory_desc_t src, wei, dst, b;
  const dnnl_dims_t src_dims = {DNNL_RUNTIME_DIM_VAL, in}, wei_dims = {in, out}, dst_dims = {DNNL_RUNTIME_DIM_VAL, out},
                    b_dims = {1, out};
  if (a.memory_desc_init_by_tag(&src, 2, src_dims, dnnl_dt(wdt), dnnl_ab) != dnnl_success ||
      a.memory_desc_init_by_tag(&wei, 2, wei_dims, dnnl_dt(wdt), dnnl_format_tag_any) != dnnl_success ||
      a.memory_desc_init_by_tag(&dst, 2, dst_dims, dnnl_dt(ydt), dnnl_ab) != dnnl_success ||
      a.memory_desc_init_by_tag(&b, 2, b_dims, dnnl_f32, dnnl_ab) != dnnl_success)
    return nullptr;
  dnnl_matmul_desc_t d;
  if (a.matmul_desc_init(&d, &src, &wei, bias ? &b : nullptr, &dst) != dnnl_success) return nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  if (a.primitive_desc_create(&pd, &d, nullptr, a.engine, nullptr) != dnnl_success) return nullptr;
  return pd;
}

// The implementation oneDNN picked for pd ("gemm:jit", "brg:avx512_core", "ref:any", ...).
std::string impl_of(const DnnlApi& a, const_dnnl_primitive_desc_t pd) {
  const char* impl = nullptr;
  return a.primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl ? impl : "";
}

// A matmul that only oneDNN's reference code runs (bf16 on a CPU without
// AVX-512, or capped by DNNL_MAX_CPU_ISA) is many times slower than widening
// to f32: such weights are not packed.
bool fast_impl(const std::string& impl) { return !impl.empty() && impl.rfind("ref", 0) != 0; }

// Loads the API once; nullptr (with *why) when oneDNN is not usable here.
const DnnlApi* dnnl_api(std::string* why) {
  static std::once_flag once;
  static DnnlApi api;
  static const DnnlApi* ready = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    std::string not_loaded;
    const BlasLib* lib = load_blas(GemmProvider::OneDNN, &not_loaded);
    if (!lib) {
      reason = not_loaded;
      return;
    }
    void* h = lib->handle;
    DnnlApi& a = api;
    const bool ok =
        bind(h, "dnnl_engine_create", a.engine_create) && bind(h, "dnnl_stream_create", a.stream_create) &&
        bind(h, "dnnl_memory_desc_init_by_tag", a.memory_desc_init_by_tag) &&
        bind(h, "dnnl_memory_desc_equal", a.memory_desc_equal) &&
        bind(h, "dnnl_memory_desc_get_size", a.memory_desc_get_size) &&
        bind(h, "dnnl_matmul_desc_init", a.matmul_desc_init) &&
        bind(h, "dnnl_primitive_desc_create", a.primitive_desc_create) &&
        bind(h, "dnnl_primitive_desc_query_md", a.primitive_desc_query_md) &&
        bind(h, "dnnl_primitive_desc_query", a.primitive_desc_query) &&
        bind(h, "dnnl_primitive_desc_destroy", a.primitive_desc_destroy) &&
        bind(h, "dnnl_reorder_primitive_desc_create", a.reorder_primitive_desc_create) &&
        bind(h, "dnnl_primitive_create", a.primitive_create) &&
        bind(h, "dnnl_primitive_execute", a.primitive_execute) &&
        bind(h, "dnnl_primitive_destroy", a.primitive_destroy) && bind(h, "dnnl_memory_create", a.memory_create) &&
        bind(h, "dnnl_memory_destroy", a.memory_destroy) && bind(h, "dnnl_stream_wait", a.stream_wait);
    if (!ok) {
      reason = "oneDNN: libdnnl.so.2 lacks the matmul C API";
      return;
    }
    if (a.engine_create(&a.engine, dnnl_cpu, 0) != dnnl_success) {
      reason = "oneDNN: no CPU engine";
      return;
    }
    // The probe: a runtime-M matmul must exist for f32 (every x86-64 build has it).
    dnnl_primitive_desc_t pd = make_pd(a, 64, 64, DType::F32, DType::F32, false);
    if (!pd) {
      reason = "oneDNN: no matmul with a run-time row count";
      return;
    }
    a.impl = impl_of(a, pd);
    a.primitive_desc_destroy(pd);
    if (!fast_impl(a.impl)) {
      reason = "oneDNN: its f32 matmul is the reference code here (" + a.impl + ")";
      return;
    }
    ready = &api;
  });
  if (!ready && why) *why = reason;
  return ready;
}

// One stream per calling thread (a stream is not shared between threads).
dnnl_stream_t thread_stream(const DnnlApi& a) {
  thread_local dnnl_stream_t s = nullptr;
  if (!s) check(a.stream_create(&s, a.engine, dnnl_stream_default_flags), "stream_create");
  return s;
}

uint64_t fnv(uint64_t h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

class PackedLinearWeight {
 public:
  int64_t out = 0, in = 0;
  DType dtype = DType::F32;
  uint64_t fingerprint = 0;
  Tensor packed;                    // the library's blocked copy of W^T (raw bytes, category Params)
  dnnl_memory_desc_t packed_md{};  // its layout

  // A primitive per (y dtype, bias) asked for, created on first use.
  dnnl_primitive_t primitive(DType ydt, bool bias) const {
    std::lock_guard<std::mutex> lock(mu_);
    const int key = (ydt == DType::BF16 ? 2 : 0) + (bias ? 1 : 0);
    auto it = prims_.find(key);
    if (it != prims_.end()) return it->second;
    const DnnlApi& a = *dnnl_api(nullptr);
    dnnl_primitive_desc_t pd = make_pd(a, out, in, dtype, ydt, bias);
    KS_CHECK(pd, "oneDNN: no matmul for a packed ", dtype_name(dtype), " weight with a ", dtype_name(ydt), " output");
    const bool same = a.memory_desc_equal(a.primitive_desc_query_md(pd, dnnl_query_weights_md, 0), &packed_md);
    dnnl_primitive_t p = nullptr;
    const dnnl_status_t st = same ? a.primitive_create(&p, pd) : dnnl_runtime_error;
    a.primitive_desc_destroy(pd);
    KS_CHECK(same, "oneDNN chose another weight layout for a ", dtype_name(ydt), " output than the packed one");
    check(st, "primitive_create");
    prims_[key] = p;
    return p;
  }

  ~PackedLinearWeight() {
    if (const DnnlApi* a = dnnl_api(nullptr))
      for (auto& [k, p] : prims_) a->primitive_destroy(p);
  }

 private:
  mutable std::mutex mu_;
  mutable std::map<int, dnnl_primitive_t> prims_;
};

bool packed_linear_enabled(std::string* why) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
    return false;
  };
  if (pack_switch() == PackSwitch::Off) return say("KESTREL_PACKED_WEIGHTS=0");
  if (deterministic()) return say("deterministic mode (fixed GEMM tiles)");
  if (const char* b = std::getenv("KESTREL_BLAS"); b && *b) {
    const std::string_view v(b);
    if (v != "auto" && v != "dnnl") return say(std::string("KESTREL_BLAS=") + b);
  }
  std::string no;
  const DnnlApi* a = dnnl_api(&no);
  if (!a) return say(no);
  if (why) *why = "oneDNN matmul (" + a->impl + ")";
  return true;
}

bool dtype_packs_here(DType dt, std::string* why) {
  if (!packed_linear_enabled(why)) return false;
  if (dt != DType::F32) return true;
  const PackedF32Verdict& v = packed_f32_verdict();
  if (why) *why = (v.pack ? *why + ": " : std::string("the BLAS is faster here: ")) + describe_packed_f32(v);
  return v.pack;
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const Tensor& w) {
  KS_CHECK(w.defined() && w.device() == Device::CPU && w.dim() == 2 &&
               (w.dtype() == DType::F32 || w.dtype() == DType::BF16),
           "pack_linear_weight: needs a CPU f32/bf16 [out, in] weight, got ", w.describe());
  if (!dtype_packs_here(w.dtype())) return nullptr;
  return detail::pack_linear_weight_unmeasured(w, /*outside_allocator=*/false);
}

std::shared_ptr<const PackedLinearWeight> detail::pack_linear_weight_unmeasured(const Tensor& w,
                                                                                bool outside_allocator) {
  if (!packed_linear_enabled()) return nullptr;
  const DnnlApi& a = *dnnl_api(nullptr);
  auto p = std::make_shared<PackedLinearWeight>();
  p->out = w.size(0);
  p->in = w.size(1);
  p->dtype = w.dtype();
  p->fingerprint = weight_fingerprint(w);
  dnnl_primitive_desc_t pd = make_pd(a, p->out, p->in, p->dtype, p->dtype, false);
  if (!pd) return nullptr;  // no matmul for this dtype here: the caller multiplies unpacked
  p->packed_md = *a.primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  const bool fast = fast_impl(impl_of(a, pd));
  a.primitive_desc_destroy(pd);
  if (!fast) return nullptr;
  const size_t bytes = a.memory_desc_get_size(&p->packed_md);
  const int64_t words = int64_t((bytes + 3) / 4);
  if (outside_allocator) {
    auto buf = std::make_shared<std::vector<float>>(size_t(words));
    p->packed = Tensor::from_blob(buf->data(), {words}, DType::F32, buf);
  } else {
    p->packed = Tensor::empty({words}, DType::F32, MemCategory::Params);
  }

  // W[out, in] row-major is the [in, out] matrix W^T in "ba" order.
  dnnl_memory_desc_t user_md;
  const dnnl_dims_t dims = {p->in, p->out};
  check(a.memory_desc_init_by_tag(&user_md, 2, dims, dnnl_dt(p->dtype), dnnl_ba), "memory_desc_init_by_tag");
  dnnl_primitive_desc_t rpd = nullptr;
  check(a.reorder_primitive_desc_create(&rpd, &user_md, a.engine, &p->packed_md, a.engine, nullptr),
        "reorder_primitive_desc_create");
  dnnl_primitive_t reorder = nullptr;
  const dnnl_status_t st = a.primitive_create(&reorder, rpd);
  a.primitive_desc_destroy(rpd);
  check(st, "primitive_create(reorder)");
  dnnl_memory_t src = nullptr, dst = nullptr;
  check(a.memory_create(&src, &user_md, a.engine, w.raw()), "memory_create");
  check(a.memory_create(&dst, &p->packed_md, a.engine, p->packed.raw()), "memory_create");
  const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
  dnnl_stream_t s = thread_stream(a);
  const dnnl_status_t ex = a.primitive_execute(reorder, s, 2, args);
  a.stream_wait(s);
  a.memory_destroy(src);
  a.memory_destroy(dst);
  a.primitive_destroy(reorder);
  check(ex, "reorder");
  return p;
}

int64_t packed_linear_bytes(int64_t out, int64_t in, DType dt) {
  if (!dtype_packs_here(dt)) return 0;
  const DnnlApi& a = *dnnl_api(nullptr);
  dnnl_primitive_desc_t pd = make_pd(a, out, in, dt, dt, false);
  if (!pd) return 0;
  const size_t bytes =
      fast_impl(impl_of(a, pd)) ? a.memory_desc_get_size(a.primitive_desc_query_md(pd, dnnl_query_weights_md, 0)) : 0;
  a.primitive_desc_destroy(pd);
  return int64_t((bytes + 3) / 4) * 4;  // as allocated: whole f32 elements
}

bool packed_linear_applies(const PackedLinearWeight& w, const Tensor& x, const Tensor* b, const Tensor& y) {
  if (!x.defined() || !y.defined() || x.device() != Device::CPU || y.device() != Device::CPU) return false;
  if (x.dim() != 2 || y.dim() != 2 || x.size(0) < 1 || x.size(1) != w.in || y.size(0) != x.size(0) ||
      y.size(1) != w.out)
    return false;
  if (x.dtype() != w.dtype || (y.dtype() != DType::F32 && y.dtype() != w.dtype)) return false;
  if (b && (!b->defined() || b->device() != Device::CPU || b->numel() != w.out ||
            (b->dtype() != DType::F32 && b->dtype() != DType::BF16)))
    return false;
  return true;
}

void packed_linear(const PackedLinearWeight& w, const Tensor& x, const Tensor* b, Tensor& y) {
  KS_CHECK(packed_linear_applies(w, x, b, y), "packed_linear: needs x[M, ", w.in, "] ", dtype_name(w.dtype),
           ", y[M, ", w.out, "] f32 or ", dtype_name(w.dtype), ", b[", w.out, "]; got x", shape_str(x.shape()), " ",
           dtype_name(x.dtype()), ", y", shape_str(y.shape()), " ", dtype_name(y.dtype()));
  KS_CHECK(!x.same_data(y), "packed_linear: y must not alias x");
  const DnnlApi& a = *dnnl_api(nullptr);
  const int64_t M = x.size(0);
  dnnl_primitive_t prim = w.primitive(y.dtype(), b != nullptr);
  dnnl_memory_desc_t src_md, dst_md, b_md;
  const dnnl_dims_t src_dims = {M, w.in}, dst_dims = {M, w.out}, b_dims = {1, w.out};
  check(a.memory_desc_init_by_tag(&src_md, 2, src_dims, dnnl_dt(w.dtype), dnnl_ab), "memory_desc_init_by_tag");
  check(a.memory_desc_init_by_tag(&dst_md, 2, dst_dims, dnnl_dt(y.dtype()), dnnl_ab), "memory_desc_init_by_tag");
  check(a.memory_desc_init_by_tag(&b_md, 2, b_dims, dnnl_f32, dnnl_ab), "memory_desc_init_by_tag");
  // The bias as f32 (a bf16 model's bias is widened; out values, per call).
  thread_local std::vector<float> b_scratch;
  void* b_data = nullptr;
  if (b) {
    if (b->dtype() == DType::F32) {
      b_data = b->raw();
    } else {
      b_scratch.resize(size_t(w.out));
      const bf16_bits* src = ptr<const bf16_bits>(*b);
      for (int64_t i = 0; i < w.out; ++i) b_scratch[size_t(i)] = load_f32(src, i);
      b_data = b_scratch.data();
    }
  }
  dnnl_memory_t src = nullptr, wei = nullptr, dst = nullptr, bias = nullptr;
  check(a.memory_create(&src, &src_md, a.engine, x.raw()), "memory_create");
  check(a.memory_create(&wei, &w.packed_md, a.engine, w.packed.raw()), "memory_create");
  check(a.memory_create(&dst, &dst_md, a.engine, y.raw()), "memory_create");
  if (b) check(a.memory_create(&bias, &b_md, a.engine, b_data), "memory_create");
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}, {DNNL_ARG_BIAS, bias}};
  dnnl_stream_t s = thread_stream(a);
  const dnnl_status_t st = a.primitive_execute(prim, s, b ? 4 : 3, args);
  a.stream_wait(s);
  for (dnnl_memory_t m : {src, wei, dst, bias})
    if (m) a.memory_destroy(m);
  check(st, "matmul");
}

int64_t packed_rows(const PackedLinearWeight& w) { return w.out; }
int64_t packed_cols(const PackedLinearWeight& w) { return w.in; }
DType packed_dtype(const PackedLinearWeight& w) { return w.dtype; }
int64_t packed_bytes(const PackedLinearWeight& w) { return w.packed.numel() * 4; }
uint64_t packed_fingerprint(const PackedLinearWeight& w) { return w.fingerprint; }

uint64_t weight_fingerprint(const Tensor& w) {
  uint64_t h = 0xcbf29ce484222325ull;
  const int64_t n = w.numel(), es = int64_t(dtype_size(w.dtype()));
  for (int64_t d = 0; d < w.dim(); ++d) {
    const int64_t s = w.size(d);
    h = fnv(h, &s, sizeof s);
  }
  h = fnv(h, &es, sizeof es);
  const auto* bytes = static_cast<const unsigned char*>(w.raw());
  constexpr int64_t kSamples = 64;
  for (int64_t i = 0; i < kSamples && n > 0; ++i) {
    const int64_t at = n <= kSamples ? i % n : (i * (n - 1)) / (kSamples - 1);
    h = fnv(h, bytes + at * es, size_t(es));
  }
  return h;
}

int64_t packed_linear_min_rows(DType weight_dtype) {
  return weight_dtype == DType::BF16 && cpu_features().has_amx() ? kPackedBf16AmxMinRows : kSkinnyMaxRows;
}

const PackedLinearWeight* WeightPacks::get(const Tensor& w) {
  if (!w.defined() || w.device() != Device::CPU || w.dim() != 2 ||
      (w.dtype() != DType::F32 && w.dtype() != DType::BF16))
    return nullptr;
  // Whether this dtype packs here at all (packing on, and bf16 only with
  // AVX-512), asked once per set.
  int& dtype_packs = packable_[w.dtype() == DType::BF16 ? 1 : 0];
  if (dtype_packs < 0) dtype_packs = packed_linear_bytes(64, 64, w.dtype()) > 0 ? 1 : 0;
  if (!dtype_packs) return nullptr;
  const Key key{w.raw(), w.size(0), w.size(1), int(w.dtype())};
  auto& slot = by_data_[key];
  if (slot) {
    if (packed_fingerprint(*slot) == weight_fingerprint(w)) return slot.get();
    ++stale_repacks_;
    slot.reset();  // freed before its replacement is allocated
  }
  slot = pack_linear_weight(w);
  if (!slot) {
    by_data_.erase(key);
    return nullptr;
  }
  return slot.get();
}

bool WeightPacks::linear(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  // The dtype check before get(), which would pack a weight the product then does not use.
  if (!x.defined() || x.dim() != 2 || !w.defined() || x.dtype() != w.dtype() ||
      x.size(0) <= packed_linear_min_rows(w.dtype()))
    return false;
  const PackedLinearWeight* p = get(w);
  if (!p || !packed_linear_applies(*p, x, b, y)) return false;
  packed_linear(*p, x, b, y);
  return true;
}

int64_t WeightPacks::bytes() const {
  int64_t b = 0;
  for (const auto& [key, pack] : by_data_) b += packed_bytes(*pack);
  return b;
}

void WeightPacks::clear() { by_data_.clear(); }

}  // namespace kestrel::cpu
