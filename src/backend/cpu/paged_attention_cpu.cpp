// Paged attention on the CPU, on the 8-float vectors of vec8.h, in the style
// of attention_cpu_tiles.h.
//
// A task owns (sequence, tile of up to kQTile query rows, kv heads: all of
// them when the task's state is small, as in decode, else one) and walks the
// sequence's keys in chunks of whole blocks (up to kMaxChunk keys), through
// per-key row pointers gathered from the block table. Per chunk:
//  - scores: per query vector (or pair of vectors that see the same keys,
//    sharing each key load), 8 keys at a time, partial dot products kept in
//    vectors over head_dim and folded into one vector of 8 scores by a fixed
//    transpose-add tree: no horizontal reduction per key;
//  - one online-softmax max/rescale per query vector and chunk (exp2 of
//    scores pre-scaled by scale*log2(e));
//  - P.V with register tiles of 4 query vectors x 16 floats of head_dim,
//    2 x 32 or 1 x 32, vectorised over head_dim.
// Read in place when head_dim % 8 == 0: f32 caches always, bf16 caches for
// the few query vectors of a decode (widened on each load); otherwise
// (prefill bf16, odd head_dim) the chunk is widened once into padded f32
// scratch rows that every query vector of the tile reuses. All scratch is
// thread-local and only grows: no allocation in the hot loop.
//
// Masked pairs (causal, and cache slots past the context) are never
// multiplied by 0: their scores are -inf by select and P.V stops at each
// row's last visible key, so NaN/Inf in a later token or in garbage slots
// never reaches a visible row. Each output element is computed by one task
// in an order fixed by its own sequence, so results do not depend on the
// thread count or on the rest of the batch.
#include "backend/cpu/paged_attention_cpu.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "backend/cpu/vec8.h"

