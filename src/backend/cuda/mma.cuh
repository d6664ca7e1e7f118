// Tensor-core matrix multiply-accumulate of one warp, PTX's
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32: C[16 x 8] += A[16 x 16] B[16 x 8]
// with bf16 operands and f32 accumulation (sm_80 and later; sm_90 runs it
// too). Included like device_util.cuh, inside a kernel file's namespace.
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane L has
// group g = L / 4 and t = L % 4.
//   A (row-major, 4 registers of two bf16 each, the lower half the lower column):
//     a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B (column-major, 2 registers): b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]
//   C (4 floats): c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1]
// So a C fragment of scores is, pair by pair, an A fragment of the next product
// (FlashAttention-2's P V without a trip through shared memory).
//
// The CUDA emulator (tests/cuda_emu) has no tensor cores: there each lane
// gathers its two rows of A and two columns of B from the other lanes by
// shuffles and sums the 16 products in f32, which checks every kernel's
// fragment bookkeeping against the layout above.
#pragma once

// The bits of v rounded to bf16 (nearest even, as everywhere in Kestrel).
__device__ __forceinline__ uint32_t bf16_bits(float v) {
  const bf16 h = __float2bfloat16_rn(v);
  uint16_t b;
  __builtin_memcpy(&b, &h, sizeof b);
  return b;
}
// Two floats as one register of two bf16: lo in the lower half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) { return bf16_bits(lo) | (bf16_bits(hi) << 16); }
// The float of the lower (hi = false) or upper bf16 of a register.
__device__ __forceinline__ float bf16x2_part(uint32_t w, bool hi) {
  const uint32_t u = (hi ? w & 0xffff0000u : w << 16);
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// x0 and x1 each split exactly into three bf16 parts, x = hi + mid + lo (as
// dense_ops.cpp's split_bf16 does for whole tensors), packed pairwise: w[0]
// the two hi parts, w[1] the mids, w[2] the los. Three products with a bf16
// operand then sum to the f32 product up to summation order.
__device__ __forceinline__ void split3_bf16x2(float x0, float x1, uint32_t (&w)[3]) {
  float r0 = x0, r1 = x1;
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const uint32_t b0 = bf16_bits(r0), b1 = bf16_bits(r1);
    w[p] = b0 | (b1 << 16);
    r0 -= bf16x2_part(b0, false);
    r1 -= bf16x2_part(b1, false);
  }
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // Row g's and row g+8's A registers: cols 2q, 2q+1 from lane 4g + q (a[0] / a[1]),
  // cols 2q+8, 2q+9 from the same lane's a[2] / a[3].
  uint32_t ra[2][8];
  for (int q = 0; q < 4; ++q) {
    ra[0][q] = __shfl_sync(0xffffffffu, a[0], 4 * g + q);
    ra[1][q] = __shfl_sync(0xffffffffu, a[1], 4 * g + q);
    ra[0][q + 4] = __shfl_sync(0xffffffffu, a[2], 4 * g + q);
    ra[1][q + 4] = __shfl_sync(0xffffffffu, a[3], 4 * g + q);
  }
  // Columns 2t and 2t+1 of B: column n's rows 2q, 2q+1 from lane 4n + q (b0), rows 2q+8, 2q+9 (b1).
  uint32_t rb[2][8];
  for (int j = 0; j < 2; ++j)
    for (int q = 0; q < 4; ++q) {
      // Every lane takes part in each shuffle; lane 4n + q holds column n.
      rb[j][q] = __shfl_sync(0xffffffffu, b0, 4 * (2 * t + j) + q);
      rb[j][q + 4] = __shfl_sync(0xffffffffu, b1, 4 * (2 * t + j) + q);
    }
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 2; ++j) {
      float acc = c[2 * r + j];
      for (int w = 0; w < 8; ++w) {
        acc += bf16x2_part(ra[r][w], false) * bf16x2_part(rb[j][w], false);
        acc += bf16x2_part(ra[r][w], true) * bf16x2_part(rb[j][w], true);
      }
      c[2 * r + j] = acc;
    }
#endif
}

// acc[b] += X Bt_b for the column blocks b < nb of an f32 product X [16 x 16] B:
// X given as two C fragments (x0: columns 0-7, x1: 8-15, the score-shaped
// tiles of attention), split exactly into three bf16 parts (split3_bf16x2) so
// the products are f32's; B staged transposed in shared memory as bf16, bt32
// its 32-bit view with `stride` bf16 per output column and X's columns at
// k0 .. k0 + 15 of each.
template <int kN>
__device__ __forceinline__ void mma_split_x_bt(const float (&x0)[4], const float (&x1)[4], const uint32_t* bt32,
                                               int stride, int k0, int nb, float (&acc)[kN][4]) {
  const int lane = threadIdx.x & 31, gq = lane >> 2, tq = lane & 3;
  uint32_t parts[4][3];
  split3_bf16x2(x0[0], x0[1], parts[0]);
  split3_bf16x2(x0[2], x0[3], parts[1]);
  split3_bf16x2(x1[0], x1[1], parts[2]);
  split3_bf16x2(x1[2], x1[3], parts[3]);
#pragma unroll
  for (int p = 0; p < 3; ++p) {
    const uint32_t a[4] = {parts[0][p], parts[1][p], parts[2][p], parts[3][p]};
#pragma unroll
    for (int b = 0; b < kN; ++b)
      if (b < nb) {
        const uint32_t* col = bt32 + ((8 * b + gq) * stride + k0) / 2 + tq;
        mma_bf16_16816(acc[b], a, col[0], col[4]);
      }
  }
}
