// CPU kernels of ops/copy.h. Same contracts; the ops layer has checked
// dtypes, shapes and devices. Index values are checked here (they are read on
// the host), so a bad index fails with a message instead of writing out of bounds.
#pragma once
#include "core/tensor.h"

namespace kestrel::cpu {

void fill(Tensor& x, float v);
void zero(Tensor& x);
void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst);
void scatter_rows(const Tensor& src, const Tensor& index, Tensor& dst);
void pad_rows(const Tensor& src, Tensor& dst, float fill);
void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols);
void sum_rows(const Tensor& src, Tensor& dst);
void copy_head_cols(const Tensor& src, int64_t src_heads, int64_t src_col, Tensor& dst, int64_t n_heads,
                    int64_t dst_col, int64_t ncols);
void sum_head_cols(const Tensor& src, int64_t n_heads, int64_t src_col, Tensor& dst, int64_t ncols);

}  // namespace kestrel::cpu
