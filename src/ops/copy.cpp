// ops/copy.h: argument checks and device dispatch.
#include "ops/copy.h"

#include "backend/cpu/copy_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/copy_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {

constexpr Kernels<decltype(cpu::fill)> kFill{.cpu = cpu::fill KS_CUDA_KERNEL(cuda::fill)};
constexpr Kernels<decltype(cpu::zero)> kZero{.cpu = cpu::zero KS_CUDA_KERNEL(cuda::zero)};
constexpr Kernels<decltype(cpu::gather_rows)> kGatherRows{.cpu = cpu::gather_rows KS_CUDA_KERNEL(cuda::gather_rows)};
constexpr Kernels<decltype(cpu::scatter_rows)> kScatterRows{.cpu = cpu::scatter_rows KS_CUDA_KERNEL(cuda::scatter_rows)};
constexpr Kernels<decltype(cpu::pad_rows)> kPadRows{.cpu = cpu::pad_rows KS_CUDA_KERNEL(cuda::pad_rows)};
constexpr Kernels<decltype(cpu::copy_cols)> kCopyCols{.cpu = cpu::copy_cols KS_CUDA_KERNEL(cuda::copy_cols)};
constexpr Kernels<decltype(cpu::sum_rows)> kSumRows{.cpu = cpu::sum_rows KS_CUDA_KERNEL(cuda::sum_rows)};
constexpr Kernels<decltype(cpu::copy_head_cols)> kCopyHeadCols{.cpu = cpu::copy_head_cols KS_CUDA_KERNEL(cuda::copy_head_cols)};
constexpr Kernels<decltype(cpu::sum_head_cols)> kSumHeadCols{.cpu = cpu::sum_head_cols KS_CUDA_KERNEL(cuda::sum_head_cols)};

// a and b have the same dtype and the same shape past dim 0 (a row shape).
void check_rows_like(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  check_defined(op, a_name, a);
  check_defined(op, b_name, b);
  check_same_dtype(op, a_name, a, b_name, b);
  bool ok = a.dim() >= 1 && a.dim() == b.dim();
  for (int64_t d = 1; ok && d < a.dim(); ++d) ok = a.size(d) == b.size(d);
  if (!ok)
    KS_FAIL("ops::", op, ": ", a_name, " and ", b_name, " must have the same row shape (all dims after the first), got ",
            a.describe(), " and ", b.describe());
}

void check_no_overlap(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  const char* a0 = static_cast<const char*>(a.raw());
  const char* b0 = static_cast<const char*>(b.raw());
  if (a.nbytes() && b.nbytes() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes())
    KS_FAIL("ops::", op, ": ", a_name, " and ", b_name, " overlap");
}

// t is [R, heads*W]: returns W, or fails naming the head count.
int64_t head_width(const char* op, const char* name, const Tensor& t, const char* heads_name, int64_t heads) {
  if (heads <= 0 || t.size(1) % heads)
    KS_FAIL("ops::", op, ": ", name, " ", t.describe(), " does not split into ", heads_name, " = ", heads,
            " heads of equal width");
  return t.size(1) / heads;
}

}  // namespace

void fill(Tensor& x, float v) {
  check_defined("fill", "x", x);
  dispatch("fill", kFill, {&x}, x, v);
}

void zero(Tensor& x) {
  check_defined("zero", "x", x);
  dispatch("zero", kZero, {&x}, x);
}

void gather_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const char* op = "gather_rows";
  check_rows_like(op, "dst", dst, "src", src);
  check_dtype(op, "index", index, DType::I32);
  check_shape(op, "index", index, {dst.size(0)});
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kGatherRows, {&src, &index, &dst}, src, index, dst);
}

void scatter_rows(const Tensor& src, const Tensor& index, Tensor& dst) {
  const char* op = "scatter_rows";
  check_rows_like(op, "dst", dst, "src", src);
  check_dtype(op, "index", index, DType::I32);
  check_shape(op, "index", index, {src.size(0)});
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kScatterRows, {&src, &index, &dst}, src, index, dst);
}

