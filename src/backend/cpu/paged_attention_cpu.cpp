#if defined(__GNUC__) && !defined(__clang__)
// As in linear.cpp: let GCC vectorise the `omp simd` reductions at -O2.
#pragma GCC optimize("vect-cost-model=dynamic")
#endif
// Paged attention on the CPU: per (sequence, kv head, 16-query tile), walk the
// sequence's blocks up to the tile's last position with an online softmax.
// f32 caches are read in place; bf16 blocks are widened into a per-thread
// scratch block first (each K/V row is then reused by the whole GQA group).
#include "backend/cpu/paged_attention_cpu.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernel_util.h"

namespace kestrel::cpu {
namespace {

constexpr int64_t kQTile = 16;

struct Task {
  int64_t seq, kv_head, row0, cost;
};

template <class T>
void fwd_impl(const T* q, const T* kc, const T* vc, const int32_t* bt, const int32_t* cu, const int32_t* sl,
              int64_t n_seqs, const PagedAttnParams& p, T* out) {
  const int64_t H = p.n_heads, Hkv = p.n_kv_heads, G = H / Hkv, d = p.head_dim, bs = p.block_size;
  const int64_t ldq = H * d, ldk = Hkv * d;
  std::vector<Task> tasks;
  int64_t total_cost = 0;
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t nq = cu[b + 1] - cu[b], base = sl[b] - nq;
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t r0 = 0; r0 < nq; r0 += kQTile) {
        const int64_t nr = std::min(kQTile, nq - r0);
        const int64_t cost = nr * G * (base + r0 + nr) * d;
        tasks.push_back({b, g, r0, cost});
        total_cost += cost;
      }
  }
  // Longest first, so the dynamic schedule ends with short tasks.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const bool par = tasks.size() > 1 && worth_parallel(total_cost);

#pragma omp parallel if (par)
  {
    const size_t nqv = static_cast<size_t>(kQTile * G);
    std::vector<float> Q(nqv * static_cast<size_t>(d)), acc(nqv * static_cast<size_t>(d)), m(nqv), l(nqv);
    std::vector<float> S(static_cast<size_t>(bs)), Kf, Vf;
    if constexpr (!std::is_same_v<T, float>) {
      Kf.resize(size_t(bs * d));
      Vf.resize(size_t(bs * d));
    }
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const auto [b, g, r0, cost_unused] = tasks[ti];
      (void)cost_unused;
      const int64_t nq = cu[b + 1] - cu[b], base = sl[b] - nq, nr = std::min(kQTile, nq - r0);
      const int64_t nv = nr * G;  // query vectors in this task: row-major (row, head in group)
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t hh = 0; hh < G; ++hh) {
          const T* src = q + (cu[b] + r0 + r) * ldq + (g * G + hh) * d;
          float* dst = Q.data() + (r * G + hh) * d;
          for (int64_t c = 0; c < d; ++c) dst[c] = load_f32(src, c) * p.scale;
        }
      std::fill(acc.begin(), acc.begin() + nv * d, 0.f);
      std::fill(m.begin(), m.begin() + nv, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + nv, 0.f);
      const int64_t last = base + r0 + nr - 1;  // the tile's last absolute position
      for (int64_t kb = 0; kb * bs <= last; ++kb) {
        const int64_t blk = bt[b * p.max_blocks + kb];
        const int64_t nk = std::min(bs, last + 1 - kb * bs);
        const float* K;
        const float* V;
        int64_t ld;
        if constexpr (std::is_same_v<T, float>) {
          K = kc + blk * bs * ldk + g * d;
          V = vc + blk * bs * ldk + g * d;
          ld = ldk;
        } else {
          const T* kb16 = kc + blk * bs * ldk + g * d;
          const T* vb16 = vc + blk * bs * ldk + g * d;
          for (int64_t j = 0; j < nk; ++j)
            for (int64_t c = 0; c < d; ++c) {
              Kf[size_t(j * d + c)] = load_f32(kb16 + j * ldk, c);
              Vf[size_t(j * d + c)] = load_f32(vb16 + j * ldk, c);
            }
          K = Kf.data();
          V = Vf.data();
          ld = d;
        }
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t lim = std::min(nk, base + r0 + r - kb * bs + 1);  // causal: keys up to this row's position
          if (lim <= 0) continue;
          for (int64_t hh = 0; hh < G; ++hh) {
            const int64_t qv = r * G + hh;
            const float* qr = Q.data() + qv * d;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < lim; ++j) {
              const float* kr = K + j * ld;
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
              S[size_t(j)] = dot;
              mx = std::max(mx, dot);
            }
            const float m_new = std::max(m[size_t(qv)], mx);
            const float alpha = exp_f32(m[size_t(qv)] - m_new);
            float psum = 0.f;
#pragma omp simd reduction(+ : psum)
            for (int64_t j = 0; j < lim; ++j) {
              const float e = exp_f32(S[size_t(j)] - m_new);
              S[size_t(j)] = e;
              psum += e;
            }
            l[size_t(qv)] = l[size_t(qv)] * alpha + psum;
            m[size_t(qv)] = m_new;
            float* a = acc.data() + qv * d;
            if (alpha != 1.f) {
#pragma omp simd
              for (int64_t c = 0; c < d; ++c) a[c] *= alpha;
            }
            for (int64_t j = 0; j < lim; ++j) {
              const float pj = S[size_t(j)];
              const float* vr = V + j * ld;
#pragma omp simd
              for (int64_t c = 0; c < d; ++c) a[c] += pj * vr[c];
            }
          }
        }
      }
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t hh = 0; hh < G; ++hh) {
          const int64_t qv = r * G + hh;
          const float inv = 1.f / l[size_t(qv)];
          T* o = out + (cu[b] + r0 + r) * ldq + (g * G + hh) * d;
          for (int64_t c = 0; c < d; ++c) store_f32(o, c, acc[size_t(qv * d + c)] * inv);
        }
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
