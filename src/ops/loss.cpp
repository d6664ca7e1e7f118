// ops::logprob_entropy / cross_entropy: argument checks and device dispatch.
#include "ops/loss.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/dense_ops.h"
#if KESTREL_HAVE_CUDA
#include "backend/cuda/loss_ops.h"
#endif
#include "ops/op_checks.h"

namespace kestrel::ops {

using namespace detail;

namespace {

// logits [T, V] (f32/bf16), targets i32 [T] each < V; returns T.
int64_t check_logits_targets(const char* op, const Tensor& logits, const Tensor& targets) {
  check_float(op, "logits", logits);
  check_shape(op, "logits", logits, {-1, -1});
  const int64_t T = logits.size(0), V = logits.size(1);
  if (V < 1) KS_FAIL("ops::", op, ": logits need at least one vocabulary column, got ", logits.describe());
  check_dtype(op, "targets", targets, DType::I32);
  check_shape(op, "targets", targets, {T});
  {
    // Device targets are read back (a small copy): a target >= V would make the kernel read past its row.
    const std::vector<int32_t> host = targets.device() == Device::CPU ? std::vector<int32_t>() : targets.to_host<int32_t>();
    const int32_t* tp = targets.device() == Device::CPU ? static_cast<const int32_t*>(targets.raw()) : host.data();
    for (int64_t t = 0; t < T; ++t)
      if (tp[t] >= V)
        KS_FAIL("ops::", op, ": targets[", t, "] = ", tp[t], " is outside the vocabulary [0, ", V,
                "); a negative target (e.g. -100) marks a position to ignore");
  }
  return T;
}

void check_row_f32(const char* op, const char* name, const Tensor& t, int64_t T) {
  check_dtype(op, name, t, DType::F32);
  check_shape(op, name, t, {T});
}

void check_dlogits(const char* op, const Tensor& logits, const Tensor& dlogits) {
  check_float(op, "dlogits", dlogits);
  check_shape(op, "dlogits", dlogits, {logits.size(0), logits.size(1)});
  check_no_partial_alias(op, "dlogits", dlogits, "logits", logits);
}

}  // namespace

// The CPU paths of the ops that compose CPU kernels with host-side work.
namespace {

void cpu_logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogprob,
                             const Tensor* dentropy, Tensor& dlogits) {
  cpu::logprob_entropy_bwd(logits, targets, lse, static_cast<const float*>(dlogprob.raw()),
                           dentropy ? static_cast<const float*>(dentropy->raw()) : nullptr, dlogits);
}

double cpu_cross_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& lse) {
  const int64_t T = logits.size(0);
  Tensor logprob = Tensor::empty({T}, DType::F32, MemCategory::Activations);
  cpu::logprob_entropy_fwd(logits, targets, logprob, nullptr, lse);
  const int32_t* tp = static_cast<const int32_t*>(targets.raw());
  const float* lp = static_cast<const float*>(logprob.raw());
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (tp[t] < 0) continue;
    sum -= double(lp[t]);
    ++count;
  }
  return sum / double(std::max<int64_t>(1, count));
}

void cpu_cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                           Tensor& dlogits) {
  const int64_t T = logits.size(0);
  const int32_t* tp = static_cast<const int32_t*>(targets.raw());
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) count += tp[t] >= 0;
  // loss = -sum logprob / count, so d loss / d logprob[t] = -1 / count on counted rows.
  const float c = float(-dloss / double(std::max<int64_t>(1, count)));
  std::vector<float> coef(size_t(T), c);
  cpu::logprob_entropy_bwd(logits, targets, lse, coef.data(), nullptr, dlogits);
}

