// SCRATCH, to be deleted when wt-cpops lands: slow double-precision stand-ins
// for ops::attention_block_fwd / attention_merge / attention_block_bwd (their
// declarations in parallel/cp_block_ops_decl.h), so the ring attention can be
// tested before the real ops exist.
#include <cmath>
#include <limits>
#include <vector>

#include "parallel/cp_block_ops_decl.h"

namespace kestrel::ops {

namespace {
std::vector<double> host(const Tensor& t) {
  std::vector<float> f = t.to_float_vector();
  return {f.begin(), f.end()};
}
void put(Tensor& t, const std::vector<double>& v) {
  t.copy_from(Tensor::from_vector(std::vector<float>(v.begin(), v.end()), t.shape()));
}
struct Geo {
  int64_t H, Hkv, hd, vd, G;
  double scale;
};
Geo geo(const AttentionShape& s) {
  return {s.n_heads, s.n_kv_heads, s.head_dim, s.value_dim(), s.n_heads / s.n_kv_heads,
          s.scale > 0 ? double(s.scale) : 1.0 / std::sqrt(double(s.head_dim))};
}
}  // namespace

void attention_block_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionBlock& blk,
                         const AttentionShape& s, Tensor& out, Tensor& lse) {
  const Geo g = geo(s);
  const auto Q = host(q), K = host(k), V = host(v);
  const auto cq = blk.cu_q.to_host<int32_t>(), ck = blk.cu_k.to_host<int32_t>();
  const auto qp = blk.q_pos.to_host<int32_t>(), kp = blk.k_pos.to_host<int32_t>();
  const int64_t Tq = q.size(0);
  std::vector<double> O(size_t(Tq * g.H * g.vd), 0.0), S(size_t(g.H * Tq), -std::numeric_limits<double>::infinity());
  for (size_t b = 0; b + 1 < cq.size(); ++b)
    for (int32_t i = cq[b]; i < cq[b + 1]; ++i)
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t kh = h / g.G;
        std::vector<double> sc;
        std::vector<int32_t> js;
        for (int32_t j = ck[b]; j < ck[b + 1]; ++j) {
          if (kp[j] > qp[i]) continue;
          double d = 0;
          for (int64_t c = 0; c < g.hd; ++c) d += Q[(i * g.H + h) * g.hd + c] * K[(j * g.Hkv + kh) * g.hd + c];
          sc.push_back(d * g.scale);
          js.push_back(j);
        }
        if (js.empty()) continue;
        double m = sc[0];
        for (double x : sc) m = std::max(m, x);
        double z = 0;
        for (double x : sc) z += std::exp(x - m);
        S[h * Tq + i] = m + std::log(z);
        for (size_t t = 0; t < js.size(); ++t) {
          const double p = std::exp(sc[t] - m) / z;
          for (int64_t c = 0; c < g.vd; ++c) O[(i * g.H + h) * g.vd + c] += p * V[(js[t] * g.Hkv + kh) * g.vd + c];
        }
      }
  put(out, O);
  put(lse, S);
}

void attention_merge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  auto O = host(out), Ob = host(out_b), S = host(lse), Sb = host(lse_b);
  const int64_t H = lse.size(0), T = lse.size(1), w = out.size(1) / H;
  const double ninf = -std::numeric_limits<double>::infinity();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const double a = S[h * T + i], b = Sb[h * T + i];
      if (b == ninf) continue;
      const double m = std::max(a, b), n = m + std::log(std::exp(a - m) + std::exp(b - m));
      const double wa = a == ninf ? 0.0 : std::exp(a - n), wb = std::exp(b - n);
      for (int64_t c = 0; c < w; ++c) {
        double& o = O[(i * H + h) * w + c];
        o = o * wa + Ob[(i * H + h) * w + c] * wb;
      }
      S[h * T + i] = n;
    }
  put(out, O);
  put(lse, S);
}

void attention_block_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                         const Tensor& dout, const AttentionBlock& blk, const AttentionShape& s, Tensor& dq,
                         Tensor& dk, Tensor& dv) {
  const Geo g = geo(s);
  const auto Q = host(q), K = host(k), V = host(v), O = host(out), S = host(lse), dO = host(dout);
  auto dQ = host(dq);
  const auto cq = blk.cu_q.to_host<int32_t>(), ck = blk.cu_k.to_host<int32_t>();
  const auto qp = blk.q_pos.to_host<int32_t>(), kp = blk.k_pos.to_host<int32_t>();
  const int64_t Tq = q.size(0), Tk = k.size(0);
  std::vector<double> dK(size_t(Tk * g.Hkv * g.hd), 0.0), dV(size_t(Tk * g.Hkv * g.vd), 0.0);
  for (size_t b = 0; b + 1 < cq.size(); ++b)
    for (int32_t i = cq[b]; i < cq[b + 1]; ++i)
      for (int64_t h = 0; h < g.H; ++h) {
        const int64_t kh = h / g.G;
        double D = 0;
        for (int64_t c = 0; c < g.vd; ++c) D += dO[(i * g.H + h) * g.vd + c] * O[(i * g.H + h) * g.vd + c];
        for (int32_t j = ck[b]; j < ck[b + 1]; ++j) {
          if (kp[j] > qp[i]) continue;
          double d = 0;
          for (int64_t c = 0; c < g.hd; ++c) d += Q[(i * g.H + h) * g.hd + c] * K[(j * g.Hkv + kh) * g.hd + c];
          const double p = std::exp(d * g.scale - S[h * Tq + i]);
          double dp = 0;
          for (int64_t c = 0; c < g.vd; ++c) {
            dp += dO[(i * g.H + h) * g.vd + c] * V[(j * g.Hkv + kh) * g.vd + c];
            dV[(j * g.Hkv + kh) * g.vd + c] += p * dO[(i * g.H + h) * g.vd + c];
          }
          const double ds = p * (dp - D) * g.scale;
          for (int64_t c = 0; c < g.hd; ++c) {
            dQ[(i * g.H + h) * g.hd + c] += ds * K[(j * g.Hkv + kh) * g.hd + c];
            dK[(j * g.Hkv + kh) * g.hd + c] += ds * Q[(i * g.H + h) * g.hd + c];
          }
        }
      }
  put(dq, dQ);
  put(dk, dK);
  put(dv, dV);
}

}  // namespace kestrel::ops
