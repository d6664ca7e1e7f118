// Paged attention on the CPU, on the kVec-float vectors of simd_layer.inc (8
// with AVX2, 16 with AVX-512: bodies in paged_attention_cpu_isa.inc, compiled
// per ISA level, isa.h), in the style of attention_cpu_tiles.h.
//
// A task owns (sequence, tile of up to kQTile query rows, kv heads: all of
// them when the task's state is small, as in decode, else one) and walks the
// sequence's keys in chunks of whole blocks (up to kMaxChunk keys), through
// per-key row pointers gathered from the block table. Per chunk:
//  - scores: per query vector (or pair of vectors that see the same keys,
//    sharing each key load), kVec keys at a time, partial dot products kept
//    in vectors over head_dim and folded into one vector of kVec scores by a
//    fixed transpose-add tree: no horizontal reduction per key;
//  - one online-softmax max/rescale per query vector and chunk (exp2 of
//    scores pre-scaled by scale*log2(e));
//  - P.V with register tiles of 4 query vectors x 16 floats of head_dim,
//    2 x 32 or 1 x 32, vectorised over head_dim.
// Read in place when head_dim % kVec == 0: f32 caches always, bf16 caches for
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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/paged_attention_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

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
  KESTREL_ISA_CALL(paged_attention_fwd, q, k_cache, v_cache, block_tables, cu_q, seq_lens, n_seqs, p, out);
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
