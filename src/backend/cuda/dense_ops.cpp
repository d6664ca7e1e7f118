// Host side of the CUDA dense ops: kernel launches (kernels.cu) and cuBLAS GEMMs.
#include "backend/cuda/dense_ops.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_util.h"

namespace kestrel::cuda {
namespace {

using launch::FloatKind;

cudaDataType_t cuda_type(FloatKind k) { return k == FloatKind::F32 ? CUDA_R_32F : CUDA_R_16BF; }

// An f32 copy of device tensor t (a bf16 operand of a GEMM whose other operand is f32).
Tensor widened(const Tensor& t) {
  Tensor w = Tensor::empty(t.shape(), DType::F32, MemCategory::Activations, Device::CUDA);
  w.copy_from(t);
  return w;
}

// KESTREL_CUDA_EXACT_F32_GEMM=1: GEMMs of a bf16 operand against an f32 one
// widen the bf16 side and run in f32 (47 TFLOP/s on an H200) instead of the
// three bf16 GEMMs below (tensor cores, about 600 TFLOP/s each).
bool exact_f32_mixed_gemm() {
  static const bool exact = [] {
    const char* e = std::getenv("KESTREL_CUDA_EXACT_F32_GEMM");
    return e && std::string(e) == "1";
  }();
  return exact;
}

// The split's three bf16 copies take 1.5x the f32 operand's bytes while the
// GEMMs run. Above this many elements (768 MiB of copies) a GEMM widens the
// bf16 side instead, and linear_bwd splits its dy in blocks of rows: bf16
// training's [T, vocab] f32 logit gradient (10 GB at 16,384 tokens of a 152k
// vocabulary) would otherwise add 15 GB to the peak. KESTREL_CUDA_SPLIT_MAX
// lowers it (the tests, to reach the blocked path with small tensors).
int64_t max_split_elements() {
  static const int64_t n = [] {
    const char* e = std::getenv("KESTREL_CUDA_SPLIT_MAX");
    const int64_t v = e ? std::atoll(e) : 0;
    return v > 0 ? std::min<int64_t>(v, int64_t(1) << 27) : int64_t(1) << 27;
  }();
  return n;
}

void gemm_ex(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const Tensor& A,
             FloatKind ka, int64_t lda, const Tensor& B, FloatKind kb, int64_t ldb, float beta, Tensor& C,
             int64_t ldc, const char* op) {
  const float alpha = 1.f;
  KS_CUBLAS_CHECK(cublasGemmEx(cublas(), ta, tb, int(m), int(n), int(k), &alpha, dptr(A), cuda_type(ka), int(lda),
                               dptr(B), cuda_type(kb), int(ldb), &beta, dptr(C), cuda_type(float_kind(C, op)),
                               int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The exact split of an f32 operand into three bf16 tensors, hi + mid + lo
// (split_bf16), made once per operand: linear_bwd's dy feeds both its GEMMs.
struct Bf16Split {
  Tensor parts[3];
};

Bf16Split split_exact(const Tensor& f32, const char* op) {
  Bf16Split s;
  for (Tensor& p : s.parts) p = Tensor::empty(f32.shape(), DType::BF16, MemCategory::Activations, Device::CUDA);
  launch::split_bf16(static_cast<const float*>(dptr(f32)), dptr(s.parts[0]), dptr(s.parts[1]), dptr(s.parts[2]),
                     f32.numel(), stream());
  check_launch(op);
  return s;
}

// Whether a GEMM of a bf16 operand against the f32 operand f32_side runs as the split's three bf16 GEMMs.
bool splits(const Tensor& f32_side) { return !exact_f32_mixed_gemm() && f32_side.numel() <= max_split_elements(); }

// Column-major C[m, n] = alpha * op(A) op(B) + beta * C, every operand a
// device float tensor of any kind. cuBLAS takes A and B of one type and C of
// that type or f32. A bf16 operand against an f32 one (bf16 training's
// weights and activations against its f32 activation gradients) runs as three
// bf16 GEMMs into an f32 C: the f32 side split exactly as hi + mid + lo
// (`split`, or made here), the bf16 side as it is, every product of two bf16
// values exact in the f32 accumulation, so the result is the f32 GEMM's up to
// summation order (two parts, 16 significand bits, were off by 2.5e-5 of the
// terms' size in the consistency harness). Other mixes, an f32 operand larger
// than max_split_elements(), and every mix under KESTREL_CUDA_EXACT_F32_GEMM=1 go
// through f32 copies. A bf16 C of an f32 computation (the split's sum, or
// f32 inputs) is computed in an f32 temporary and rounded once.
void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const Tensor& A, int64_t lda,
          const Tensor& B, int64_t ldb, float beta, Tensor& C, int64_t ldc, const char* op,
          const Bf16Split* split = nullptr) {
  if (m == 0 || n == 0) return;
  FloatKind ka = float_kind(A, op), kb = float_kind(B, op);
  const bool a_f32 = ka == FloatKind::F32;
  const bool use_split = ka != kb && splits(a_f32 ? A : B);
  Bf16Split own;
  Tensor a32, b32;
  const Tensor* pa = &A;
  const Tensor* pb = &B;
  if (use_split) {
    if (!split) own = split_exact(a_f32 ? A : B, op), split = &own;
  } else if (ka != kb) {  // widen the bf16 side
    if (ka == FloatKind::BF16) a32 = widened(A), pa = &a32, ka = FloatKind::F32;
    else b32 = widened(B), pb = &b32, kb = FloatKind::F32;
  }
  Tensor c32;
  Tensor* pc = &C;
  if (float_kind(C, op) == FloatKind::BF16 && (use_split || ka == FloatKind::F32)) {
    c32 = Tensor::empty(C.shape(), DType::F32, MemCategory::Activations, Device::CUDA);
    if (beta != 0.f) c32.copy_from(C);
    pc = &c32;
  }
  if (use_split) {
    for (int p = 0; p < 3; ++p)
      gemm_ex(ta, tb, m, n, k, a_f32 ? split->parts[p] : A, FloatKind::BF16, lda, a_f32 ? B : split->parts[p],
              FloatKind::BF16, ldb, p == 0 ? beta : 1.f, *pc, ldc, op);
  } else {
    gemm_ex(ta, tb, m, n, k, *pa, ka, lda, *pb, kb, ldb, beta, *pc, ldc, op);
  }
  if (pc != &C) C.copy_from(*pc);
}

}  // namespace

// Row-major y[T, out] = x[T, in] w[out, in]^T is column-major y^T = w^T' x^T:
// A = w (column-major [in, out], transposed), B = x (column-major [in, T]).
void linear_fwd(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  const int64_t T = x.size(0), in = x.size(1), out = w.size(0);
  const bool bias = b && b->defined();
  if (bias && y.dtype() == DType::BF16) {  // y rounded once: GEMM and bias in f32
    Tensor y32 = Tensor::empty(y.shape(), DType::F32, MemCategory::Activations, Device::CUDA);
    linear_fwd(x, w, b, y32);
    y.copy_from(y32);
    return;
  }
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, w, in, x, in, 0.f, y, out, "linear_fwd");
  if (bias) {
    launch::add_bias(dptr(y), float_kind(y, "linear_fwd"), dptr(*b), float_kind(*b, "linear_fwd"), T, out, stream());
    check_launch("linear_fwd bias");
  }
}

namespace {

// linear_bwd's two GEMMs (its bias gradient aside). An f32 dy against bf16
// weights and activations is split once for both; one too large to split
// whole (bf16 training's [T, vocab] logit gradient, 2.5e9 elements at 16,384
// tokens) goes in blocks of rows, each split and multiplied on the tensor
// cores, dw summing over the blocks in order.
// dx[T, in] = dy w: column-major dx^T = w^T dy^T (A = w as [in, out], B = dy as [out, T]).
// dw[out, in] += dy^T x: column-major dw^T = x^T dy (A = x as [in, T], B = dy as [out, T] transposed).
void linear_bwd_gemms(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, bool accumulate_dx) {
  const int64_t T = dy.size(0), out = dy.size(1), in = w.size(1);
  const bool bf16_other = (dx && float_kind(w, "linear_bwd") == FloatKind::BF16) ||
                          (dw && float_kind(x, "linear_bwd") == FloatKind::BF16);
  const bool split_dy = float_kind(dy, "linear_bwd") == FloatKind::F32 && bf16_other && !exact_f32_mixed_gemm();
  if (split_dy && dy.numel() > max_split_elements() && out <= max_split_elements()) {
    const int64_t rows = std::max<int64_t>(1, max_split_elements() / out);
    for (int64_t r0 = 0; r0 < T; r0 += rows) {
      const int64_t r1 = std::min(T, r0 + rows);
      Tensor dx_rows = dx ? dx->slice_rows(r0, r1) : Tensor();
      linear_bwd_gemms(dw ? x.slice_rows(r0, r1) : x, w, dy.slice_rows(r0, r1), dx ? &dx_rows : nullptr, dw,
                       accumulate_dx);
    }
    return;
  }
  Bf16Split dy_split;
  const Bf16Split* pre = nullptr;
  if (split_dy && T > 0 && dx && dw && splits(dy)) dy_split = split_exact(dy, "linear_bwd"), pre = &dy_split;
  if (dx) gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, w, in, dy, out, accumulate_dx ? 1.f : 0.f, *dx, in, "linear_bwd", pre);
  if (dw) gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, T, x, in, dy, out, 1.f, *dw, in, "linear_bwd", pre);
}

}  // namespace