namespace kestrel::cpu {
namespace {

constexpr int64_t kQTile = 16;  // query rows per task of a prefill chunk
constexpr int64_t kStateFloats = 4096;  // a task's acc (query vectors x padded head_dim): 16 KiB
constexpr int64_t kScoreFloats = 8192;  // a chunk's scores (query vectors x keys): 32 KiB
constexpr int64_t kMaxChunk = 512;      // keys per softmax chunk at most
constexpr int64_t kDirectBf16MaxQ = 4;  // query vectors per kv head up to which bf16 K/V are read in place
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using vec8::exp2v;
using vec8::hmax;
using vec8::hsum;
using vec8::iota;
using vec8::kVec;
using vec8::load;
using vec8::splat;
using vec8::store;
using vec8::vf;
using vec8::vi;
typedef uint16_t vh __attribute__((vector_size(16)));
typedef uint16_t vh_mem __attribute__((vector_size(16), aligned(2), __may_alias__));

inline vf load(const bf16_bits* p) {
#if defined(__AVX2__)
  // GCC splits the generic widening below into two 128-bit halves.
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return __builtin_bit_cast(vf, _mm256_slli_epi32(w, 16));
#else
  const vi w = __builtin_convertvector(*reinterpret_cast<const vh_mem*>(p), vi);
  return __builtin_bit_cast(vf, w << 16);
#endif
}
inline int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Pairwise sums of adjacent lanes of a then b, per 128-bit half (vhaddps).
inline vf hadd(vf a, vf b) {
  return __builtin_shufflevector(a, b, 0, 2, 8, 10, 4, 6, 12, 14) +
         __builtin_shufflevector(a, b, 1, 3, 9, 11, 5, 7, 13, 15);
}
// Lane k = the sum of the lanes of a[k]: 8 horizontal sums in 7 adds and a
// fixed order.
inline vf fold8(const vf (&a)[8]) {
  const vf u0 = hadd(hadd(a[0], a[1]), hadd(a[2], a[3]));  // [0..3 low halves | 0..3 high halves]
  const vf u1 = hadd(hadd(a[4], a[5]), hadd(a[6], a[7]));
  return __builtin_shufflevector(u0, u1, 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(u0, u1, 4, 5, 6, 7, 12, 13, 14, 15);
}

// Scores of one query vector q (dp floats) against the 8 keys kp[0..8)
// (rows kp[k] + off): lane k = q . key k; lanes from n on are -inf (their
// rows are not read: the pointers repeat key 0).
template <class TK>
inline vf scores8(const float* __restrict q, const TK* const* kp, int64_t off, int64_t n, int64_t dp) {
  const TK* kr[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) kr[k] = kp[k < n ? k : 0] + off;
  vf acc[8] = {};
  for (int64_t c = 0; c < dp; c += kVec) {
    const vf qc = load(q + c);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) acc[k] += qc * load(kr[k] + c);
  }
  const vf s = fold8(acc);
  return iota() < int32_t(n) ? s : splat(kNegInf);
}

// scores8 for two query vectors at once (each key row loaded once for both),
// lane for lane the same arithmetic: 4 keys x 2 queries per fold.
template <class TK>
inline void scores8x2(const float* __restrict q0, const float* __restrict q1, const TK* const* kp, int64_t off,
                      int64_t n, int64_t dp, vf& s0, vf& s1) {
  const TK* kr[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) kr[k] = kp[k < n ? k : 0] + off;
  vf half[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    vf acc[8] = {};  // [q0 x keys 4h..4h+3 | q1 x the same keys]
    for (int64_t c = 0; c < dp; c += kVec) {
      const vf a = load(q0 + c), b = load(q1 + c);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const vf x = load(kr[4 * h + k] + c);
        acc[k] += a * x;
        acc[4 + k] += b * x;
      }
    }
    half[h] = fold8(acc);
  }
  const vi keep = iota() < int32_t(n);
  s0 = keep ? __builtin_shufflevector(half[0], half[1], 0, 1, 2, 3, 8, 9, 10, 11) : splat(kNegInf);
  s1 = keep ? __builtin_shufflevector(half[0], half[1], 4, 5, 6, 7, 12, 13, 14, 15) : splat(kNegInf);
}

// Out[r][0:8NV] += sum_{j < n} W[r][j] * B[j][0:8NV] for r < R (B rows by
// pointer, f32 or bf16).
template <int R, int NV, class TK>
inline void tile_wb(const float* W, int64_t ldw, const TK* const* B, int64_t off, int64_t n, float* Out,
                    int64_t ldo) {
  vf acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = load(Out + r * ldo + kVec * v);
  for (int64_t j = 0; j < n; ++j) {
    const TK* bj = B[j] + off;
    vf b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = load(bj + kVec * v);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vf w = splat(W[r * ldw + j]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += w * b[v];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) store(Out + r * ldo + kVec * v, acc[r][v]);
}

// tile_wb over the full padded width dp (at most 8 accumulators per tile).
template <int R, class TK>
inline void rows_wb(const float* W, int64_t ldw, const TK* const* B, int64_t boff, int64_t dp, int64_t n,
                    float* Out) {
  if (n <= 0) return;
  constexpr int64_t kMaxNV = R == 4 ? 2 : 4;
  for (int64_t v0 = 0; v0 < dp / kVec; v0 += kMaxNV) {
    const int64_t off = boff + v0 * kVec;
    float* o = Out + v0 * kVec;
    switch (std::min<int64_t>(kMaxNV, dp / kVec - v0)) {
      case 1: tile_wb<R, 1>(W, ldw, B, off, n, o, dp); break;
      case 2: tile_wb<R, 2>(W, ldw, B, off, n, o, dp); break;
      case 3: if constexpr (kMaxNV >= 3) tile_wb<R, 3>(W, ldw, B, off, n, o, dp); break;
      default: if constexpr (kMaxNV >= 4) tile_wb<R, 4>(W, ldw, B, off, n, o, dp); break;
    }
  }
}

// Thread-local scratch that only grows: no allocation per task (nor per call
// once warm).
struct Scratch {
  std::vector<float> Q, acc, S, m, l, Kf, Vf;
  std::vector<int64_t> lim;
  std::vector<const void*> kp, vp;
  template <class V>
  static auto* get(V& v, int64_t n) {
    if (int64_t(v.size()) < n) v.resize(size_t(n));
    return v.data();
  }
};

struct Task {
  int32_t seq, kv0, kv1;  // kv heads [kv0, kv1)
  int32_t row0;           // first query row of the tile, within the sequence's chunk
  int64_t cost;
};

struct Geom {
  int64_t H, Hkv, G, d, dp, bs, ldq, ldk;
};

// Keys per softmax chunk for nv query vectors: whole blocks, the chunk's
// scores within kScoreFloats.
inline int64_t chunk_keys(int64_t nv, int64_t bs) {
  const int64_t want = std::clamp<int64_t>(kScoreFloats / nv, kVec, kMaxChunk);
  return std::max<int64_t>(1, want / bs) * bs;
}

// One task: rows [row0, row0 + nr) of sequence b, kv heads [kv0, kv1), keys
// in chunks of whole blocks. Direct: K/V read in place from the cache (T
// rows, head_dim % 8 == 0); else each chunk is first widened into padded f32
// scratch rows.
template <class T, bool Direct>
void run_task(const T* q, const T* kc, const T* vc, const int32_t* bt, const int32_t* cu, const int32_t* sl,
              const PagedAttnParams& p, const Geom& g, const Task& t, Scratch& sc, T* out) {
  const int64_t b = t.seq, nq = cu[b + 1] - cu[b], base = sl[b] - nq;
  const int64_t nr = std::min(kQTile, nq - t.row0), nkv = t.kv1 - t.kv0, nvg = nr * g.G, nv = nvg * nkv;
  const int64_t dp = g.dp, d = g.d, bs = g.bs;
  const int64_t C = chunk_keys(nv, bs), sld = round_up(C, kVec);
  const int32_t* table = bt + b * p.max_blocks;
  // Query vectors ordered (kv head, row, head in group): [nv, dp], scaled
  // into log2 units, padding columns zero.
  float* Q = Scratch::get(sc.Q, nv * dp);
  float* acc = Scratch::get(sc.acc, nv * dp);  // [nv, dp] unnormalised outputs
  float* S = Scratch::get(sc.S, nv * sld);     // [nv, sld] scores of a chunk, then probabilities
  float* m = Scratch::get(sc.m, nv);           // running max (log2 units)
  float* l = Scratch::get(sc.l, nv);           // running sum of 2^(s - m)
  int64_t* lim = Scratch::get(sc.lim, nr);     // per row: visible keys of the current chunk
  // The chunk's K / V rows (all kv heads of the task); kv head kvh of key j
  // is at kp[j] + (kvh - kv0) * dp.
  using TK = std::conditional_t<Direct, T, float>;
  const TK** kp = reinterpret_cast<const TK**>(Scratch::get(sc.kp, C));
  const TK** vp = reinterpret_cast<const TK**>(Scratch::get(sc.vp, C));
  float* Kf = nullptr;
  float* Vf = nullptr;
  if constexpr (!Direct) {
    Kf = Scratch::get(sc.Kf, C * nkv * dp);  // [C, nkv, dp] the chunk's rows, widened and padded
    Vf = Scratch::get(sc.Vf, C * nkv * dp);
  }
  const float qmul = p.scale * kLog2e;
  for (int64_t kh = 0; kh < nkv; ++kh)
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t hh = 0; hh < g.G; ++hh) {
        const T* src = q + (cu[b] + t.row0 + r) * g.ldq + ((t.kv0 + kh) * g.G + hh) * d;
        float* dst = Q + ((kh * nr + r) * g.G + hh) * dp;
        int64_t c = 0;
        for (; c + kVec <= d; c += kVec) store(dst + c, load(src + c) * qmul);
        for (; c < d; ++c) dst[c] = load_f32(src, c) * qmul;
        for (; c < dp; ++c) dst[c] = 0.f;
      }
  std::fill(acc, acc + nv * dp, 0.f);
  std::fill(m, m + nv, kNegInf);
  std::fill(l, l + nv, 0.f);

  const int64_t pos0 = base + t.row0;  // absolute position of the tile's first row
  const int64_t last = pos0 + nr - 1;
  for (int64_t c0 = 0; c0 <= last; c0 += C) {
    const int64_t nk = std::min(C, last + 1 - c0);  // keys of the chunk the last row sees
    for (int64_t r = 0; r < nr; ++r) lim[r] = std::clamp<int64_t>(pos0 + r - c0 + 1, 0, nk);  // non-decreasing
    for (int64_t j0 = 0; j0 < nk; j0 += bs) {  // c0 is a multiple of bs
      const int64_t row0 = int64_t(table[(c0 + j0) / bs]) * bs * g.ldk + t.kv0 * d, nb = std::min(bs, nk - j0);
      if constexpr (Direct) {
        for (int64_t j = 0; j < nb; ++j) {
          kp[j0 + j] = kc + row0 + j * g.ldk;
          vp[j0 + j] = vc + row0 + j * g.ldk;
        }
      } else {
        for (int64_t j = 0; j < nb; ++j)
          for (int64_t kh = 0; kh < nkv; ++kh) {
            const T* ks = kc + row0 + j * g.ldk + kh * d;
            const T* vs = vc + row0 + j * g.ldk + kh * d;
            float* kd = Kf + ((j0 + j) * nkv + kh) * dp;
            float* vd = Vf + ((j0 + j) * nkv + kh) * dp;
            int64_t c = 0;
            for (; c + kVec <= d; c += kVec) {
              store(kd + c, load(ks + c));
              store(vd + c, load(vs + c));
            }
            for (; c < d; ++c) {
              kd[c] = load_f32(ks, c);
              vd[c] = load_f32(vs, c);
            }
            for (; c < dp; ++c) kd[c] = vd[c] = 0.f;
            if (kh == 0) {
              kp[j0 + j] = kd;
              vp[j0 + j] = vd;
            }
          }
      }
    }
    // Scores S[qv][j] for j < lim of qv's row (8 keys per step; a step may
    // span two blocks through the row pointers).
    for (int64_t kh = 0; kh < nkv; ++kh)
      for (int64_t i = 0; i < nvg;) {
        const int64_t qv = kh * nvg + i, n = lim[i / g.G];
        const float* qr = Q + qv * dp;
        float* s = S + qv * sld;
        if (i + 1 < nvg && lim[(i + 1) / g.G] == n) {  // a pair that sees the same keys
          for (int64_t j = 0; j < n; j += kVec) {
            vf s0, s1;
            scores8x2(qr, qr + dp, kp + j, kh * dp, std::min(kVec, n - j), dp, s0, s1);
            store(s + j, s0);
            store(s + sld + j, s1);
          }
          i += 2;
        } else {
          for (int64_t j = 0; j < n; j += kVec) store(s + j, scores8(qr, kp + j, kh * dp, std::min(kVec, n - j), dp));
          i += 1;
        }
      }
    // One max/rescale per query vector and chunk.
    for (int64_t qv = 0; qv < nv; ++qv) {
      const int64_t n = lim[(qv % nvg) / g.G];
      if (n == 0) continue;
      float* s = S + qv * sld;
      // Lanes at or past n are -inf (scores8): they never raise the max and
      // add 0 to the sum.
      vf mx = splat(kNegInf);
      for (int64_t j = 0; j < n; j += kVec) {
        const vf x = load(s + j);
        mx = x > mx ? x : mx;
      }
      const float m_new = std::max(m[qv], hmax(mx));
      vf sum{};
      for (int64_t j = 0; j < n; j += kVec) {
        const vf pj = exp2v(load(s + j) - m_new);  // -inf lanes -> 0
        store(s + j, pj);
        sum += pj;
      }
      const float alpha = exp2v(splat(m[qv] - m_new))[0];
      l[qv] = l[qv] * alpha + hsum(sum);
      m[qv] = m_new;
      if (alpha != 1.f) {
        float* a = acc + qv * dp;
        const vf av = splat(alpha);
        for (int64_t c = 0; c < dp; c += kVec) store(a + c, load(a + c) * av);
      }
    }
    // acc += P V: query vectors in tiles of 4 over the keys all four see,
    // then each alone over the rest of its keys (lim grows with the row).
    for (int64_t kh = 0; kh < nkv; ++kh) {
      const int64_t off = kh * dp;
      float* a = acc + kh * nvg * dp;
      const float* w = S + kh * nvg * sld;
      int64_t i = 0;
      auto rest = [&](int64_t i0, int64_t i1, int64_t lo) {  // each of [i0, i1) alone over keys [lo, its lim)
        for (int64_t e = i0; e < i1; ++e) {
          const int64_t hi = lim[e / g.G];
          if (hi > lo) rows_wb<1>(w + e * sld + lo, sld, vp + lo, off, dp, hi - lo, a + e * dp);
        }
      };
      for (; i + 4 <= nvg; i += 4) {
        const int64_t lo = lim[i / g.G];
        rows_wb<4>(w + i * sld, sld, vp, off, dp, lo, a + i * dp);
        rest(i, i + 4, lo);
      }
      for (; i + 2 <= nvg; i += 2) {
        const int64_t lo = lim[i / g.G];
        rows_wb<2>(w + i * sld, sld, vp, off, dp, lo, a + i * dp);
        rest(i, i + 2, lo);
      }
      if (i < nvg) rows_wb<1>(w + i * sld, sld, vp, off, dp, lim[i / g.G], a + i * dp);
    }
  }
  for (int64_t kh = 0; kh < nkv; ++kh)
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t hh = 0; hh < g.G; ++hh) {
        const int64_t qv = (kh * nr + r) * g.G + hh;
        const float inv = 1.f / l[qv];
        T* o = out + (cu[b] + t.row0 + r) * g.ldq + ((t.kv0 + kh) * g.G + hh) * d;
        int64_t c = 0;
        if constexpr (std::is_same_v<T, float>)
          for (; c + kVec <= d; c += kVec) store(o + c, load(acc + qv * dp + c) * inv);
        for (; c < d; ++c) store_f32(o, c, acc[qv * dp + c] * inv);
      }
}

