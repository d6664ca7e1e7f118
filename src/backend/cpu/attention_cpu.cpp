// Flash attention on CPU over packed sequences, with shared prefixes.
//
// A sequence b that continues p (prefix_of[b] = p) is computed in "key
// coordinates" [p's rows | b's rows]: its query i sits at position P + i
// (P = p's length) and sees keys 0 .. P + i, which is the prefix's keys
// unmasked and then b's own keys causally. A plain sequence is the case P = 0.
//
// Forward: a task per (sequence, kv head, chunk of up to kFwdChunk queries)
// packs the keys it can see (prefix then own, K key-major for the score
// products, V as padded rows) into thread-local buffers, then for each query
// head of the group and each 64-query block runs an online softmax over
// 64-key blocks up to the diagonal; the score tiles stop at the last key the
// tile's rows can see (16-key granularity), so short sequences do not pay for
// whole 64x64 blocks.
//
// Backward (FlashAttention-2 recompute): a task per (root sequence, kv head)
// owns the root and every sequence continuing it. It keeps dK/dV of the root
// rows in a thread-local buffer while it runs the root's own queries and then
// each continuation's (in sequence order, the continuation's keys packed right
// after the root's), so the root's dK/dV sum all of them without races, and
// the query heads of the group are summed in head order. The summation order
// is fixed by the task, never by the thread that runs it: results do not
// depend on the thread count.
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
constexpr int64_t kFwdChunk = 256;  // queries per forward task of a long sequence

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) { return bf16_to_float(x.bits); }
template <class T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) { return bf16{float_to_bf16(x)}; }

inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

struct Geometry {
  int64_t T, H, Hkv, group, d, dp, ldq, ldk;
  explicit Geometry(int64_t T_, const AttnParams& p)
      : T(T_), H(p.n_heads), Hkv(p.n_kv_heads), group(p.n_heads / p.n_kv_heads), d(p.head_dim),
        dp(round_up(p.head_dim, kVec)), ldq(H * d), ldk(Hkv * d) {}
};

struct Seqs {
  const int32_t* cu;
  const int32_t* prefix_of;  // null = none
  int64_t n;
  int64_t start(int64_t b) const { return cu[b]; }
  int64_t len(int64_t b) const { return cu[b + 1] - cu[b]; }
  int64_t prefix(int64_t b) const { return prefix_of ? prefix_of[b] : -1; }
  int64_t prefix_len(int64_t b) const { return prefix(b) >= 0 ? len(prefix(b)) : 0; }
};

// A thread-local scratch array that only grows: no allocation per task.
struct Scratch {
  std::vector<float> v;
  float* get(int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }
};

// n rows of one head (src[i * ld + c]) into key-major columns dst[c * ldt + i].
template <class T>
void pack_cols(const T* __restrict src, int64_t ld, int64_t d, int64_t n, float* __restrict dst, int64_t ldt) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < d; ++c) dst[c * ldt + i] = to_f(src[i * ld + c]);
}
// Columns [n, round_up(n, kKeyTile)) of a key-major buffer: read by the last
// score tile (and masked), zeroed so they hold no stale NaN.
inline void zero_cols(float* dst, int64_t d, int64_t n, int64_t ldt) {
  for (int64_t c = 0; c < d; ++c) std::fill(dst + c * ldt + n, dst + c * ldt + round_up(n, kKeyTile), 0.f);
}
// n rows of one head into f32 rows of dp floats times `mul`, padding columns
// zero; rows [n, n_alloc) are zero too.
template <class T>
void load_rows(const T* __restrict x, int64_t ld, int64_t n, int64_t n_alloc, int64_t d, int64_t dp, float mul,
               float* __restrict dst) {
  for (int64_t r = 0; r < n; ++r) {
    float* o = dst + r * dp;
    for (int64_t c = 0; c < d; ++c) o[c] = to_f(x[r * ld + c]) * mul;
    for (int64_t c = d; c < dp; ++c) o[c] = 0.f;
  }
  std::fill(dst + n * dp, dst + n_alloc * dp, 0.f);
}

struct FwdTask { int64_t seq, kvh, q_begin, q_end; double cost; };
struct BwdTask { int64_t root, kvh; double cost; };

