// Scalar reference (the test oracle) of ops/linear.h, run with T = double.
// Plain loops over packed row-major buffers; no blocking, no threads.
#pragma once
#include <cstdint>

namespace kestrel::ops::ref {

// y[n, out] = x[n, in] @ w[out, in]^T (+ b[out]); b may be nullptr.
template <class T>
void linear_fwd(const T* x, const T* w, const T* b, T* y, int64_t n, int64_t in, int64_t out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out; ++o) {
      T acc = b ? b[o] : T(0);
      for (int64_t i = 0; i < in; ++i) acc += x[t * in + i] * w[o * in + i];
      y[t * out + o] = acc;
    }
}

// dx = dy @ w (written), dw += dy^T @ x, db += column sums of dy; any may be nullptr.
template <class T>
void linear_bwd(const T* x, const T* w, const T* dy, T* dx, T* dw, T* db, int64_t n, int64_t in, int64_t out) {
  if (dx)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < in; ++i) {
        T acc = 0;
        for (int64_t o = 0; o < out; ++o) acc += dy[t * out + o] * w[o * in + i];
        dx[t * in + i] = acc;
      }
  if (dw)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        T acc = 0;
        for (int64_t t = 0; t < n; ++t) acc += dy[t * out + o] * x[t * in + i];
        dw[o * in + i] += acc;
      }
  if (db)
    for (int64_t o = 0; o < out; ++o) {
      T acc = 0;
      for (int64_t t = 0; t < n; ++t) acc += dy[t * out + o];
      db[o] += acc;
    }
}

// y = a + b elementwise.
template <class T>
void add(const T* a, const T* b, T* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] = a[i] + b[i];
}

}  // namespace kestrel::ops::ref
