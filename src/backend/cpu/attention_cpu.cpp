// Flash attention on CPU. Forward: per (sequence, head, 64-query block), an
// online softmax over 64-key blocks up to the diagonal, accumulators in f32.
// Backward (FlashAttention-2): per (sequence, head), for each key block the
// query blocks at or below it recompute P = exp(S - lse), accumulate dK/dV
// for that key block in registers-sized buffers and dQ for the whole
// sequence; dK/dV of one kv group are summed afterwards in head order.
// K and V are first repacked to f32 (key-major for the score products,
// row-major padded to 16 floats for the value products).
#include "backend/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/attention_cpu_tiles.h"

namespace kestrel::cpu {
namespace {
using namespace attn;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) { return bf16_to_float(x.bits); }
template <class T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) { return bf16{float_to_bf16(x)}; }

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

struct Geometry {
  int64_t T, H, Hkv, group, d, dp, Tp, ldq, ldk;
  explicit Geometry(int64_t T_, const AttnParams& p)
      : T(T_), H(p.n_heads), Hkv(p.n_kv_heads), group(p.n_heads / p.n_kv_heads), d(p.head_dim),
        dp(round_up(p.head_dim, kVec)), Tp(round_up(T_, kBlock) + kBlock), ldq(H * d), ldk(Hkv * d) {}
};

// dst [Hkv][Tp][dp]: padded rows (the value side of P.V, dS.K).
template <class T>
Tensor pack_rows(const T* src, const Geometry& g) {
  Tensor t = Tensor::zeros({g.Hkv * g.Tp * g.dp}, DType::F32, MemCategory::Activations);
  float* dst = t.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t h = 0; h < g.Hkv; ++h)
    for (int64_t i = 0; i < g.T; ++i)
      for (int64_t c = 0; c < g.d; ++c) dst[(h * g.Tp + i) * g.dp + c] = to_f(src[i * g.ldk + h * g.d + c]);
  return t;
}

// dst [Hkv][d][Tp]: key-major (the B^T side of Q.K^T, dO.V^T).
template <class T>
Tensor pack_cols(const T* src, const Geometry& g) {
  Tensor t = Tensor::zeros({g.Hkv * g.d * g.Tp}, DType::F32, MemCategory::Activations);
  float* dst = t.data<float>();
  const int64_t nblk = round_up(g.T, kBlock) / kBlock;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t h = 0; h < g.Hkv; ++h)
    for (int64_t b = 0; b < nblk; ++b) {
      const int64_t i1 = std::min(g.T, (b + 1) * kBlock);
      for (int64_t c = 0; c < g.d; ++c)
        for (int64_t i = b * kBlock; i < i1; ++i) dst[(h * g.d + c) * g.Tp + i] = to_f(src[i * g.ldk + h * g.d + c]);
    }
  return t;
}

// Rows [0, n) of one head of x into f32 rows of dp floats times `mul`; rows
// [n, n_alloc) and the padding columns are zero.
template <class T>
void load_rows(const T* x, int64_t ld, int64_t n, int64_t n_alloc, int64_t d, int64_t dp, float mul, float* dst) {
  for (int64_t r = 0; r < n_alloc; ++r) {
    float* o = dst + r * dp;
    if (r < n)
      for (int64_t c = 0; c < d; ++c) o[c] = to_f(x[r * ld + c]) * mul;
    else
      for (int64_t c = 0; c < d; ++c) o[c] = 0.f;
    for (int64_t c = d; c < dp; ++c) o[c] = 0.f;
  }
}

struct FwdTask { int64_t seq, head, qblock; };
struct BwdTask { int64_t seq, head; };