template <class T>
void fwd_impl(const T* q, const T* k, const T* v, const Seqs& sq, const AttnParams& p, T* out, float* lse,
              const Geometry& g) {
  std::vector<FwdTask> tasks;
  for (int64_t s = 0; s < sq.n; ++s) {
    const int64_t P = sq.prefix_len(s), L = sq.len(s);
    for (int64_t a = 0; a < L; a += kFwdChunk) {
      const int64_t b = std::min(L, a + kFwdChunk);
      for (int64_t kvh = 0; kvh < g.Hkv; ++kvh) tasks.push_back({s, kvh, a, b, double(b - a) * double(P + (a + b) / 2 + 16)});
    }
  }
  // Costly tasks first, so the dynamic schedule ends evenly.
  std::stable_sort(tasks.begin(), tasks.end(), [](const FwdTask& a, const FwdTask& b) { return a.cost > b.cost; });
  const float qmul = p.scale * kLog2e;  // scores in log2 units: exp2 instead of exp

#pragma omp parallel
  {
    Scratch kt_s, vr_s;
    std::vector<float> Q(kBlock * g.dp), acc(kBlock * g.dp), S(kBlock * kBlock), m(kBlock), l(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const FwdTask& t = tasks[ti];
      const int64_t s0 = sq.start(t.seq), pre = sq.prefix(t.seq), P = sq.prefix_len(t.seq);
      const int64_t Lk = P + t.q_end, ldt = round_up(Lk, kKeyTile);
      // Keys this task's queries can see: [prefix rows | own rows 0 .. q_end).
      float* KT = kt_s.get(g.d * ldt);  // [d][ldt]
      float* VR = vr_s.get(Lk * g.dp);  // [Lk][dp]
      if (P > 0) {
        const int64_t p0 = sq.start(pre);
        pack_cols(k + p0 * g.ldk + t.kvh * g.d, g.ldk, g.d, P, KT, ldt);
        load_rows(v + p0 * g.ldk + t.kvh * g.d, g.ldk, P, P, g.d, g.dp, 1.f, VR);
      }
      pack_cols(k + s0 * g.ldk + t.kvh * g.d, g.ldk, g.d, t.q_end, KT + P, ldt);
      zero_cols(KT, g.d, Lk, ldt);
      load_rows(v + s0 * g.ldk + t.kvh * g.d, g.ldk, t.q_end, t.q_end, g.d, g.dp, 1.f, VR + P * g.dp);
      for (int64_t h = t.kvh * g.group; h < (t.kvh + 1) * g.group; ++h)
        for (int64_t q0 = t.q_begin; q0 < t.q_end; q0 += kBlock) {
          const int64_t nr = std::min(kBlock, t.q_end - q0), qv = P + q0;  // qv: key position of row 0
          load_rows(q + (s0 + q0) * g.ldq + h * g.d, g.ldq, nr, round_up(nr, 4), g.d, g.dp, qmul, Q.data());
          std::fill(acc.begin(), acc.begin() + nr * g.dp, 0.f);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.f);
          for (int64_t k0 = 0; k0 < qv + nr; k0 += kBlock) {
            const Limits lim{qv, k0, std::min(kBlock, Lk - k0)};
            block_abt(Q.data(), g.dp, KT + k0, ldt, g.d, nr, lim, S.data());
            for (int64_t r = 0; r < nr; ++r) {
              const int64_t n = lim(r);
              if (n == 0) continue;
              float* s = S.data() + r * kBlock;
              vf mx = splat(kNegInf);
              for (int64_t j = 0; j < n; j += kVec) {
                vf x = load(s + j);
                x = (iota() + int32_t(j)) < int32_t(n) ? x : splat(kNegInf);
                store(s + j, x);
                mx = x > mx ? x : mx;
              }
              const float m_new = std::max(m[r], hmax(mx));
              vf sum{};
              for (int64_t j = 0; j < n; j += kVec) {
                const vf pj = exp2v(load(s + j) - m_new);
                store(s + j, pj);
                sum += pj;
              }
              const float alpha = std::exp2(m[r] - m_new);
              l[r] = l[r] * alpha + hsum(sum);
              m[r] = m_new;
              if (alpha != 1.f)
                for (int64_t c = 0; c < g.dp; ++c) acc[r * g.dp + c] *= alpha;
            }
            block_wb(S.data(), VR + k0 * g.dp, g.dp, nr, lim, acc.data());
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
}

// T: storage of q, k, v, out; G: storage of the gradients (f32 in bf16 mode,
// where activation gradients stay f32).
template <class T, class G>
void bwd_impl(const T* q, const T* k, const T* v, const T* out, const float* lse, const G* dout, const Seqs& sq,
              const AttnParams& p, G* dq, G* dk, G* dv, const Geometry& g) {
  // Members of each root: the root, then its continuations in sequence order.
  std::vector<int64_t> n_cont(sq.n + 1, 0), conts;
  for (int64_t s = 0; s < sq.n; ++s)
    if (sq.prefix(s) >= 0) ++n_cont[sq.prefix(s) + 1];
  for (int64_t s = 0; s < sq.n; ++s) n_cont[s + 1] += n_cont[s];  // now offsets into conts
  conts.resize(size_t(n_cont[sq.n]));
  {
    std::vector<int64_t> fill(n_cont.begin(), n_cont.end() - 1);
    for (int64_t s = 0; s < sq.n; ++s)
      if (sq.prefix(s) >= 0) conts[size_t(fill[sq.prefix(s)]++)] = s;
  }
  std::vector<BwdTask> tasks;
  for (int64_t s = 0; s < sq.n; ++s) {
    if (sq.prefix(s) >= 0) continue;
    const double P = double(sq.len(s));
    double cost = P * (P + 1) / 2;
    for (int64_t i = n_cont[s]; i < n_cont[s + 1]; ++i) {
      const double L = double(sq.len(conts[size_t(i)]));
      cost += L * (P + (L + 1) / 2);
    }
    if (cost > 0)
      for (int64_t kvh = 0; kvh < g.Hkv; ++kvh) tasks.push_back({s, kvh, cost});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const BwdTask& a, const BwdTask& b) { return a.cost > b.cost; });
  const float c2 = p.scale * kLog2e, scale = p.scale;

#pragma omp parallel
  {
    Scratch kt_s, vt_s, kr_s, dk_s, dv_s;
    std::vector<float> S(kBlock * kBlock), dS(kBlock * kBlock), Q(kBlock * g.dp), dO(kBlock * g.dp),
        dQ(kBlock * g.dp), lse2(kBlock), D(kBlock);
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const auto [root, kvh, cost] = tasks[ti];
      const int64_t P = sq.len(root), c_begin = n_cont[root], c_end = n_cont[root + 1];
      int64_t max_lc = 0;
      for (int64_t i = c_begin; i < c_end; ++i) max_lc = std::max(max_lc, sq.len(conts[size_t(i)]));
      const int64_t ldt = round_up(P + max_lc, kKeyTile), rows = P + max_lc;
      // Key coordinates [root rows | current continuation's rows].
      float* KT = kt_s.get(g.d * ldt);   // [d][ldt] K key-major (scores)
      float* VT = vt_s.get(g.d * ldt);   // [d][ldt] V key-major (dO V^T)
      float* KR = kr_s.get(rows * g.dp);  // [rows][dp] K rows (dS K)
      float* dK = dk_s.get(rows * g.dp);  // [rows][dp] dK of the root rows, then of the continuation
      float* dV = dv_s.get(rows * g.dp);
      auto pack = [&](int64_t s, int64_t at) {
        const int64_t s0 = sq.start(s), L = sq.len(s);
        pack_cols(k + s0 * g.ldk + kvh * g.d, g.ldk, g.d, L, KT + at, ldt);
        pack_cols(v + s0 * g.ldk + kvh * g.d, g.ldk, g.d, L, VT + at, ldt);
        zero_cols(KT, g.d, at + L, ldt);
        zero_cols(VT, g.d, at + L, ldt);
        load_rows(k + s0 * g.ldk + kvh * g.d, g.ldk, L, L, g.d, g.dp, 1.f, KR + at * g.dp);
        std::fill(dK + at * g.dp, dK + (at + L) * g.dp, 0.f);
        std::fill(dV + at * g.dp, dV + (at + L) * g.dp, 0.f);
      };
      auto write_dkv = [&](int64_t s, int64_t at) {
        const int64_t s0 = sq.start(s), L = sq.len(s);
        for (int64_t r = 0; r < L; ++r) {
          G* ok = dk + (s0 + r) * g.ldk + kvh * g.d;
          G* ov = dv + (s0 + r) * g.ldk + kvh * g.d;
          for (int64_t c = 0; c < g.d; ++c) {
            ok[c] = from_f<G>(dK[(at + r) * g.dp + c]);
            ov[c] = from_f<G>(dV[(at + r) * g.dp + c]);
          }
        }
      };
      pack(root, 0);
      for (int64_t mi = c_begin - 1; mi < c_end; ++mi) {
        const bool is_root = mi < c_begin;
        const int64_t s = is_root ? root : conts[size_t(mi)], off = is_root ? 0 : P;
        const int64_t s0 = sq.start(s), Lq = sq.len(s), Lk = off + Lq;
        if (!is_root) pack(s, P);
        for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h)
          for (int64_t q0 = 0; q0 < Lq; q0 += kBlock) {
            const int64_t nr = std::min(kBlock, Lq - q0), qv = off + q0, na = round_up(nr, 4);
            load_rows(q + (s0 + q0) * g.ldq + h * g.d, g.ldq, nr, na, g.d, g.dp, 1.f, Q.data());
            load_rows(dout + (s0 + q0) * g.ldq + h * g.d, g.ldq, nr, na, g.d, g.dp, 1.f, dO.data());
            std::fill(dQ.begin(), dQ.begin() + nr * g.dp, 0.f);
            for (int64_t r = 0; r < nr; ++r) {
              const T* o = out + (s0 + q0 + r) * g.ldq + h * g.d;
              float a = 0.f;
              for (int64_t c = 0; c < g.d; ++c) a += dO[r * g.dp + c] * to_f(o[c]);
              D[r] = a;
              lse2[r] = lse[h * g.T + s0 + q0 + r] * kLog2e;
            }
            for (int64_t k0 = 0; k0 < qv + nr; k0 += kBlock) {
              const Limits lim{qv, k0, std::min(kBlock, Lk - k0)};
              block_abt(Q.data(), g.dp, KT + k0, ldt, g.d, nr, lim, S.data());
              block_abt(dO.data(), g.dp, VT + k0, ldt, g.d, nr, lim, dS.data());
              for (int64_t r = 0; r < nr; ++r) {
                float* sr = S.data() + r * kBlock;
                float* dsr = dS.data() + r * kBlock;
                const int64_t n = lim(r);
                const float lr = lse2[r], dr = D[r];
                for (int64_t j = 0; j < n; j += kVec) {
                  const vi keep = (iota() + int32_t(j)) < int32_t(n);
                  // Select, not multiply, so NaN/Inf of masked pairs never leak.
                  const vf pj = keep ? exp2v(load(sr + j) * c2 - lr) : vf{};
                  const vf dsj = keep ? pj * (load(dsr + j) - dr) * scale : vf{};
                  store(sr + j, pj);
                  store(dsr + j, dsj);
                }
              }
              block_wtb(S.data(), dO.data(), g.dp, nr, lim, dV + k0 * g.dp);  // dV += P^T dO
              block_wb(dS.data(), KR + k0 * g.dp, g.dp, nr, lim, dQ.data());  // dQ += dS K
              block_wtb(dS.data(), Q.data(), g.dp, nr, lim, dK + k0 * g.dp);  // dK += dS^T Q
            }
            for (int64_t r = 0; r < nr; ++r) {
              G* o = dq + (s0 + q0 + r) * g.ldq + h * g.d;
              for (int64_t c = 0; c < g.d; ++c) o[c] = from_f<G>(dQ[r * g.dp + c]);
            }
          }
        if (!is_root) write_dkv(s, P);
      }
      write_dkv(root, 0);
    }
  }
}

}  // namespace

void attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const int32_t* cu_seqlens, int64_t n_seqs,
                   const AttnParams& p, Tensor& out, Tensor& lse, const int32_t* prefix_of) {
  const Geometry g(q.size(0), p);
  const Seqs sq{cu_seqlens, prefix_of, n_seqs};
  if (q.dtype() == DType::F32)
    fwd_impl(q.data<float>(), k.data<float>(), v.data<float>(), sq, p, out.data<float>(), lse.data<float>(), g);
  else
    fwd_impl(q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), sq, p, out.data<bf16>(), lse.data<float>(), g);
}

void attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, const int32_t* cu_seqlens, int64_t n_seqs, const AttnParams& p, Tensor& dq,
                   Tensor& dk, Tensor& dv, const int32_t* prefix_of) {
  const Geometry g(q.size(0), p);
  const Seqs sq{cu_seqlens, prefix_of, n_seqs};
  auto run = [&](auto* grad_tag) {
    using G = std::remove_pointer_t<decltype(grad_tag)>;
    if (q.dtype() == DType::F32)
      bwd_impl(q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(), lse.data<float>(),
               dout.data<G>(), sq, p, dq.data<G>(), dk.data<G>(), dv.data<G>(), g);
    else
      bwd_impl(q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), out.data<bf16>(), lse.data<float>(),
               dout.data<G>(), sq, p, dq.data<G>(), dk.data<G>(), dv.data<G>(), g);
  };
  if (dout.dtype() == DType::F32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<bf16*>(nullptr));
}

}  // namespace kestrel::cpu
