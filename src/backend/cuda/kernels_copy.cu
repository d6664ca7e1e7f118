// CUDA kernels of the data-movement ops (ops/copy.h) and RoPE (ops/rope.h).
// Launchers in kernels.h. Row copies move bytes in units of the widest
// power-of-two word that divides the row and both base addresses.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace kestrel::cuda::launch {
namespace {

#include "backend/cuda/device_util.cuh"

constexpr int kThreads = 256;

// The word size (1, 2, 4, 8 or 16 bytes) that divides every row offset and base pointer.
int word_for(size_t row_bytes, const void* a, const void* b) {
  const uintptr_t m = uintptr_t(a) | uintptr_t(b) | uintptr_t(row_bytes);
  for (int w : {16, 8, 4, 2})
    if (m % uintptr_t(w) == 0) return w;
  return 1;
}
template <int W> struct Word;
template <> struct Word<1> { using type = uint8_t; };
template <> struct Word<2> { using type = uint16_t; };
template <> struct Word<4> { using type = uint32_t; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// dst row dst_row(i) = src row src_row(i) for i < n rows of `words` words each;
// mode 0: gather (src row index[i], dst row i), 1: scatter (src row i, dst row index[i]).
template <class Wt>
__global__ void rows_kernel(const Wt* src, Wt* dst, const int32_t* index, int64_t n, int64_t words, int mode) {
  const int64_t total = n * words;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / words, j = e % words;
    const int64_t s = mode == 0 ? int64_t(index[i]) : i, d = mode == 0 ? i : int64_t(index[i]);
    dst[d * words + j] = src[s * words + j];
  }
}

// dst[r, dst_off + j] = src[r, src_off + j] for r < R, j < n (in words; strides in words).
template <class Wt>
__global__ void cols_kernel(const Wt* src, int64_t src_stride, int64_t src_off, Wt* dst, int64_t dst_stride,
                            int64_t dst_off, int64_t R, int64_t n) {
  const int64_t total = R * n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / n, j = e % n;
    dst[r * dst_stride + dst_off + j] = src[r * src_stride + src_off + j];
  }
}

template <int W>
void rows_as(const void* src, void* dst, const int32_t* index, int64_t n, size_t row_bytes, int mode, cudaStream_t s) {
  using Wt = typename Word<W>::type;
  const int64_t words = int64_t(row_bytes / W);
  KS_LAUNCH(rows_kernel<Wt>, grid_for(n * words), kThreads, s)(static_cast<const Wt*>(src), static_cast<Wt*>(dst), index,
                                                            n, words, mode);
}

template <int W>
void cols_as(const void* src, size_t src_row, size_t src_off, void* dst, size_t dst_row, size_t dst_off, int64_t R,
             size_t nbytes, cudaStream_t s) {
  using Wt = typename Word<W>::type;
  KS_LAUNCH(cols_kernel<Wt>, grid_for(R * int64_t(nbytes / W)), kThreads, s)(
      static_cast<const Wt*>(src), int64_t(src_row / W), int64_t(src_off / W), static_cast<Wt*>(dst),
      int64_t(dst_row / W), int64_t(dst_off / W), R, int64_t(nbytes / W));
}

__global__ void sum_rows_kernel(const float* src, int64_t R, int64_t C, float* dst) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float acc = src[c];
  for (int64_t r = 1; r < R; ++r) acc += src[r * C + c];
  dst[c] = acc;
}

__global__ void sum_head_cols_kernel(const void* src, FloatKind k, int64_t T, int64_t n_heads, int64_t Ws,
                                     int64_t src_col, float* dst, int64_t ncols) {
  const int64_t total = T * ncols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / ncols, j = e % ncols;
    float acc = 0.f;
    for (int64_t h = 0; h < n_heads; ++h) acc += ld(src, k, t * n_heads * Ws + h * Ws + src_col + j);
    dst[e] = acc;
  }
}

