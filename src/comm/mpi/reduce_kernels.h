// Element-wise reduction kernels the MPI backend needs but MPI lacks: bf16
// and f16 have no MPI datatype, so their sum/max/min run here (in float,
// rounded back to nearest-even after every pairwise step, as NCCL does), and
// ReduceOp::Avg is a Sum followed by a division by the group size.
// No MPI header: these are plain functions, unit-tested on one process.
#pragma once
#include <cstdint>

#include "comm/process_group.h"
#include "core/dtype.h"

namespace kestrel::comm {

// inout[i] = op(in[i], inout[i]) for 2-byte floats (dt is BF16 or F16, op is Sum, Max or Min).
// Max/Min propagate NaN like torch.maximum. Both operands are read before the
// result is written, so in == inout is allowed.
void reduce_half_into(const uint16_t* in, uint16_t* inout, int64_t n, DType dt, ReduceOp op);

// buf[i] /= divisor in buf's own type: floats divide in float (f32) or float
// then round (bf16/f16); integers truncate toward zero, like NCCL's ncclAvg.
void divide_inplace(void* buf, int64_t n, DType dt, int divisor);

}  // namespace kestrel::comm
