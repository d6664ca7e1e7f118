// Multi-head latent attention on the CPU.
//
// The absorbed projections are one GEMM per head through the backend GEMM
// (gemm.h), over strided views of q / o_lat and the head's rows of kv_b_proj:
// bf16 operands are widened to f32 once per call (as linear does; of kv_b
// only the half the op reads) and the result rounded once. A few rows (a
// decode step) instead go through per-head kernels in one parallel region
// (mla_cpu_isa.inc), kv_b streamed once, bf16 widened in registers.
//
// The latent attention (bodies in mla_cpu_isa.inc, compiled per ISA level,
// isa.h) follows paged_attention_cpu: a task owns (sequence, tile of query
// rows, group of query heads), at most kMaxQv = 32 query vectors, and walks
// the sequence's positions in chunks of 64 through per-key row pointers
// gathered from the block table. MLA is MQA over [c_kv | k_pe] rows of
// D = kv_lora + rope floats, so every query vector of the task reads the same
// rows:
//  - scores: register tiles of 4 (AVX-512; 2 with AVX2) query vectors x 4
//    keys, vectorised over D, one horizontal sum per (query, key);
//  - one online-softmax max/rescale per query vector and chunk (exp2 of scores
//    pre-scaled by scale*log2(e));
//  - P.V over the rows' first kv_lora columns with tiles of 4 query vectors x
//    4 (2) vectors of the latent.
// f32 rows are read in place when D % kVec == 0; bf16 (or odd D) chunks are
// widened once into padded f32 scratch that all query vectors of the task
// reuse. Masked pairs (causal) are never multiplied by 0: scores are -inf by
// select and P.V stops at each row's last visible key. Each output element
// is computed by one task in an order fixed by its own sequence: results do
// not depend on the thread count or the rest of the batch.
#include "backend/cpu/mla_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/mla_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

namespace {

// Rows [off, off + n) of every head's block of kv_b [H*(nope+v), L] in f32:
// kv_b itself when f32 (head h at rows(h) = p + h*head_stride), else just
// those rows widened into scratch ([H, n, L]): the absorb ops read half of
// kv_b each (W_UK or W_UV), so only that half is converted.
struct HeadRows {
  const float* p = nullptr;
  int64_t head_stride = 0;  // floats from one head's rows to the next's
  Tensor scratch;
  const float* rows(int64_t h) const { return p + h * head_stride; }
};

HeadRows head_rows(const Tensor& kv_b, const MlaParams& prm, int64_t off, int64_t n) {
  const int64_t L = prm.kv_lora_rank, block = prm.qk_nope_head_dim + prm.v_head_dim;
  HeadRows r;
  if (kv_b.dtype() == DType::F32) {
    r.p = ptr<const float>(kv_b) + off * L;
    r.head_stride = block * L;
    return r;
  }
  r.scratch = Tensor::empty({prm.n_heads * n, L}, DType::F32, MemCategory::Activations);
  float* dst = ptr<float>(r.scratch);
  const bf16_bits* src = ptr<const bf16_bits>(kv_b);
  parallel_blocks(prm.n_heads * n, L, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      const bf16_bits* s = src + ((i / n) * block + off + i % n) * L;
      float* d = dst + i * L;
#pragma omp simd
      for (int64_t c = 0; c < L; ++c) d[c] = load_f32(s, c);
    }
  });
  r.p = dst;
  r.head_stride = n * L;
  return r;
}

}  // namespace

// Up to this many rows (decode steps) and with a latent of whole vectors,
// the absorb ops run their own per-head kernels (mla_cpu_isa.inc) instead of
// 2*H small BLAS calls: one parallel region for all heads, kv_b streamed once
// and bf16 read in place. The BLAS path's per-call synchronisation dominated
// decode (bench_mla_attention_bench, mla+absorb).
constexpr int64_t kAbsorbMaxRows = 32;
bool absorb_by_rows(int64_t T, const MlaParams& p) { return T <= kAbsorbMaxRows && p.kv_lora_rank % 16 == 0; }

