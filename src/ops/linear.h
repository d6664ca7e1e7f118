#pragma once
#include "core/tensor.h"

namespace kestrel::ops {

// y[T, out] = x[T, in] @ w[out, in]^T (+ b[out]). HF's nn.Linear layout.
// x, w, b, y may each be f32 or bf16 (bf16 operands are widened to f32 for the
// f32 GEMM; y is rounded once). y is written and must not alias x.
void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
// dx[T, in] = dy @ w        (written; skipped when dx == nullptr)
// dw[out, in] += dy^T @ x   (f32; skipped when nullptr)
// db[out] += sum_t dy       (f32; skipped when nullptr)
// x is only read for dw (it may be an undefined Tensor when dw == nullptr).
// accumulate_dx: dx += dy @ w instead (dx must be f32): the input gradient of
// several projections of one input (q, k, v; gate, up) summed in place.
void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx = false);

// y = a + b elementwise (residual stream); same shapes, any mix of f32/bf16; y may alias a or b.
void add(const Tensor& a, const Tensor& b, Tensor& y);
// y += x elementwise.
void add_inplace(Tensor& y, const Tensor& x);

}  // namespace kestrel::ops
