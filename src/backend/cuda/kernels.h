// Launchers of the CUDA kernels (kernels.cu), over raw device pointers: the
// only interface between nvcc-compiled code and the rest of the backend, so
// no Kestrel header reaches nvcc and no CUDA header reaches callers beyond
// backend/cuda. Every launcher enqueues on `stream` (a cudaStream_t) and
// returns without synchronising. Float storage is F32 or BF16 (FloatKind);
// math is f32, bf16 results rounded to nearest even once, as the CPU kernels do.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kestrel::cuda::launch {

enum class FloatKind : uint8_t { F32, BF16 };

// Every element of p (n elements of `bytes_per_elem` 1, 2, 4 or 8) = the bit
// pattern `bits` (the value already encoded in the element's dtype).
void fill_bits(void* p, int64_t n, int bytes_per_elem, uint64_t bits, void* stream);
// dst[i] = src[i] converted (F32 <-> BF16, round to nearest even; NaN stays NaN).
void convert(const void* src, FloatKind s, void* dst, FloatKind d, int64_t n, void* stream);
// x[i] = hi[i] + mid[i] + lo[i] exactly, each part bf16 (round to nearest even; every
// difference is exact in f32, and the last part has at most 8 significant bits), for
// normal and zero x: a GEMM of a bf16 operand against x runs as three bf16 GEMMs.
void split_bf16(const float* x, void* hi, void* mid, void* lo, int64_t n, void* stream);

// y = a + b elementwise.
void add(const void* a, FloatKind ka, const void* b, FloatKind kb, void* y, FloatKind ky, int64_t n, void* stream);

// RMSNorm over rows of x[N, D]: y = w * round(x * rstd), rstd[N] f32.
void rmsnorm_fwd(const void* x, FloatKind kx, const void* w, FloatKind kw, float eps, void* y, float* rstd,
                 int64_t N, int64_t D, void* stream);
// dx = rstd * (g - n * mean(g * n)), g = dy * w, n = x * rstd (dx has dy's kind, may alias dy);
// dw[D] (f32) += sum over rows in row order of dy * n (one thread per column: deterministic).
void rmsnorm_bwd(const void* x, FloatKind kx, const void* w, FloatKind kw, const float* rstd, const void* dy,
                 FloatKind kg, void* dx, float* dw, int64_t N, int64_t D, void* stream);

// h = round(silu(gate)) * up (the bf16 rounding of silu as HF); h may alias gate or up.
void swiglu_fwd(const void* gate, const void* up, void* h, FloatKind k, int64_t n, void* stream);
// dgate, dup (kind kd) from gate, up (kind k) and dh (kind kd).
void swiglu_bwd(const void* gate, const void* up, FloatKind k, const void* dh, void* dgate, void* dup, FloatKind kd,
                int64_t n, void* stream);

// y[T, D] = table[ids[t] - vocab_start] (zero rows for ids outside [vocab_start, vocab_start + V)).
void embedding_fwd(const int32_t* ids, int64_t T, const void* table, FloatKind kt, int64_t V, int64_t D,
                   int64_t vocab_start, void* y, FloatKind ky, void* stream);
// dtable[V, D] (f32) += dy rows scattered by id, each column summed in token order (deterministic).
void embedding_bwd(const int32_t* ids, int64_t T, const void* dy, FloatKind kg, int64_t V, int64_t D,
                   int64_t vocab_start, float* dtable, void* stream);

// db[out] (f32) += sum over rows of dy[T, out], rows in order per column.
void bias_grad(const void* dy, FloatKind kg, int64_t T, int64_t out, float* db, void* stream);
// y[T, out] += b[out] broadcast over rows (y f32 or bf16, b f32 or bf16).
void add_bias(void* y, FloatKind ky, const void* b, FloatKind kb, int64_t T, int64_t out, void* stream);

