// CUDA kernels of ops/copy.h (signatures of backend/cpu/copy_ops.h) and the
// RoPE rotation of ops/rope.h. Index and position values are checked on the
// host (one small device-to-host copy and a synchronisation), so a bad index
// fails with the CPU path's message instead of writing out of bounds.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace kestrel::cuda {

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

// x [T, n_heads*width] rotated in place (ops/rope.h's layout); positions i32 [T] on the device,
// checked against the table's P rows; cos/sin f32 [P, rot_dim/2] on the device. `op` names the caller.
void rope_apply(const char* op, Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin,
                int64_t n_heads, int64_t rot_offset, int64_t rot_dim, bool interleaved, bool inverse);

}  // namespace kestrel::cuda
