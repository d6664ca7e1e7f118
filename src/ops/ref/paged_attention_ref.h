// Scalar paged-attention reference (the oracle for the kernels): gathers each
// sequence's keys through its block table and runs the textbook softmax, in
// any element type F (double in tests).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/ref/attention_ref.h"

namespace kestrel::ops::ref {

// q [T, n_heads*d]; k_cache, v_cache [num_blocks, block_size, n_kv_heads, d];
// block_tables [B, max_blocks]; cu_q [B+1]; seq_lens [B]; out [T, n_heads*d].
template <class F>
void paged_attention_fwd_ref(const F* q, const F* k_cache, const F* v_cache, int64_t block_size,
                             const int32_t* block_tables, int64_t max_blocks, const int32_t* cu_q,
                             const int32_t* seq_lens, int64_t n_seqs, const AttnRefShape& s, F* out) {
  const int64_t d = s.head_dim, ldq = s.n_heads * d, ldk = s.n_kv_heads * d;
  const F scale = F(s.resolved_scale());
  auto key_row = [&](const F* cache, int64_t b, int64_t pos, int64_t kvh) {
    const int64_t blk = block_tables[b * max_blocks + pos / block_size];
    return cache + (blk * block_size + pos % block_size) * ldk + kvh * d;
  };
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t q0 = cu_q[b], nq = cu_q[b + 1] - cu_q[b], ctx = seq_lens[b];
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t pos = ctx - nq + i;
      for (int64_t h = 0; h < s.n_heads; ++h) {
        const int64_t kvh = h / (s.n_heads / s.n_kv_heads);
        const F* qr = q + (q0 + i) * ldq + h * d;
        std::vector<F> p(size_t(pos + 1));
        F m = -std::numeric_limits<F>::infinity();
        for (int64_t j = 0; j <= pos; ++j) {
          const F* kr = key_row(k_cache, b, j, kvh);
          F dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += qr[c] * kr[c];
          p[size_t(j)] = dot * scale;
          if (p[size_t(j)] > m) m = p[size_t(j)];
        }
        F sum = 0;
        for (auto& x : p) sum += (x = std::exp(x - m));
        F* o = out + (q0 + i) * ldq + h * d;
        for (int64_t c = 0; c < d; ++c) o[c] = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          const F* vr = key_row(v_cache, b, j, kvh);
          for (int64_t c = 0; c < d; ++c) o[c] += p[size_t(j)] / sum * vr[c];
        }
      }
    }
  }
}

}  // namespace kestrel::ops::ref