// One thread per (token, head, pair). a = x[first], b = x[second] of the pair:
// (a, b) <- (a c - b s, b c + a s), s negated for the inverse (the CPU kernels' formula).
__global__ void rope_kernel(void* x, FloatKind k, int64_t T, const int32_t* pos, const float* cos, const float* sin,
                            int64_t n_heads, int64_t width, int64_t rot_offset, int64_t rot_dim, bool interleaved,
                            float sgn) {
  const int64_t half = rot_dim / 2, row = n_heads * width;
  const int64_t total = T * n_heads * half;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % half, h = (e / half) % n_heads, t = e / (half * n_heads);
    const int64_t p = pos[t];
    const float c = cos[p * half + i], s = sgn * sin[p * half + i];
    const int64_t base = t * row + h * width + rot_offset;
    const int64_t ia = interleaved ? base + 2 * i : base + i;
    const int64_t ib = interleaved ? base + 2 * i + 1 : base + i + half;
    const float a = ld(x, k, ia), b = ld(x, k, ib);
    st(x, k, ia, a * c - b * s);
    st(x, k, ib, b * c + a * s);
  }
}

}  // namespace

void gather_rows(const void* src, void* dst, const int32_t* index, int64_t n, size_t row_bytes, void* stream) {
  if (n <= 0 || row_bytes == 0) return;
  auto s = as_stream(stream);
  switch (word_for(row_bytes, src, dst)) {
    case 16: return rows_as<16>(src, dst, index, n, row_bytes, 0, s);
    case 8: return rows_as<8>(src, dst, index, n, row_bytes, 0, s);
    case 4: return rows_as<4>(src, dst, index, n, row_bytes, 0, s);
    case 2: return rows_as<2>(src, dst, index, n, row_bytes, 0, s);
    default: return rows_as<1>(src, dst, index, n, row_bytes, 0, s);
  }
}

void scatter_rows(const void* src, void* dst, const int32_t* index, int64_t n, size_t row_bytes, void* stream) {
  if (n <= 0 || row_bytes == 0) return;
  auto s = as_stream(stream);
  switch (word_for(row_bytes, src, dst)) {
    case 16: return rows_as<16>(src, dst, index, n, row_bytes, 1, s);
    case 8: return rows_as<8>(src, dst, index, n, row_bytes, 1, s);
    case 4: return rows_as<4>(src, dst, index, n, row_bytes, 1, s);
    case 2: return rows_as<2>(src, dst, index, n, row_bytes, 1, s);
    default: return rows_as<1>(src, dst, index, n, row_bytes, 1, s);
  }
}

void copy_cols(const void* src, size_t src_row_bytes, size_t src_off, void* dst, size_t dst_row_bytes, size_t dst_off,
               int64_t R, size_t nbytes, void* stream) {
  if (R <= 0 || nbytes == 0) return;
  auto s = as_stream(stream);
  const int w = word_for(src_row_bytes | src_off | dst_row_bytes | dst_off | nbytes, src, dst);
  switch (w) {
    case 16: return cols_as<16>(src, src_row_bytes, src_off, dst, dst_row_bytes, dst_off, R, nbytes, s);
    case 8: return cols_as<8>(src, src_row_bytes, src_off, dst, dst_row_bytes, dst_off, R, nbytes, s);
    case 4: return cols_as<4>(src, src_row_bytes, src_off, dst, dst_row_bytes, dst_off, R, nbytes, s);
    case 2: return cols_as<2>(src, src_row_bytes, src_off, dst, dst_row_bytes, dst_off, R, nbytes, s);
    default: return cols_as<1>(src, src_row_bytes, src_off, dst, dst_row_bytes, dst_off, R, nbytes, s);
  }
}

void sum_rows(const float* src, int64_t R, int64_t C, float* dst, void* stream) {
  if (C > 0) KS_LAUNCH(sum_rows_kernel, grid_for(C), kThreads, as_stream(stream))(src, R, C, dst);
}

void sum_head_cols(const void* src, FloatKind k, int64_t T, int64_t n_heads, int64_t Ws, int64_t src_col, float* dst,
                   int64_t ncols, void* stream) {
  if (T * ncols > 0)
    KS_LAUNCH(sum_head_cols_kernel, grid_for(T * ncols), kThreads, as_stream(stream))(src, k, T, n_heads, Ws, src_col, dst,
                                                                                ncols);
}

void rope(void* x, FloatKind k, int64_t T, const int32_t* pos, const float* cos, const float* sin, int64_t n_heads,
          int64_t width, int64_t rot_offset, int64_t rot_dim, bool interleaved, bool inverse, void* stream) {
  const int64_t total = T * n_heads * (rot_dim / 2);
  if (total > 0)
    KS_LAUNCH(rope_kernel, grid_for(total), kThreads, as_stream(stream))(x, k, T, pos, cos, sin, n_heads, width,
                                                                     rot_offset, rot_dim, interleaved,
                                                                     inverse ? -1.f : 1.f);
}

}  // namespace kestrel::cuda::launch
