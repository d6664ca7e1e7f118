#include "comm/mpi/reduce_kernels.h"

#include <cmath>

#include "core/status.h"

namespace kestrel::comm {

namespace {

template <class ToFloat, class FromFloat>
void reduce_loop(const uint16_t* in, uint16_t* inout, int64_t n, ReduceOp op, ToFloat to_f, FromFloat from_f) {
  switch (op) {
    case ReduceOp::Sum:
      for (int64_t i = 0; i < n; ++i) inout[i] = from_f(to_f(in[i]) + to_f(inout[i]));
      return;
    case ReduceOp::Max:
      for (int64_t i = 0; i < n; ++i) {
        const float a = to_f(in[i]), b = to_f(inout[i]);
        inout[i] = std::isnan(a) ? in[i] : (std::isnan(b) || b >= a) ? inout[i] : in[i];
      }
      return;
    case ReduceOp::Min:
      for (int64_t i = 0; i < n; ++i) {
        const float a = to_f(in[i]), b = to_f(inout[i]);
        inout[i] = std::isnan(a) ? in[i] : (std::isnan(b) || b <= a) ? inout[i] : in[i];
      }
      return;
    case ReduceOp::Avg:
      break;
  }
  KS_FAIL("reduce_half_into: Avg is Sum followed by divide_inplace, not a pairwise op");
}

template <class T>
void divide_int(void* buf, int64_t n, int d) {
  T* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = T(p[i] / T(d));
}

}  // namespace

void reduce_half_into(const uint16_t* in, uint16_t* inout, int64_t n, DType dt, ReduceOp op) {
  if (dt == DType::BF16)
    reduce_loop(in, inout, n, op, bf16_to_float, float_to_bf16);
  else if (dt == DType::F16)
    reduce_loop(in, inout, n, op, f16_to_float, float_to_f16);
  else
    KS_FAIL("reduce_half_into: dtype ", dtype_name(dt), " is not a 2-byte float");
}

void divide_inplace(void* buf, int64_t n, DType dt, int divisor) {
  KS_CHECK(divisor > 0, "divisor ", divisor);
  if (divisor == 1) return;
  switch (dt) {
    case DType::F32: {
      float* p = static_cast<float*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] /= float(divisor);
      return;
    }
    case DType::BF16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) / float(divisor));
      return;
    }
    case DType::F16: {
      uint16_t* p = static_cast<uint16_t*>(buf);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_f16(f16_to_float(p[i]) / float(divisor));
      return;
    }
    case DType::I32: return divide_int<int32_t>(buf, n, divisor);
    case DType::I64: return divide_int<int64_t>(buf, n, divisor);
    case DType::U8: return divide_int<uint8_t>(buf, n, divisor);
  }
}

}  // namespace kestrel::comm