template <class T>
void fwd_impl(const T* q, const T* kc, const T* vc, const int32_t* bt, const int32_t* cu, const int32_t* sl,
              int64_t n_seqs, const PagedAttnParams& p, T* out) {
  Geom g;
  g.H = p.n_heads;
  g.Hkv = p.n_kv_heads;
  g.G = g.H / g.Hkv;
  g.d = p.head_dim;
  g.dp = round_up(g.d, kVec);
  g.bs = p.block_size;
  g.ldq = g.H * g.d;
  g.ldk = g.Hkv * g.d;

  // A task takes every kv head when its accumulators stay small (decode:
  // fewer, longer tasks), else one kv head.
  std::vector<Task> tasks;
  int64_t total_cost = 0;
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t nq = cu[b + 1] - cu[b], base = sl[b] - nq;
    for (int64_t r0 = 0; r0 < nq; r0 += kQTile) {
      const int64_t nr = std::min(kQTile, nq - r0);
      const int64_t step = nr * g.H * g.dp <= kStateFloats ? g.Hkv : 1;
      for (int64_t k0 = 0; k0 < g.Hkv; k0 += step) {
        const int64_t cost = nr * g.G * step * (base + r0 + nr) * g.d;
        tasks.push_back({int32_t(b), int32_t(k0), int32_t(k0 + step), int32_t(r0), cost});
        total_cost += cost;
      }
    }
  }
  // Longest first, so the dynamic schedule ends with short tasks.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const bool par = tasks.size() > 1 && worth_parallel(total_cost);

