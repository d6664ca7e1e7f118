// Scalar references of ops/mla.h (the oracle for the kernels): naive loops in
// any element type F, run with double in tests. The absorbed attention is
// written out as MQA over the latent rows, exactly as mla.h defines it; the
// tests check it against the decompressed attention separately.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kestrel::ops::ref {

struct MlaRefShape {
  int64_t n_heads = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  double scale = 0;  // 0 = 1/sqrt(nope + rope)
  double resolved_scale() const {
    return scale > 0 ? scale : 1.0 / std::sqrt(double(qk_nope_head_dim + qk_rope_head_dim));
  }
  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

// q [T, H*(nope+rope)], kv_b [H*(nope+v), L] -> q_lat [T, H*(L+rope)]:
// q_lat_h = [q_nope_h W_UK_h | q_pe_h], W_UK_h = kv_b rows h*(nope+v) .. +nope.
template <class F>
void mla_absorb_q_ref(const F* q, const F* kv_b, const MlaRefShape& s, int64_t T, F* q_lat) {
  const int64_t H = s.n_heads, L = s.kv_lora_rank, nope = s.qk_nope_head_dim, R = s.qk_rope_head_dim;
  const int64_t ldq = H * (nope + R), ldl = H * (L + R);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const F* qh = q + t * ldq + h * (nope + R);
      F* o = q_lat + t * ldl + h * (L + R);
      for (int64_t c = 0; c < L; ++c) {
        F acc = 0;
        for (int64_t i = 0; i < nope; ++i) acc += qh[i] * kv_b[(h * (nope + s.v_head_dim) + i) * L + c];
        o[c] = acc;
      }
      for (int64_t i = 0; i < R; ++i) o[L + i] = qh[nope + i];
    }
}

// o_lat [T, H*L], kv_b as above -> o [T, H*v]: o_h = W_UV_h o_lat_h,
// W_UV_h = kv_b rows h*(nope+v)+nope .. +v.
template <class F>
void mla_absorb_out_ref(const F* o_lat, const F* kv_b, const MlaRefShape& s, int64_t T, F* o) {
  const int64_t H = s.n_heads, L = s.kv_lora_rank, nope = s.qk_nope_head_dim, V = s.v_head_dim;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < V; ++c) {
        F acc = 0;
        for (int64_t i = 0; i < L; ++i) acc += o_lat[t * H * L + h * L + i] * kv_b[(h * (nope + V) + nope + c) * L + i];
        o[t * H * V + h * V + c] = acc;
      }
}

// cache [num_slots, L+R] (num_blocks*block_size rows): row slots[t] = [c_kv[t] | k_pe[t]]; -1 skips t.
template <class F>
void paged_latent_write_ref(const F* c_kv, const F* k_pe, const int32_t* slots, int64_t T, int64_t L, int64_t R,
                            F* cache) {
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    F* row = cache + int64_t(slots[t]) * (L + R);
    for (int64_t c = 0; c < L; ++c) row[c] = c_kv[t * L + c];
    for (int64_t c = 0; c < R; ++c) row[L + c] = k_pe[t * R + c];
  }
}

// q_lat [T, H*(L+R)]; cache [num_blocks, block_size, L+R]; block_tables
// [B, max_blocks]; cu_q [B+1]; seq_lens [B] -> o_lat [T, H*L]. Query row i of
// sequence b sits at position seq_lens[b] - q_len_b + i and attends to the
// cache rows of positions 0 .. that one: scores q_lat_h . row, values the
// rows' first L columns.
template <class F>
void paged_latent_attention_ref(const F* q_lat, const F* cache, int64_t block_size, const int32_t* block_tables,
                                int64_t max_blocks, const int32_t* cu_q, const int32_t* seq_lens, int64_t n_seqs,
                                const MlaRefShape& s, F* o_lat) {
  const int64_t H = s.n_heads, L = s.kv_lora_rank, D = s.latent_dim();
  const F scale = F(s.resolved_scale());
  auto row_of = [&](int64_t b, int64_t pos) {
    const int64_t blk = block_tables[b * max_blocks + pos / block_size];
    return cache + (blk * block_size + pos % block_size) * D;
  };
  for (int64_t b = 0; b < n_seqs; ++b) {
    const int64_t q0 = cu_q[b], nq = cu_q[b + 1] - cu_q[b];
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t pos = seq_lens[b] - nq + i;
      for (int64_t h = 0; h < H; ++h) {
        const F* qr = q_lat + (q0 + i) * H * D + h * D;
        std::vector<F> p(size_t(pos + 1));
        F m = -std::numeric_limits<F>::infinity();
        for (int64_t j = 0; j <= pos; ++j) {
          const F* kr = row_of(b, j);
          F dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += qr[c] * kr[c];
          p[size_t(j)] = dot * scale;
          if (p[size_t(j)] > m) m = p[size_t(j)];
        }
        F sum = 0;
        for (auto& x : p) sum += (x = std::exp(x - m));
        F* o = o_lat + (q0 + i) * H * L + h * L;
        for (int64_t c = 0; c < L; ++c) o[c] = 0;
        for (int64_t j = 0; j <= pos; ++j) {
          const F* vr = row_of(b, j);
          for (int64_t c = 0; c < L; ++c) o[c] += p[size_t(j)] / sum * vr[c];
        }
      }
    }
  }
}

}  // namespace kestrel::ops::ref