template <class T>
void fwd_impl(const T* q, const T* k, const T* v, const int32_t* cu, int64_t n_seqs, const AttnParams& p, T* out,
              float* lse, const Geometry& g) {
  const Tensor kt = pack_cols(k, g), vr = pack_rows(v, g);
  const float* KT = kt.data<float>();
  const float* VR = vr.data<float>();
  std::vector<FwdTask> tasks;
  for (int64_t s = 0; s < n_seqs; ++s)
    for (int64_t h = 0; h < g.H; ++h)
      for (int64_t b = 0; b * kBlock < cu[s + 1] - cu[s]; ++b) tasks.push_back({s, h, b});
  // Later query blocks see more keys: hand them out first.
  std::stable_sort(tasks.begin(), tasks.end(), [](const FwdTask& a, const FwdTask& b) { return a.qblock > b.qblock; });
  const float qmul = p.scale * kLog2e;  // scores in log2 units: exp2 instead of exp

#pragma omp parallel
  {
    std::vector<float> Q(kBlock * g.dp), acc(kBlock * g.dp), S(kBlock * kBlock), m(kBlock), l(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const auto [seq, h, qb] = tasks[ti];
      const int64_t s0 = cu[seq], L = cu[seq + 1] - s0, q0 = qb * kBlock;
      const int64_t nr = std::min(kBlock, L - q0), kvh = h / g.group;
      load_rows(q + (s0 + q0) * g.ldq + h * g.d, g.ldq, nr, round_up(nr, 4), g.d, g.dp, qmul, Q.data());
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = s0 + kb * kBlock, nk = std::min(kBlock, L - kb * kBlock);
        const bool causal = kb == qb;
        block_abt(Q.data(), g.dp, KT + kvh * g.d * g.Tp + k0, g.Tp, g.d, nr, S.data());
        for (int64_t r = 0; r < nr; ++r) {
          float* s = S.data() + r * kBlock;
          const int32_t lim = int32_t(causal ? r + 1 : nk);
          vf x[4], mx = splat(kNegInf);
          for (int j = 0; j < 4; ++j) {
            x[j] = load(s + 16 * j);
            x[j] = (iota() + 16 * j) < lim ? x[j] : splat(kNegInf);
            mx = x[j] > mx ? x[j] : mx;
          }
          const float m_new = std::max(m[r], hmax(mx));
          vf sum{};
          for (int j = 0; j < 4; ++j) {
            const vf pj = exp2v(x[j] - m_new);
            store(s + 16 * j, pj);
            sum += pj;
          }
          const float alpha = std::exp2(m[r] - m_new);
          l[r] = l[r] * alpha + hsum(sum);
          m[r] = m_new;
          if (alpha != 1.f)
            for (int64_t c = 0; c < g.dp; ++c) acc[r * g.dp + c] *= alpha;
        }
        block_wb(S.data(), VR + (kvh * g.Tp + k0) * g.dp, g.dp, nr, nk, causal, acc.data());
      }
      for (int64_t r = 0; r < nr; ++r) {
        const float inv_l = 1.f / l[r];
        T* o = out + (s0 + q0 + r) * g.ldq + h * g.d;
        for (int64_t c = 0; c < g.d; ++c) o[c] = from_f<T>(acc[r * g.dp + c] * inv_l);
        lse[h * g.T + s0 + q0 + r] = (m[r] + std::log2(l[r])) * kLn2;
      }
    }
  }
}