#if KESTREL_HAVE_CUDA
// The CUDA paths: the coefficients are device arrays; the mean of cross_entropy is summed on the host
// in double in token order, as the CPU path does (it returns a host value either way).
void cuda_logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogprob,
                              const Tensor* dentropy, Tensor& dlogits) {
  cuda::logprob_entropy_bwd(logits, targets, lse, static_cast<const float*>(dlogprob.raw()),
                            dentropy ? static_cast<const float*>(dentropy->raw()) : nullptr, dlogits);
}
double cuda_cross_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& lse) {
  const int64_t T = logits.size(0);
  Tensor logprob = Tensor::empty({T}, DType::F32, MemCategory::Activations, Device::CUDA);
  cuda::logprob_entropy_fwd(logits, targets, logprob, nullptr, lse);
  const std::vector<int32_t> tp = targets.to_host<int32_t>();
  const std::vector<float> lp = logprob.to_host<float>();
  double sum = 0;
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (tp[size_t(t)] < 0) continue;
    sum -= double(lp[size_t(t)]);
    ++count;
  }
  return sum / double(std::max<int64_t>(1, count));
}
void cuda_cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss,
                            Tensor& dlogits) {
  const int64_t T = logits.size(0);
  int64_t count = 0;
  for (int32_t t : targets.to_host<int32_t>()) count += t >= 0;
  Tensor coef = Tensor::empty({T}, DType::F32, MemCategory::Activations, Device::CUDA);
  coef.fill_(float(-dloss / double(std::max<int64_t>(1, count))));
  cuda::logprob_entropy_bwd(logits, targets, lse, static_cast<const float*>(coef.raw()), nullptr, dlogits);
}
#endif

constexpr Kernels<decltype(cpu::logprob_entropy_fwd)> kLogprobEntropyFwd{
    .cpu = cpu::logprob_entropy_fwd KS_CUDA_KERNEL(cuda::logprob_entropy_fwd)};
constexpr Kernels<decltype(cpu_logprob_entropy_bwd)> kLogprobEntropyBwd{
    .cpu = cpu_logprob_entropy_bwd KS_CUDA_KERNEL(cuda_logprob_entropy_bwd)};
constexpr Kernels<decltype(cpu_cross_entropy_fwd)> kCrossEntropyFwd{
    .cpu = cpu_cross_entropy_fwd KS_CUDA_KERNEL(cuda_cross_entropy_fwd)};
constexpr Kernels<decltype(cpu_cross_entropy_bwd)> kCrossEntropyBwd{
    .cpu = cpu_cross_entropy_bwd KS_CUDA_KERNEL(cuda_cross_entropy_bwd)};

}  // namespace

void logprob_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& logprob, Tensor* entropy, Tensor& lse) {
  const char* op = "logprob_entropy_fwd";
  const int64_t T = check_logits_targets(op, logits, targets);
  check_row_f32(op, "logprob", logprob, T);
  if (entropy) check_row_f32(op, "entropy", *entropy, T);
  check_row_f32(op, "lse", lse, T);
  dispatch(op, kLogprobEntropyFwd, {&logits, &targets, &logprob, entropy, &lse}, logits, targets, logprob, entropy,
           lse);
}

void logprob_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dlogprob,
                         const Tensor* dentropy, Tensor& dlogits) {
  const char* op = "logprob_entropy_bwd";
  const int64_t T = check_logits_targets(op, logits, targets);
  check_row_f32(op, "lse", lse, T);
  check_row_f32(op, "dlogprob", dlogprob, T);
  if (dentropy) check_row_f32(op, "dentropy", *dentropy, T);
  check_dlogits(op, logits, dlogits);
  dispatch(op, kLogprobEntropyBwd, {&logits, &targets, &lse, &dlogprob, dentropy, &dlogits}, logits, targets, lse,
           dlogprob, dentropy, dlogits);
}

double cross_entropy_fwd(const Tensor& logits, const Tensor& targets, Tensor& lse) {
  const char* op = "cross_entropy_fwd";
  const int64_t T = check_logits_targets(op, logits, targets);
  check_row_f32(op, "lse", lse, T);
  return dispatch(op, kCrossEntropyFwd, {&logits, &targets, &lse}, logits, targets, lse);
}

void cross_entropy_bwd(const Tensor& logits, const Tensor& targets, const Tensor& lse, double dloss, Tensor& dlogits) {
  const char* op = "cross_entropy_bwd";
  const int64_t T = check_logits_targets(op, logits, targets);
  check_row_f32(op, "lse", lse, T);
  check_dlogits(op, logits, dlogits);
  dispatch(op, kCrossEntropyBwd, {&logits, &targets, &lse, &dlogits}, logits, targets, lse, dloss, dlogits);
}

}  // namespace kestrel::ops
