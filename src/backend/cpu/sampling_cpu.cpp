#include "backend/cpu/sampling_cpu.h"

#include <limits>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_util.h"

#define KESTREL_ISA_BODY "backend/cpu/sampling_cpu_isa.inc"
#include "backend/cpu/isa_each.inc"

namespace kestrel::cpu {

int32_t sampling_argmax(const float* z, int64_t V) { return KESTREL_ISA_CALL(sampling_argmax, z, V); }

int64_t sampling_weights(const float* z, int64_t V, float mx, float inv_t, float min_w, float* w) {
  return KESTREL_ISA_CALL(sampling_weights, z, V, mx, inv_t, min_w, w);
}

}  // namespace kestrel::cpu