void mla_absorb_q(const Tensor& q, const Tensor& kv_b, const MlaParams& p, Tensor& q_lat) {
  const int64_t T = q.size(0), H = p.n_heads, L = p.kv_lora_rank, nope = p.qk_nope_head_dim, R = p.qk_rope_head_dim;
  const int64_t ldq = H * (nope + R), ldl = H * (L + R);
  if (T == 0) return;
  if (absorb_by_rows(T, p)) return KESTREL_ISA_CALL(mla_absorb_q_rows, q, kv_b, p, q_lat);
  const Tensor qf = f32_view(q);
  const HeadRows w_uk = head_rows(kv_b, p, 0, nope);
  // [T, H*(L+R)] f32 result: q_lat itself when f32, else scratch rounded at the end.
  Tensor of = q_lat.dtype() == DType::F32 ? q_lat : Tensor::empty({T, ldl}, DType::F32, MemCategory::Activations);
  const float* qp = ptr<const float>(qf);
  float* op = ptr<float>(of);
  // q_nope_h [T, nope] @ W_UK_h [nope, L] into columns [h*(L+R), h*(L+R) + L).
  for (int64_t h = 0; h < H; ++h)
    sgemm(false, false, T, L, nope, 1.f, qp + h * (nope + R), ldq, w_uk.rows(h), L, 0.f, op + h * (L + R), ldl);
  parallel_blocks(T, ldl, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(op + t * ldl + h * (L + R) + L, qp + t * ldq + h * (nope + R) + nope, size_t(R) * 4);
  });
  if (q_lat.dtype() != DType::F32) store_from_f32(op, q_lat);
}

void mla_absorb_out(const Tensor& o_lat, const Tensor& kv_b, const MlaParams& p, Tensor& o) {
  const int64_t T = o_lat.size(0), H = p.n_heads, L = p.kv_lora_rank, V = p.v_head_dim;
  if (T == 0) return;
  if (absorb_by_rows(T, p)) return KESTREL_ISA_CALL(mla_absorb_out_rows, o_lat, kv_b, p, o);
  const Tensor lf = f32_view(o_lat);
  const HeadRows w_uv = head_rows(kv_b, p, p.qk_nope_head_dim, V);
  Tensor of = o.dtype() == DType::F32 ? o : Tensor::empty({T, H * V}, DType::F32, MemCategory::Activations);
  const float* lp = ptr<const float>(lf);
  float* op = ptr<float>(of);
  // o_lat_h [T, L] @ W_UV_h^T, W_UV_h [V, L].
  for (int64_t h = 0; h < H; ++h)
    sgemm(false, true, T, V, L, 1.f, lp + h * L, H * L, w_uv.rows(h), L, 0.f, op + h * V, H * V);
  if (o.dtype() != DType::F32) store_from_f32(op, o);
}

void paged_latent_write(const Tensor& c_kv, const Tensor& k_pe, const int32_t* slots, Tensor& cache) {
  const int64_t T = c_kv.size(0);
  const size_t es = dtype_size(cache.dtype()), lb = size_t(c_kv.size(1)) * es, rb = size_t(k_pe.size(1)) * es;
  const char* cs = static_cast<const char*>(c_kv.raw());
  const char* ks = static_cast<const char*>(k_pe.raw());
  char* d = static_cast<char*>(cache.raw());
  parallel_blocks(T, int64_t(lb + rb), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (slots[t] < 0) continue;
      char* row = d + size_t(slots[t]) * (lb + rb);
      std::memcpy(row, cs + size_t(t) * lb, lb);
      std::memcpy(row + lb, ks + size_t(t) * rb, rb);
    }
  });
}

void paged_latent_attention_fwd(const Tensor& q_lat, const Tensor& cache, const int32_t* block_tables,
                                const int32_t* cu_q, const int32_t* seq_lens, int64_t n_seqs, const MlaParams& p,
                                Tensor& o_lat) {
  KESTREL_ISA_CALL(paged_latent_attention_fwd, q_lat, cache, block_tables, cu_q, seq_lens, n_seqs, p, o_lat);
}

}  // namespace kestrel::cpu
