// Scalar references (the test oracle) of ops/copy.h, on flat row-major
// arrays of `row` elements per row. Exact: these ops move values, and sum_rows
// is defined by its order.
#pragma once
#include <cstdint>

namespace kestrel::ops::ref {

template <class T>
void fill(T* x, T v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

// dst[i] = src[index[i]], n rows.
template <class T>
void gather_rows(const T* src, const int32_t* index, T* dst, int64_t n, int64_t row) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < row; ++c) dst[i * row + c] = src[int64_t(index[i]) * row + c];
}

// dst[index[i]] = src[i], n rows.
template <class T>
void scatter_rows(const T* src, const int32_t* index, T* dst, int64_t n, int64_t row) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < row; ++c) dst[int64_t(index[i]) * row + c] = src[i * row + c];
}

// dst[:r] = src, dst[r:R] = fill.
template <class T>
void pad_rows(const T* src, T* dst, int64_t r, int64_t R, int64_t row, T fill = T(0)) {
  for (int64_t i = 0; i < R * row; ++i) dst[i] = i < r * row ? src[i] : fill;
}

// dst[i, dst_col + j] = src[i, src_col + j] for R rows and j < n.
template <class T>
void copy_cols(const T* src, int64_t cs, int64_t src_col, T* dst, int64_t cd, int64_t dst_col, int64_t R, int64_t n) {
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < n; ++j) dst[i * cd + dst_col + j] = src[i * cs + src_col + j];
}

// dst[c] = sum over rows in order of src[r, c].
template <class T>
void sum_rows(const T* src, T* dst, int64_t R, int64_t C) {
  for (int64_t c = 0; c < C; ++c) {
    T s = src[c];
    for (int64_t r = 1; r < R; ++r) s += src[r * C + c];
    dst[c] = s;
  }
}

// dst[t, h*Wd + dst_col + j] = src[t, hs*Ws + src_col + j] for R rows, heads
// h < n_heads and j < n; hs = h, or 0 when src_heads == 1 (broadcast).
template <class T>
void copy_head_cols(const T* src, int64_t Ws, int64_t src_heads, int64_t src_col, T* dst, int64_t Wd, int64_t n_heads,
                    int64_t dst_col, int64_t R, int64_t n) {
  for (int64_t t = 0; t < R; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t hs = src_heads == 1 ? 0 : h;
      for (int64_t j = 0; j < n; ++j)
        dst[(t * n_heads + h) * Wd + dst_col + j] = src[(t * src_heads + hs) * Ws + src_col + j];
    }
}

// dst[t, j] = sum over heads in order of src[t, h*Ws + src_col + j] (accumulated in A).
template <class T, class A>
void sum_head_cols(const T* src, int64_t Ws, int64_t n_heads, int64_t src_col, A* dst, int64_t R, int64_t n) {
  for (int64_t t = 0; t < R; ++t)
    for (int64_t j = 0; j < n; ++j) {
      A s = A(src[t * n_heads * Ws + src_col + j]);
      for (int64_t h = 1; h < n_heads; ++h) s += A(src[(t * n_heads + h) * Ws + src_col + j]);
      dst[t * n + j] = s;
    }
}

}  // namespace kestrel::ops::ref