void pad_rows(const Tensor& src, Tensor& dst, float fill) {
  const char* op = "pad_rows";
  check_rows_like(op, "dst", dst, "src", src);
  if (src.size(0) > dst.size(0))
    KS_FAIL("ops::", op, ": src ", src.describe(), " has more rows than dst ", dst.describe());
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kPadRows, {&src, &dst}, src, dst, fill);
}

void copy_cols(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t ncols) {
  const char* op = "copy_cols";
  check_shape(op, "src", src, {-1, -1});
  check_shape(op, "dst", dst, {src.size(0), -1});
  check_same_dtype(op, "dst", dst, "src", src);
  if (ncols < 0 || src_col < 0 || dst_col < 0 || src_col + ncols > src.size(1) || dst_col + ncols > dst.size(1))
    KS_FAIL("ops::", op, ": columns [", src_col, ", ", src_col + ncols, ") of ", src.describe(), " into [", dst_col,
            ", ", dst_col + ncols, ") of ", dst.describe(), " are out of range");
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kCopyCols, {&src, &dst}, src, src_col, dst, dst_col, ncols);
}

void sum_rows(const Tensor& src, Tensor& dst) {
  const char* op = "sum_rows";
  check_dtype(op, "src", src, DType::F32);
  check_shape(op, "src", src, {-1, -1});
  if (src.size(0) < 1) KS_FAIL("ops::", op, ": src needs at least one row, got ", src.describe());
  check_dtype(op, "dst", dst, DType::F32);
  check_shape(op, "dst", dst, {src.size(1)});
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kSumRows, {&src, &dst}, src, dst);
}

void copy_head_cols(const Tensor& src, int64_t src_heads, int64_t src_col, Tensor& dst, int64_t n_heads,
                    int64_t dst_col, int64_t ncols) {
  const char* op = "copy_head_cols";
  check_shape(op, "src", src, {-1, -1});
  check_shape(op, "dst", dst, {src.size(0), -1});
  check_same_dtype(op, "dst", dst, "src", src);
  if (src_heads != n_heads && src_heads != 1)
    KS_FAIL("ops::", op, ": src_heads = ", src_heads, " must be n_heads = ", n_heads,
            " (head to head) or 1 (one source head broadcast to every head)");
  const int64_t Ws = head_width(op, "src", src, "src_heads", src_heads);
  const int64_t Wd = head_width(op, "dst", dst, "n_heads", n_heads);
  if (ncols < 0 || src_col < 0 || dst_col < 0 || src_col + ncols > Ws || dst_col + ncols > Wd)
    KS_FAIL("ops::", op, ": columns [", src_col, ", ", src_col + ncols, ") of each ", Ws, "-wide head of src ",
            src.describe(), " into [", dst_col, ", ", dst_col + ncols, ") of each ", Wd, "-wide head of dst ",
            dst.describe(), " are out of range");
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kCopyHeadCols, {&src, &dst}, src, src_heads, src_col, dst, n_heads, dst_col, ncols);
}

void sum_head_cols(const Tensor& src, int64_t n_heads, int64_t src_col, Tensor& dst, int64_t ncols) {
  const char* op = "sum_head_cols";
  check_float(op, "src", src);
  check_shape(op, "src", src, {-1, -1});
  check_dtype(op, "dst", dst, DType::F32);
  check_shape(op, "dst", dst, {src.size(0), ncols});
  const int64_t Ws = head_width(op, "src", src, "n_heads", n_heads);
  if (ncols < 0 || src_col < 0 || src_col + ncols > Ws)
    KS_FAIL("ops::", op, ": columns [", src_col, ", ", src_col + ncols, ") of each ", Ws, "-wide head of src ",
            src.describe(), " are out of range");
  check_no_overlap(op, "dst", dst, "src", src);
  dispatch(op, kSumHeadCols, {&src, &dst}, src, n_heads, src_col, dst, ncols);
}

}  // namespace kestrel::ops
