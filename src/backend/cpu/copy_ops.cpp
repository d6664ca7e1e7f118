#include "backend/cpu/copy_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/kernel_util.h"
#include "core/dtype.h"
#include "core/status.h"

namespace kestrel::cpu {

namespace {

template <class T>
void fill_as(Tensor& x, T v) {
  T* p = static_cast<T*>(x.raw());
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) p[i] = v;
}

// Bytes of one row along dim 0.
size_t row_bytes(const Tensor& t) {
  return t.size(0) ? t.nbytes() / size_t(t.size(0)) : size_t(0);
}

// index values in [0, rows); names the op and the offending entry otherwise.
const int32_t* checked_index(const char* op, const Tensor& index, int64_t rows) {
  const int32_t* ix = index.data<int32_t>();
  for (int64_t i = 0; i < index.numel(); ++i)
    if (ix[i] < 0 || ix[i] >= rows)
      KS_FAIL("ops::", op, ": index[", i, "] = ", ix[i], " is outside the ", rows, " rows [0, ", rows, ")");
  return ix;
}

}  // namespace

void fill(Tensor& x, float v) {
  switch (x.dtype()) {
    case DType::F32: return fill_as<float>(x, v);
    case DType::BF16: return fill_as<uint16_t>(x, float_to_bf16(v));
    case DType::F16: return fill_as<uint16_t>(x, float_to_f16(v));
    case DType::I32: return fill_as<int32_t>(x, int32_t(v));
    case DType::I64: return fill_as<int64_t>(x, int64_t(v));
    case DType::U8: return fill_as<uint8_t>(x, uint8_t(v));
  }
}

void zero(Tensor& x) {
  if (x.nbytes()) std::memset(x.raw(), 0, x.nbytes());
}

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const int32_t* ix = checked_index("gather_rows", index, src.size(0));
  const size_t rb = row_bytes(dst);
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
  const int64_t n = index.numel();
#pragma omp parallel for schedule(static) if (n * int64_t(rb) > (1 << 20))
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + size_t(i) * rb, s + size_t(ix[i]) * rb, rb);
}

void scatter_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const int64_t rows = dst.size(0), n = index.numel();
  const int32_t* ix = checked_index("scatter_rows", index, rows);
  // Distinct targets: a repeated row would be a write race on a parallel device.
  std::vector<int64_t> seen(size_t(rows), -1);
  for (int64_t i = 0; i < n; ++i) {
    if (seen[size_t(ix[i])] >= 0)
      KS_FAIL("ops::scatter_rows: index[", seen[size_t(ix[i])], "] and index[", i, "] are both ", ix[i],
              "; the target rows must be distinct");
    seen[size_t(ix[i])] = i;
  }
  const size_t rb = row_bytes(src);
  const char* s = static_cast<const char*>(src.raw());
  char* d = static_cast<char*>(dst.raw());
#pragma omp parallel for schedule(static) if (n * int64_t(rb) > (1 << 20))
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + size_t(ix[i]) * rb, s + size_t(i) * rb, rb);
}

void pad_rows(const Tensor& src, Tensor& dst, float fill_value) {
  const size_t head = src.nbytes();
  if (head) std::memmove(dst.raw(), src.raw(), head);
  Tensor tail = dst.slice_rows(src.size(0), dst.size(0));
  if (fill_value == 0.f)
    zero(tail);
  else
    fill(tail, fill_value);
}

void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols) {
  const size_t es = dtype_size(src.dtype()), w = size_t(ncols) * es;
  const size_t sr = size_t(src.size(1)) * es, dr = size_t(dst.size(1)) * es;
  const char* s = static_cast<const char*>(src.raw()) + size_t(src_col) * es;
  char* d = static_cast<char*>(dst.raw()) + size_t(dst_col) * es;
  const int64_t R = src.size(0);
#pragma omp parallel for schedule(static) if (R * int64_t(w) > (1 << 20))
  for (int64_t i = 0; i < R; ++i) std::memcpy(d + size_t(i) * dr, s + size_t(i) * sr, w);
}

void sum_rows(const Tensor& src, Tensor& dst) {
  const int64_t R = src.size(0), C = dst.numel();
  const float* s = src.data<float>();
  float* d = dst.data<float>();
#pragma omp parallel for schedule(static) if (R * C > (1 << 18))
  for (int64_t c = 0; c < C; ++c) {
    float acc = s[c];
    for (int64_t r = 1; r < R; ++r) acc += s[r * C + c];
    d[c] = acc;
  }
}

// One memcpy per (row, head); parallel over rows when the copy is large.
void copy_head_cols(const Tensor& src, int64_t src_heads, int64_t src_col, Tensor& dst, int64_t n_heads,
                    int64_t dst_col, int64_t ncols) {
  const size_t es = dtype_size(src.dtype()), w = size_t(ncols) * es;
  const int64_t Ws = src.size(1) / src_heads, Wd = dst.size(1) / n_heads, R = src.size(0);
  const size_t sr = size_t(src.size(1)) * es, dr = size_t(dst.size(1)) * es;
  const size_t s_head = src_heads == 1 ? 0 : size_t(Ws) * es, d_head = size_t(Wd) * es;
  const char* s = static_cast<const char*>(src.raw()) + size_t(src_col) * es;
  char* d = static_cast<char*>(dst.raw()) + size_t(dst_col) * es;
  if (w == 0) return;
#pragma omp parallel for schedule(static) if (R * n_heads * int64_t(w) > (1 << 20))
  for (int64_t i = 0; i < R; ++i)
    for (int64_t h = 0; h < n_heads; ++h)
      std::memcpy(d + size_t(i) * dr + size_t(h) * d_head, s + size_t(i) * sr + size_t(h) * s_head, w);
}

namespace {
// dst[t, j] = src[t, src_col + j] + src[t, Ws + src_col + j] + ... (heads in order, f32).
template <class T>
void sum_head_cols_as(const T* src, int64_t R, int64_t n_heads, int64_t Ws, int64_t src_col, float* dst,
                      int64_t ncols) {
  const int64_t row = n_heads * Ws;
#pragma omp parallel for schedule(static) if (R * row > (1 << 18))
  for (int64_t t = 0; t < R; ++t) {
    float* o = dst + t * ncols;
    const T* x = src + t * row + src_col;
#pragma omp simd
    for (int64_t j = 0; j < ncols; ++j) o[j] = load_f32(x, j);
    for (int64_t h = 1; h < n_heads; ++h) {
      const T* xh = x + h * Ws;
#pragma omp simd
      for (int64_t j = 0; j < ncols; ++j) o[j] += load_f32(xh, j);
    }
  }
}
}  // namespace

void sum_head_cols(const Tensor& src, int64_t n_heads, int64_t src_col, Tensor& dst, int64_t ncols) {
  const int64_t R = src.size(0), Ws = src.size(1) / n_heads;
  float* d = dst.data<float>();
  if (src.dtype() == DType::F32)
    sum_head_cols_as(src.data<float>(), R, n_heads, Ws, src_col, d, ncols);
  else
    sum_head_cols_as(static_cast<const bf16_bits*>(src.raw()), R, n_heads, Ws, src_col, d, ncols);
}

}  // namespace kestrel::cpu