// ---- kernels_copy.cu: data movement (ops/copy.h) and RoPE (ops/rope.h) ----
// Row i of dst = row index[i] of src (gather) / row index[i] of dst = row i of src (scatter);
// n rows of row_bytes bytes; indices already checked.
void gather_rows(const void* src, void* dst, const int32_t* index, int64_t n, size_t row_bytes, void* stream);
void scatter_rows(const void* src, void* dst, const int32_t* index, int64_t n, size_t row_bytes, void* stream);
// nbytes of every one of R rows: dst[r*dst_row_bytes + dst_off ...] = src[r*src_row_bytes + src_off ...].
void copy_cols(const void* src, size_t src_row_bytes, size_t src_off, void* dst, size_t dst_row_bytes, size_t dst_off,
               int64_t R, size_t nbytes, void* stream);
// dst[c] = sum over r in row order of src[r, c] (f32 [R, C]).
void sum_rows(const float* src, int64_t R, int64_t C, float* dst, void* stream);
// dst[t, j] (f32) = sum over heads in order of src[t, h*Ws + src_col + j].
void sum_head_cols(const void* src, FloatKind k, int64_t T, int64_t n_heads, int64_t Ws, int64_t src_col, float* dst,
                   int64_t ncols, void* stream);
// In place on x [T, n_heads*width]: the rotation of columns [rot_offset, rot_offset + rot_dim) of each
// head by the f32 tables cos/sin [P, rot_dim/2] at positions pos (already checked); inverse: sin negated.
void rope(void* x, FloatKind k, int64_t T, const int32_t* pos, const float* cos, const float* sin, int64_t n_heads,
          int64_t width, int64_t rot_offset, int64_t rot_dim, bool interleaved, bool inverse, void* stream);

// ---- kernels_loss.cu: ops/loss.h and ops/vocab_loss.h, one block per row ----
// lse, logprob (0 where target < 0) and, when entropy != nullptr, the entropy of each row of logits [T, V].
void logprob_entropy_fwd(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V, float* logprob,
                         float* entropy, float* lse, void* stream);
// dlogits[T, V] (kind ko; may alias logits) from per-row coefficients (device f32 [T]; coef_entropy may be nullptr).
void logprob_entropy_bwd(const void* logits, FloatKind ki, const int32_t* targets, const float* lse,
                         const float* coef_logprob, const float* coef_entropy, int64_t T, int64_t V, void* dlogits,
                         FloatKind ko, void* stream);
void vocab_row_max(const void* logits, FloatKind k, int64_t T, int64_t V, int64_t n_real, float* row_max,
                   void* stream);
void vocab_row_sums(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V, int64_t vocab_start,
                    int64_t n_real, const float* row_max, float* sums, void* stream);
void vocab_softmax_finish(const float* sums, const int32_t* targets, int64_t T, float* lse, float* logprob,
                          float* entropy, void* stream);
void vocab_logprob_entropy_grad(const void* logits, FloatKind k, const int32_t* targets, int64_t T, int64_t V,
                                int64_t vocab_start, int64_t n_real, const float* lse, const float* dlogprob,
                                const float* dentropy, const float* entropy, float* dlogits, void* stream);

// ---- kernels_optim.cu: ops/optim_ops.h, bit for bit the CPU kernels ----
// AdamWScalars (backend/adamw_scalars.h) as a plain struct nvcc can take by value.
struct AdamWArgs {
  bool decay;
  float decay_keep, one_m_beta1, beta2, one_m_beta2, neg_step, bc2_sqrt, eps;
};
// model_copy kind: 0 none, 1 bf16, 2 f16, 3 f32.
void adamw(const AdamWArgs& s, float* master, float* exp_avg, float* exp_avg_sq, const float* grad, int64_t n,
           void* model_copy, int copy_kind, void* stream);
// reuse_fp32_param (ops/reuse_fp32_ops.h): the step on (copy, residual, flags in bit 31 of exp_avg_sq),
// the split of f32 masters and their recovery (v_clean may be nullptr).
void adamw_reuse_fp32(const AdamWArgs& s, uint16_t* copy, uint16_t* residual, float* exp_avg, float* exp_avg_sq,
                      const float* grad, int64_t n, void* stream);
void reuse_fp32_split(const float* master, uint16_t* copy, uint16_t* residual, float* exp_avg_sq, int64_t n,
                      void* stream);