void linear_bwd(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor* dw, Tensor* db,
                bool accumulate_dx) {
  linear_bwd_gemms(x, w, dy, dx, dw, accumulate_dx);
  if (db && db->defined()) {
    launch::bias_grad(dptr(dy), float_kind(dy, "linear_bwd"), dy.size(0), dy.size(1), static_cast<float*>(dptr(*db)),
                      stream());
    check_launch("linear_bwd bias");
  }
}

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  launch::add(dptr(a), float_kind(a, "add"), dptr(b), float_kind(b, "add"), dptr(y), float_kind(y, "add"), y.numel(),
              stream());
  check_launch("add");
}

void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start) {
  launch::embedding_fwd(static_cast<const int32_t*>(dptr(ids)), ids.numel(), dptr(table),
                        float_kind(table, "embedding_fwd"), table.size(0), table.size(1), vocab_start, dptr(y),
                        float_kind(y, "embedding_fwd"), stream());
  check_launch("embedding_fwd");
}

void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start) {
  launch::embedding_bwd(static_cast<const int32_t*>(dptr(ids)), ids.numel(), dptr(dy), float_kind(dy, "embedding_bwd"),
                        dtable.size(0), dtable.size(1), vocab_start, static_cast<float*>(dptr(dtable)), stream());
  check_launch("embedding_bwd");
}

