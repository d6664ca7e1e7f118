// RoPE tables with transformers' float32 arithmetic, and the dispatch layer.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/rope_cpu.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/copy_ops.h"
#endif
#include "ops/dispatch.h"

// torch rounds every float32 operation; a fused a*b+c would round once and
// move some inv_freq by an ulp (visible in cos at large positions).
#if defined(__clang__)
#pragma clang fp contract(off)
#define KS_NO_FMA
#elif defined(__GNUC__)
#define KS_NO_FMA __attribute__((optimize("fp-contract=off")))
#else
#define KS_NO_FMA
#endif

namespace kestrel::ops {
namespace {

void check_config(const RopeConfig& c) {
  if (c.head_dim <= 0 || c.head_dim % 2)
    KS_FAIL("RoPE: head_dim must be a positive even number, got ", c.head_dim,
            " (set head_dim, or hidden_size / num_attention_heads, in config.json)");
  if (!(c.theta > 0))
    KS_FAIL("RoPE: rope_theta must be > 0, got ", c.theta, " (fix rope_theta in config.json)");
  const std::string& t = c.scaling_type;
  if (t != "default" && t != "linear" && t != "llama3" && t != "yarn")
    KS_FAIL("RoPE: not supported yet: rope scaling type '", t,
            "' (supported: default, linear, llama3, yarn; fix rope_scaling.rope_type in config.json)");
  if (t != "default" && !(c.factor > 0))
    KS_FAIL("RoPE: rope_scaling.factor must be > 0 for type '", t, "', got ", c.factor);
  if (t == "llama3" && !(c.high_freq_factor != c.low_freq_factor && c.low_freq_factor > 0))
    KS_FAIL("RoPE: llama3 scaling needs low_freq_factor > 0 and high_freq_factor != low_freq_factor, got ",
            c.low_freq_factor, " and ", c.high_freq_factor, " (fix rope_scaling in config.json)");
  if ((t == "llama3" || t == "yarn") && c.original_max_position <= 0)
    KS_FAIL("RoPE: ", t, " scaling needs original_max_position_embeddings > 0, got ", c.original_max_position,
            " (fix rope_scaling in config.json)");
}

// base ** (arange(0, dim, 2).float() / dim), all float32 like torch.
std::vector<float> pos_freqs(const RopeConfig& c) {
  const int64_t half = c.head_dim / 2;
  const float base = float(c.theta), dim = float(c.head_dim);
  std::vector<float> pf(half);
  for (int64_t i = 0; i < half; ++i) pf[i] = std::pow(base, float(2 * i) / dim);
  return pf;
}

// HF yarn: get_mscale and the attention factor (a Python double).
double yarn_attention_factor(const RopeConfig& c) {
  if (c.attention_factor != 0.0) return c.attention_factor;
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (c.mscale != 0.0 && c.mscale_all_dim != 0.0)
    return get_mscale(c.factor, c.mscale) / get_mscale(c.factor, c.mscale_all_dim);
  return get_mscale(c.factor, 1.0);
}

// float32 inv_freq in HF's operation order. Python scalars meet float32
// tensors as float32 (torch type promotion), `scalar / tensor` is
// tensor.reciprocal() * scalar (Tensor.__rdiv__).
KS_NO_FMA std::vector<float> inv_freq_f32(const RopeConfig& c, double* attention_scale) {
  check_config(c);
  const int64_t half = c.head_dim / 2;
  const std::vector<float> pf = pos_freqs(c);
  std::vector<float> inv(half);
  double att = 1.0;
  if (c.scaling_type == "default" || c.scaling_type == "linear") {
    for (int64_t i = 0; i < half; ++i) inv[i] = 1.0f / pf[i];
    if (c.scaling_type == "linear")
      for (auto& x : inv) x /= float(c.factor);
  } else if (c.scaling_type == "llama3") {
    const float factor = float(c.factor);
    const double old_ctx = double(c.original_max_position);
    const float low_wl = float(old_ctx / c.low_freq_factor), high_wl = float(old_ctx / c.high_freq_factor);
    const float lff = float(c.low_freq_factor), dff = float(c.high_freq_factor - c.low_freq_factor);
    const float two_pi = float(2 * M_PI), old_ctx_f = float(old_ctx);
    for (int64_t i = 0; i < half; ++i) {
      const float f = 1.0f / pf[i];
      const float wavelen = (1.0f / f) * two_pi;
      float fl = wavelen > low_wl ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * old_ctx_f - lff) / dff;
      const float smoothed = (1.0f - smooth) * fl / factor + smooth * fl;
      const bool medium = !(wavelen < high_wl) && !(wavelen > low_wl);
      inv[i] = medium ? smoothed : fl;
    }
  } else {  // yarn
    att = yarn_attention_factor(c);
    const double dim = double(c.head_dim), base = c.theta, omax = double(c.original_max_position);
    auto correction_dim = [&](double rot) { return dim * std::log(omax / (rot * 2 * M_PI)) / (2 * std::log(base)); };
    double low = correction_dim(c.beta_fast), high = correction_dim(c.beta_slow);
    if (c.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // HF: prevent singularity
    const float lo_f = float(low), span = float(high - low), factor = float(c.factor);
    for (int64_t i = 0; i < half; ++i) {
      const float extrap = 1.0f / pf[i];
      const float interp = 1.0f / (factor * pf[i]);
      const float ramp = std::clamp((float(i) - lo_f) / span, 0.0f, 1.0f);
      const float ef = 1.0f - ramp;
      inv[i] = interp * (1.0f - ef) + extrap * ef;
    }
  }
  if (attention_scale) *attention_scale = att;
  return inv;
}

void check_rope_args(const char* op, const Tensor& x, const Tensor& positions, const RopeTable& table,
                     int64_t n_heads, int64_t rot_offset) {
  KS_CHECK(x.defined() && positions.defined() && table.cos.defined(), op, ": undefined tensor argument");
  if (x.dtype() != DType::F32 && x.dtype() != DType::BF16)
    KS_FAIL(op, ": x must be f32 or bf16, got ", x.describe());
  if (n_heads <= 0 || x.dim() != 2 || x.size(1) % n_heads)
    KS_FAIL(op, ": x must be [T, n_heads*W] with n_heads = ", n_heads, " heads of W columns each, got ", x.describe());
  const int64_t W = x.size(1) / n_heads;
  if (rot_offset < 0 || rot_offset + table.head_dim > W)
    KS_FAIL(op, ": the rotated columns [", rot_offset, ", ", rot_offset + table.head_dim, ") (rot_offset + the table's ",
            "head_dim ", table.head_dim, ") must lie within each head of x, which has W = ", W, " columns (x ",
            x.describe(), ", n_heads ", n_heads, "); check n_heads, rot_offset and the rotary dim of the table");
  if (positions.dtype() != DType::I32 || positions.dim() != 1 || positions.size(0) != x.size(0))
    KS_FAIL(op, ": positions must be i32 [", x.size(0), "] (one per token of x), got ", positions.describe());
  const int64_t P = table.cos.size(0);
  if (table.cos.dtype() != DType::F32 || table.cos.shape() != Shape{P, table.head_dim / 2} ||
      table.sin.shape() != table.cos.shape() || table.sin.dtype() != DType::F32)
    KS_FAIL(op, ": malformed RopeTable (cos ", table.cos.describe(), ", sin ", table.sin.describe(),
            ", head_dim ", table.head_dim, "); build it with make_rope_table");
}

// The CPU path: checks the positions (read on the host) and rotates x in place.
void cpu_rope(const char* op, Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads,
              int64_t rot_offset, bool inverse) {
  const int64_t P = table.cos.size(0);
  const int32_t* pos = positions.data<int32_t>();
  for (int64_t t = 0; t < positions.size(0); ++t)
    if (pos[t] < 0 || pos[t] >= P)
      KS_FAIL(op, ": position ", pos[t], " of token ", t, " is outside the RoPE table [0, ", P,
              "); build the table with max_positions > the longest sequence");
  const cpu::RopeLayout layout{n_heads, x.size(1) / n_heads, rot_offset, table.head_dim, table.interleaved};
  cpu::rope_apply(x, pos, table.cos.data<float>(), table.sin.data<float>(), layout, inverse);
}

#if KESTREL_HAVE_CUDA
// The CUDA path: the table lives on the device with x (rope_table_to).
void cuda_rope(const char* op, Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads,
               int64_t rot_offset, bool inverse) {
  cuda::rope_apply(op, x, positions, table.cos, table.sin, n_heads, rot_offset, table.head_dim, table.interleaved,
                   inverse);
}
#endif

constexpr detail::Kernels<decltype(cpu_rope)> kRope{.cpu = cpu_rope KS_CUDA_KERNEL(cuda_rope)};

}  // namespace

std::vector<double> rope_inv_freq(const RopeConfig& cfg, double* attention_scale) {
  const auto f = inv_freq_f32(cfg, attention_scale);
  return std::vector<double>(f.begin(), f.end());
}

KS_NO_FMA RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions) {
  double att = 1.0;
  const std::vector<float> inv = inv_freq_f32(cfg, &att);
  if (max_positions <= 0 || max_positions > (int64_t(1) << 24))
    KS_FAIL("RoPE: max_positions must be in [1, 2^24] (float32 positions are exact up to 2^24), got ",
            max_positions);
  const int64_t half = cfg.head_dim / 2;
  RopeTable t;
  t.head_dim = cfg.head_dim;
  t.interleaved = cfg.interleaved;
  t.cos = Tensor::empty({max_positions, half}, DType::F32, MemCategory::Params);
  t.sin = Tensor::empty({max_positions, half}, DType::F32, MemCategory::Params);
  float* c = t.cos.data<float>();
  float* s = t.sin.data<float>();
  const float att_f = float(att);  // HF: emb.cos() * attention_scaling, the scalar as float32
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float freq = float(p) * inv[i];
      c[p * half + i] = std::cos(freq) * att_f;
      s[p * half + i] = std::sin(freq) * att_f;
    }
  return t;
}

