// Data movement ops: fills, row gathers/scatters, padding copies and the
// row-sum of data-parallel reductions, so code above ops/ never copies tensor
// memory itself. Rows are along dim 0 (a row of x is x.numel() / x.size(0)
// elements; a 1-D tensor has rows of one element). Any dtype unless noted;
// source and destination share it. Scalar references: ops/ref/copy_ref.h.
#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// Every element of x = v, converted to x's dtype as Tensor::set does
// (bf16/f16 round to nearest even, integers truncate).
void fill(Tensor& x, float v);
// Every element of x = 0 (all bytes zero).
void zero(Tensor& x);

// dst[i] = src[index[i]] for every row i of dst. index: i32 [n] with
// 0 <= index[i] < src.size(0); dst: [n, <src's row shape>].
void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst);
// dst[index[i]] = src[i] for every row i of src; other rows of dst are left
// as they are. index: i32 [n], distinct, each in [0, dst.size(0)).
void scatter_rows(const Tensor& src, const Tensor& index, Tensor& dst);
// dst[:r] = src, dst[r:] = fill (converted as fill() converts), with
// r = src.size(0) <= dst.size(0) and the same row shape: a tensor copied into
// the top of a larger zeroed (or, e.g. for ignored targets, -100-filled) one.
void pad_rows(const Tensor& src, Tensor& dst, float fill = 0.f);

// dst[:, dst_col + j] = src[:, src_col + j] for j < ncols: a block of columns
// of every row. src [R, Cs] and dst [R, Cd] share dtype and row count and do
// not overlap (view an [R, C, inner] tensor as [R, C*inner]). The tensor-
// parallel shard/unshard copies of row-parallel weights and vocab slices.
void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols);

// Column blocks of attention heads (MLA builds its decompressed keys
// k = [k_nope_h | k_pe] and values v_h from kv_b_proj's output with these):
// dst[t, h*Wd + dst_col + j] = src[t, hs*Ws + src_col + j] for every row t, head h < n_heads, j < ncols,
// hs = h when src_heads == n_heads, 0 when src_heads == 1 (one source head broadcast to every head);
// Ws = src.size(1) / src_heads, Wd = dst.size(1) / n_heads. Same dtype (any); no overlap.
void copy_head_cols(const Tensor& src, int64_t src_heads, int64_t src_col, Tensor& dst, int64_t n_heads,
                    int64_t dst_col, int64_t ncols);
// dst[t, j] = sum_h src[t, h*Ws + src_col + j] (written, f32 dst [T, ncols], summed in head order in f32;
// src f32 or bf16, Ws = src.size(1) / n_heads): the backward of a broadcast copy_head_cols.
void sum_head_cols(const Tensor& src, int64_t n_heads, int64_t src_col, Tensor& dst, int64_t ncols);

// dst[c] = src[0, c] + src[1, c] + ... + src[R-1, c], added in row order in
// f32. src: f32 [R, C] (R >= 1), dst: f32 [C] (may not overlap src). The
// reduction of R ranks' pieces of a data-parallel gradient bucket.
void sum_rows(const Tensor& src, Tensor& dst);

}  // namespace kestrel::ops
