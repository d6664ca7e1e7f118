// ops::embedding: argument checks and device dispatch.
#include "ops/embedding.h"

#include "backend/cpu/dense_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {
constexpr Kernels<decltype(cpu::embedding_fwd)> kEmbeddingFwd{.cpu = cpu::embedding_fwd KS_CUDA_KERNEL(cuda::embedding_fwd)};
constexpr Kernels<decltype(cpu::embedding_bwd)> kEmbeddingBwd{.cpu = cpu::embedding_bwd KS_CUDA_KERNEL(cuda::embedding_bwd)};
}  // namespace

void embedding_fwd(const Tensor& ids, const Tensor& table, Tensor& y, int64_t vocab_start) {
  const char* op = "embedding_fwd";
  check_dtype(op, "ids", ids, DType::I32);
  check_shape(op, "ids", ids, {-1});
  check_float(op, "table", table);
  check_shape(op, "table", table, {-1, -1});
  check_float(op, "y", y);
  check_shape(op, "y", y, {ids.size(0), table.size(1)});
  if (vocab_start < 0) KS_FAIL("ops::", op, ": vocab_start must be >= 0, got ", vocab_start);
  dispatch(op, kEmbeddingFwd, {&ids, &table, &y}, ids, table, y, vocab_start);
}

void embedding_bwd(const Tensor& ids, const Tensor& dy, Tensor& dtable, int64_t vocab_start) {
  const char* op = "embedding_bwd";
  check_dtype(op, "ids", ids, DType::I32);
  check_shape(op, "ids", ids, {-1});
  check_dtype(op, "dtable", dtable, DType::F32);
  check_shape(op, "dtable", dtable, {-1, -1});
  check_float(op, "dy", dy);
  check_shape(op, "dy", dy, {ids.size(0), dtable.size(1)});
  if (vocab_start < 0) KS_FAIL("ops::", op, ": vocab_start must be >= 0, got ", vocab_start);
  dispatch(op, kEmbeddingBwd, {&ids, &dy, &dtable}, ids, dy, dtable, vocab_start);
}

}  // namespace kestrel::ops