RopeTable rope_table_to(const RopeTable& table, Device dev) {
  RopeTable t = table;
  if (dev == table.cos.device()) return t;
  t.cos = Tensor::empty(table.cos.shape(), DType::F32, MemCategory::Params, dev);
  t.sin = Tensor::empty(table.sin.shape(), DType::F32, MemCategory::Params, dev);
  t.cos.copy_from(table.cos);
  t.sin.copy_from(table.sin);
  return t;
}

void rope_fwd(Tensor& x, const Tensor& positions, const RopeTable& table, int64_t n_heads, int64_t rot_offset) {
  check_rope_args("rope_fwd", x, positions, table, n_heads, rot_offset);
  detail::dispatch("rope_fwd", kRope, {&x, &positions, &table.cos, &table.sin}, "rope_fwd", x, positions, table,
                   n_heads, rot_offset, /*inverse=*/false);
}

void rope_bwd(Tensor& dx, const Tensor& positions, const RopeTable& table, int64_t n_heads, int64_t rot_offset) {
  check_rope_args("rope_bwd", dx, positions, table, n_heads, rot_offset);
  detail::dispatch("rope_bwd", kRope, {&dx, &positions, &table.cos, &table.sin}, "rope_bwd", dx, positions, table,
                   n_heads, rot_offset, /*inverse=*/true);
}

}  // namespace kestrel::ops