// T: storage of q, k, v, out; G: storage of the gradients (f32 in bf16 mode,
// where activation gradients stay f32).
template <class T, class G>
void bwd_impl(const T* q, const T* k, const T* v, const T* out, const float* lse, const G* dout, const int32_t* cu,
              int64_t n_seqs, const AttnParams& p, G* dq, G* dk, G* dv, const Geometry& g) {
  const Tensor kt = pack_cols(k, g), kr = pack_rows(k, g), vt = pack_cols(v, g);
  const float* KT = kt.data<float>();
  const float* KR = kr.data<float>();
  const float* VT = vt.data<float>();
  // Per query head dK/dV partials [H][T][dp], summed per kv group below.
  Tensor dkp_t = Tensor::empty({g.H * g.T * g.dp}, DType::F32, MemCategory::Activations);
  Tensor dvp_t = Tensor::empty({g.H * g.T * g.dp}, DType::F32, MemCategory::Activations);
  float* dKp = dkp_t.data<float>();
  float* dVp = dvp_t.data<float>();
  std::vector<BwdTask> tasks;
  for (int64_t s = 0; s < n_seqs; ++s)
    if (cu[s + 1] > cu[s])
      for (int64_t h = 0; h < g.H; ++h) tasks.push_back({s, h});
  auto len = [&](const BwdTask& t) { return cu[t.seq + 1] - cu[t.seq]; };
  std::stable_sort(tasks.begin(), tasks.end(), [&](const BwdTask& a, const BwdTask& b) { return len(a) > len(b); });
  const float c2 = p.scale * kLog2e, scale = p.scale;

#pragma omp parallel
  {
    std::vector<float> S(kBlock * kBlock), dS(kBlock * kBlock), dK(kBlock * g.dp), dV(kBlock * g.dp);
    std::vector<float> Q, dO, dQ, lse2, D;
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const auto [seq, h] = tasks[ti];
      const int64_t s0 = cu[seq], L = cu[seq + 1] - s0, Lp = round_up(L, kBlock), nb = Lp / kBlock;
      const int64_t kvh = h / g.group;
      Q.resize(Lp * g.dp);
      dO.resize(Lp * g.dp);
      dQ.assign(Lp * g.dp, 0.f);
      lse2.resize(Lp);
      D.resize(Lp);
      load_rows(q + s0 * g.ldq + h * g.d, g.ldq, L, Lp, g.d, g.dp, 1.f, Q.data());
      load_rows(dout + s0 * g.ldq + h * g.d, g.ldq, L, Lp, g.d, g.dp, 1.f, dO.data());
      for (int64_t r = 0; r < L; ++r) {
        const T* o = out + (s0 + r) * g.ldq + h * g.d;
        float acc = 0.f;
        for (int64_t c = 0; c < g.d; ++c) acc += dO[r * g.dp + c] * to_f(o[c]);
        D[r] = acc;
        lse2[r] = lse[h * g.T + s0 + r] * kLog2e;
      }
      for (int64_t kb = 0; kb < nb; ++kb) {
        const int64_t k0 = s0 + kb * kBlock, nk = std::min(kBlock, L - kb * kBlock);
        std::fill(dK.begin(), dK.end(), 0.f);
        std::fill(dV.begin(), dV.end(), 0.f);
        for (int64_t qb = kb; qb < nb; ++qb) {
          const int64_t r0 = qb * kBlock, nr = std::min(kBlock, L - r0);
          const bool causal = qb == kb;
          block_abt(Q.data() + r0 * g.dp, g.dp, KT + kvh * g.d * g.Tp + k0, g.Tp, g.d, nr, S.data());
          block_abt(dO.data() + r0 * g.dp, g.dp, VT + kvh * g.d * g.Tp + k0, g.Tp, g.d, nr, dS.data());
          for (int64_t r = 0; r < nr; ++r) {
            float* s = S.data() + r * kBlock;
            float* ds = dS.data() + r * kBlock;
            const int32_t lim = int32_t(causal ? r + 1 : nk);
            const float lr = lse2[r0 + r], dr = D[r0 + r];
            for (int j = 0; j < 4; ++j) {
              const vi keep = (iota() + 16 * j) < lim;
              // Select, not multiply, so NaN/Inf of masked pairs never leak.
              const vf pj = keep ? exp2v(load(s + 16 * j) * c2 - lr) : vf{};
              const vf dsj = keep ? pj * (load(ds + 16 * j) - dr) * scale : vf{};
              store(s + 16 * j, pj);
              store(ds + 16 * j, dsj);
            }
          }
          block_wtb(S.data(), dO.data() + r0 * g.dp, g.dp, nr, nk, causal, dV.data());             // dV += P^T dO
          block_wb(dS.data(), KR + (kvh * g.Tp + k0) * g.dp, g.dp, nr, nk, causal, dQ.data() + r0 * g.dp);  // dQ += dS K
          block_wtb(dS.data(), Q.data() + r0 * g.dp, g.dp, nr, nk, causal, dK.data());             // dK += dS^T Q
        }
        std::copy(dK.begin(), dK.begin() + nk * g.dp, dKp + (h * g.T + k0) * g.dp);
        std::copy(dV.begin(), dV.begin() + nk * g.dp, dVp + (h * g.T + k0) * g.dp);
      }
      for (int64_t r = 0; r < L; ++r) {
        G* o = dq + (s0 + r) * g.ldq + h * g.d;
        for (int64_t c = 0; c < g.d; ++c) o[c] = from_f<G>(dQ[r * g.dp + c]);
      }
    }
  }
  // Sum the partials of each kv group in head order (deterministic).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.T; ++i)
    for (int64_t kvh = 0; kvh < g.Hkv; ++kvh)
      for (int64_t c = 0; c < g.d; ++c) {
        float sk = 0.f, sv = 0.f;
        for (int64_t j = 0; j < g.group; ++j) {
          const int64_t at = ((kvh * g.group + j) * g.T + i) * g.dp + c;
          sk += dKp[at];
          sv += dVp[at];
        }
        dk[i * g.ldk + kvh * g.d + c] = from_f<G>(sk);
        dv[i * g.ldk + kvh * g.d + c] = from_f<G>(sv);
      }
}

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* cu_seqlens, int64_t n_seqs,
                   const AttnParams& p, Tensor& out, Tensor& lse) {
  const Geometry g(q.size(0), p);
  if (q.dtype() == DType::F32)
    fwd_impl(q.data<float>(), k.data<float>(), v.data<float>(), cu_seqlens, n_seqs, p, out.data<float>(),
             lse.data<float>(), g);
  else
    fwd_impl(q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), cu_seqlens, n_seqs, p, out.data<bf16>(),
             lse.data<float>(), g);
}

void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const int32_t* cu_seqlens, int64_t n_seqs, const AttnParams& p, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  const Geometry g(q.size(0), p);
  auto run = [&](auto* grad_tag) {
    using G = std::remove_pointer_t<decltype(grad_tag)>;
    if (q.dtype() == DType::F32)
      bwd_impl(q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(), lse.data<float>(),
               dout.data<G>(), cu_seqlens, n_seqs, p, dq.data<G>(), dk.data<G>(), dv.data<G>(), g);
    else
      bwd_impl(q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), out.data<bf16>(), lse.data<float>(),
               dout.data<G>(), cu_seqlens, n_seqs, p, dq.data<G>(), dk.data<G>(), dv.data<G>(), g);
  };
  if (dout.dtype() == DType::F32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<bf16*>(nullptr));
}

}  // namespace kestrel::cpu