void reuse_fp32_recover(const uint16_t* copy, const uint16_t* residual, const float* exp_avg_sq, float* master,
                        float* v_clean, int64_t n, void* stream);
// part[c] = sum over x[c*chunk, (c+1)*chunk) of double(x)^2 in element order.
void chunk_squares(const float* x, int64_t n, int64_t chunk, double* part, void* stream);
// x *= c.
void scale(float* x, int64_t n, float c, void* stream);

// ---- kernels_attention.cu: ops/attention.h (causal GQA, varlen, prefix_of) ----
// head_dim and value dim above this are refused by the host side.
int attention_max_head_dim();
// q [T, H*hd], k [T, Hkv*hd], v [T, Hkv*vd], out [T, H*vd] of one kind; cu i32 [n+1] and prefix_of
// i32 [n] (or nullptr) on the device, already checked; lse f32 [H, T].
void attention_fwd(const void* q, const void* k, const void* v, FloatKind kd, const int32_t* cu, int n,
                   const int32_t* prefix_of, int64_t T, int H, int Hkv, int hd, int vd, float scale, void* out,
                   float* lse, void* stream);
// q, k, v, out of kind kd; dout, dq, dk, dv of kind gk (f32 grads of bf16 activations in bf16
// training). dq, dk, dv written; dsum_scratch f32 [H, T].
void attention_bwd(const void* q, const void* k, const void* v, const void* out, FloatKind kd, const float* lse,
                   const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, int64_t T, int H,
                   int Hkv, int hd, int vd, float scale, float* dsum_scratch, void* dq, void* dk, void* dv,
                   void* stream);

// ---- kernels_attention_mma.cu: the tensor-core paths attention_fwd / attention_bwd take ----
// Whether they take q, k, v of kind kd with these widths (bf16, multiples of 16 up to 128;
// KESTREL_CUDA_ATTENTION=tiled: never).
bool attention_mma(FloatKind kd, int hd, int vd);
// c[16 x 8] = a[16 x 16] b[16 x 8] (row-major; a, b bf16, c f32, device memory) by one warp's
// tensor-core product, its fragments loaded by the PTX ISA's layout formulas: the layout the
// kernels above assume, checked against the device (cuda::mma_tile_product, tests/cuda).
void mma_tile_product(const uint16_t* a, const uint16_t* b, float* c, void* stream);
// attention_fwd's result on the tensor cores (attention_mma first).
void attention_fwd_mma(const void* q, const void* k, const void* v, const int32_t* cu, int n, const int32_t* prefix_of,
                       int64_t T, int H, int Hkv, int hd, int vd, float scale, void* out, float* lse, void* stream);
// attention_bwd's dq on the tensor cores (attention_mma first; dsum: the D_i of attention_bwd).
void attention_dq_mma(const void* q, const void* k, const void* v, const float* lse, const float* dsum,
                      const void* dout, FloatKind gk, const int32_t* cu, int n, const int32_t* prefix_of, int64_t T,
                      int H, int Hkv, int hd, int vd, float scale, void* dq, void* stream);

// ---- kernels_paged.cu: ops/paged_attention.h ----
// k_cache[slots[t]] = k[t] (and v) for rows with slots[t] >= 0; rows of `width` elements of elem_bytes 2 or 4.
void paged_kv_write(const void* k, const void* v, const int32_t* slots, int64_t T, int64_t width, int elem_bytes,
                    void* k_cache, void* v_cache, void* stream);
// Causal GQA attention of packed query chunks against the cache (metadata on the device, checked).
void paged_attention_fwd(const void* q, const void* k_cache, const void* v_cache, FloatKind kd,
                         const int32_t* block_tables, const int32_t* cu_q, const int32_t* seq_lens, int B, int64_t T,
                         int H, int Hkv, int hd, int block_size, int max_blocks, float scale, void* out, void* stream);
// Within one device cache: block pairs (src, dst) as i32 [n_pairs, 2] on the device; block_bytes % 4 == 0.
void copy_kv_blocks(const void* src, void* dst, const int32_t* pairs, int n_pairs, int64_t block_bytes, void* stream);

}  // namespace kestrel::cuda::launch
