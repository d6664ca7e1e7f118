// ops/vocab_loss.h: argument checks and device dispatch.
#include "ops/vocab_loss.h"

#include "backend/cpu/vocab_loss.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/loss_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {

constexpr Kernels<decltype(cpu::vocab_row_max)> kRowMax{.cpu = cpu::vocab_row_max KS_CUDA_KERNEL(cuda::vocab_row_max)};
constexpr Kernels<decltype(cpu::vocab_row_sums)> kRowSums{.cpu = cpu::vocab_row_sums KS_CUDA_KERNEL(cuda::vocab_row_sums)};
constexpr Kernels<decltype(cpu::vocab_softmax_finish)> kSoftmaxFinish{.cpu = cpu::vocab_softmax_finish KS_CUDA_KERNEL(cuda::vocab_softmax_finish)};
constexpr Kernels<decltype(cpu::vocab_logprob_entropy_grad)> kGrad{.cpu = cpu::vocab_logprob_entropy_grad KS_CUDA_KERNEL(cuda::vocab_logprob_entropy_grad)};

// logits [T, Vs] f32/bf16 with 0 <= n_real <= Vs; returns T.
int64_t check_logits(const char* op, const Tensor& logits, int64_t n_real) {
  check_float(op, "logits", logits);
  check_shape(op, "logits", logits, {-1, -1});
  if (n_real < 0 || n_real > logits.size(1))
    KS_FAIL("ops::", op, ": n_real ", n_real, " real columns out of range for logits ", logits.describe());
  return logits.size(0);
}

void check_f32_vec(const char* op, const char* name, const Tensor& t, int64_t n) {
  check_dtype(op, name, t, DType::F32);
  check_shape(op, name, t, {n});
}

void check_targets(const char* op, const Tensor& targets, int64_t T) {
  check_dtype(op, "targets", targets, DType::I32);
  check_shape(op, "targets", targets, {T});
}

}  // namespace

void vocab_row_max(const Tensor& logits, int64_t n_real, Tensor& row_max) {
  const char* op = "vocab_row_max";
  const int64_t T = check_logits(op, logits, n_real);
  check_f32_vec(op, "row_max", row_max, T);
  dispatch(op, kRowMax, {&logits, &row_max}, logits, n_real, row_max);
}

void vocab_row_sums(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                    const Tensor& row_max, Tensor& sums) {
  const char* op = "vocab_row_sums";
  const int64_t T = check_logits(op, logits, n_real);
  check_targets(op, targets, T);
  check_f32_vec(op, "row_max", row_max, T);
  check_dtype(op, "sums", sums, DType::F32);
  check_shape(op, "sums", sums, {3, T});
  dispatch(op, kRowSums, {&logits, &targets, &row_max, &sums}, logits, targets, vocab_start, n_real, row_max, sums);
}

void vocab_softmax_finish(const Tensor& sums, const Tensor& targets, Tensor& lse, Tensor* logprob, Tensor* entropy) {
  const char* op = "vocab_softmax_finish";
  check_dtype(op, "lse", lse, DType::F32);
  check_shape(op, "lse", lse, {-1});
  const int64_t T = lse.size(0);
  check_dtype(op, "sums", sums, DType::F32);
  check_shape(op, "sums", sums, {3, T});
  check_targets(op, targets, T);
  if (logprob) check_f32_vec(op, "logprob", *logprob, T);
  if (entropy) check_f32_vec(op, "entropy", *entropy, T);
  dispatch(op, kSoftmaxFinish, {&sums, &targets, &lse, logprob, entropy}, sums, targets, lse, logprob, entropy);
}

void vocab_logprob_entropy_grad(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t n_real,
                                const Tensor& lse, const Tensor& dlogprob, const Tensor* dentropy,
                                const Tensor* entropy, Tensor& dlogits) {
  const char* op = "vocab_logprob_entropy_grad";
  const int64_t T = check_logits(op, logits, n_real);
  check_targets(op, targets, T);
  check_f32_vec(op, "lse", lse, T);
  check_f32_vec(op, "dlogprob", dlogprob, T);
  if (!dentropy != !entropy)
    KS_FAIL("ops::", op, ": dentropy and entropy (the forward's H) are given together or not at all");
  if (dentropy) {
    check_f32_vec(op, "dentropy", *dentropy, T);
    check_f32_vec(op, "entropy", *entropy, T);
  }
  check_dtype(op, "dlogits", dlogits, DType::F32);
  check_shape(op, "dlogits", dlogits, {T, logits.size(1)});
  check_no_partial_alias(op, "dlogits", dlogits, "logits", logits);
  dispatch(op, kGrad, {&logits, &targets, &lse, &dlogprob, dentropy, entropy, &dlogits}, logits, targets,
           vocab_start, n_real, lse, dlogprob, dentropy, entropy, dlogits);
}

}  // namespace kestrel::ops