void rmsnorm_fwd(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  launch::rmsnorm_fwd(dptr(x), float_kind(x, "rmsnorm_fwd"), dptr(w), float_kind(w, "rmsnorm_fwd"), eps, dptr(y),
                      static_cast<float*>(dptr(rstd)), x.size(0), x.size(1), stream());
  check_launch("rmsnorm_fwd");
}

void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw) {
  launch::rmsnorm_bwd(dptr(x), float_kind(x, "rmsnorm_bwd"), dptr(w), float_kind(w, "rmsnorm_bwd"),
                      static_cast<const float*>(dptr(rstd)), dptr(dy), float_kind(dy, "rmsnorm_bwd"), dptr(dx),
                      static_cast<float*>(dptr(dw)), x.size(0), x.size(1), stream());
  check_launch("rmsnorm_bwd");
}

void swiglu_fwd(const Tensor& gate, const Tensor& up, Tensor& h) {
  launch::swiglu_fwd(dptr(gate), dptr(up), dptr(h), float_kind(gate, "swiglu_fwd"), h.numel(), stream());
  check_launch("swiglu_fwd");
}

void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dh, Tensor& dgate, Tensor& dup) {
  launch::swiglu_bwd(dptr(gate), dptr(up), float_kind(gate, "swiglu_bwd"), dptr(dh), dptr(dgate), dptr(dup),
                     float_kind(dgate, "swiglu_bwd"), gate.numel(), stream());
  check_launch("swiglu_bwd");
}

}  // namespace kestrel::cuda
