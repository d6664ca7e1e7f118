// Host side of the CUDA optimizer kernels (kernels_optim.cu).
#include "backend/cuda/optim_ops.h"

#include <vector>

#include "backend/cuda/cuda_util.h"

namespace kestrel::cuda {

namespace {
launch::AdamWArgs args_of(const AdamWScalars& s) {
  return {s.decay, s.decay_keep, s.one_m_beta1, s.beta2, s.one_m_beta2, s.neg_step, s.bc2_sqrt, s.eps};
}
uint16_t* u16(const Tensor& t) { return static_cast<uint16_t*>(t.raw()); }
float* f32(const Tensor& t) { return static_cast<float*>(t.raw()); }
}  // namespace

void adamw_step_reuse_fp32(const AdamWScalars& s, Tensor& copy, Tensor& residual, Tensor& exp_avg, Tensor& exp_avg_sq,
                           const Tensor& grad) {
  launch::adamw_reuse_fp32(args_of(s), u16(copy), u16(residual), f32(exp_avg), f32(exp_avg_sq), f32(grad),
                           copy.numel(), stream());
  check_launch("adamw_step_reuse_fp32");
}

void reuse_fp32_split(const Tensor& master, Tensor& copy, Tensor& residual, Tensor& v) {
  launch::reuse_fp32_split(f32(master), u16(copy), u16(residual), f32(v), master.numel(), stream());
  check_launch("reuse_fp32_split");
}

void reuse_fp32_recover(const Tensor& copy, const Tensor& residual, const Tensor& v, Tensor& master, Tensor* v_clean) {
  launch::reuse_fp32_recover(u16(copy), u16(residual), f32(v), f32(master), v_clean ? f32(*v_clean) : nullptr,
                             copy.numel(), stream());
  check_launch("reuse_fp32_recover");
}

void adamw_step(const AdamWScalars& s, Tensor& master, Tensor& exp_avg, Tensor& exp_avg_sq, const Tensor& grad,
                Tensor* model_copy) {
  const launch::AdamWArgs a{s.decay, s.decay_keep, s.one_m_beta1, s.beta2, s.one_m_beta2, s.neg_step, s.bc2_sqrt, s.eps};
  int kind = 0;
  if (model_copy) kind = model_copy->dtype() == DType::BF16 ? 1 : model_copy->dtype() == DType::F16 ? 2 : 3;
  launch::adamw(a, static_cast<float*>(master.raw()), static_cast<float*>(exp_avg.raw()),
                static_cast<float*>(exp_avg_sq.raw()), static_cast<const float*>(grad.raw()), master.numel(),
                model_copy ? model_copy->raw() : nullptr, kind, stream());
  check_launch("adamw_step");
}

double sum_squares(const Tensor& x) {
  constexpr int64_t kChunk = 4096;  // the CPU kernel's chunk: the same order of additions
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 0) return 0.0;
  Tensor part = Tensor::empty({chunks * 2}, DType::F32, MemCategory::Other, Device::CUDA);  // chunks doubles
  launch::chunk_squares(static_cast<const float*>(x.raw()), n, kChunk, static_cast<double*>(part.raw()), stream());
  check_launch("sum_squares");
  std::vector<double> host(static_cast<size_t>(chunks));
  KS_CUDA_CHECK(cudaMemcpyAsync(host.data(), part.raw(), size_t(chunks) * sizeof(double), cudaMemcpyDeviceToHost,
                                stream()));
  KS_CUDA_CHECK(cudaStreamSynchronize(stream()));
  double s = 0;
  for (double p : host) s += p;
  return s;
}

void scale_(Tensor& x, float c) {
  launch::scale(static_cast<float*>(x.raw()), x.numel(), c, stream());
  check_launch("scale_");
}

}  // namespace kestrel::cuda