#pragma omp parallel if (par)
  {
    static thread_local Scratch sc;
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const Task& t = tasks[ti];
      // bf16 rows are widened on every use when read in place: worth it for
      // the few query vectors of a decode, not for a prefill tile.
      const int64_t nv = std::min<int64_t>(kQTile, cu[t.seq + 1] - cu[t.seq] - t.row0) * g.G;
      if (g.d % kVec == 0 && (std::is_same_v<T, float> || nv <= kDirectBf16MaxQ))
        run_task<T, true>(q, kc, vc, bt, cu, sl, p, g, t, sc, out);
      else
        run_task<T, false>(q, kc, vc, bt, cu, sl, p, g, t, sc, out);
    }
  }
}

}  // namespace

void paged_kv_write(const Tensor& k, const Tensor& v, const int32_t* slots, Tensor& k_cache, Tensor& v_cache) {
  const int64_t T = k.size(0);
  const size_t row = size_t(k.size(1)) * dtype_size(k.dtype());
  const char* ks = static_cast<const char*>(k.raw());
  const char* vs = static_cast<const char*>(v.raw());
  char* kd = static_cast<char*>(k_cache.raw());
  char* vd = static_cast<char*>(v_cache.raw());
  parallel_blocks(T, int64_t(row), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (slots[t] < 0) continue;
      std::memcpy(kd + size_t(slots[t]) * row, ks + size_t(t) * row, row);
      std::memcpy(vd + size_t(slots[t]) * row, vs + size_t(t) * row, row);
    }
  });
}

void paged_attention_fwd(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const int32_t* block_tables,
                         const int32_t* cu_q, const int32_t* seq_lens, int64_t n_seqs, const PagedAttnParams& p,
                         Tensor& out) {
  dispatch_float(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fwd_impl(ptr<const T>(q), ptr<const T>(k_cache), ptr<const T>(v_cache), block_tables, cu_q, seq_lens, n_seqs, p,
             ptr<T>(out));
  });
}

void copy_kv_blocks(const Tensor& src, Tensor& dst, const std::vector<std::pair<int32_t, int32_t>>& pairs) {
  const size_t blk = src.nbytes() / size_t(src.size(0));
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  parallel_blocks(int64_t(pairs.size()), int64_t(blk / 4), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(d + size_t(pairs[size_t(i)].second) * blk, s + size_t(pairs[size_t(i)].first) * blk, blk);
  });
}

}  // namespace kestrel::cpu
