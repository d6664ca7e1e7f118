// Kestrel's op set. Conventions shared by every op:
//  - Activations are packed token-major 2-D buffers [T, D]: sequences are
//    concatenated, described by cu_seqlens where it matters; no padding.
//  - Floating tensors may be f32 or bf16 (bf16 mode: bf16 storage, f32 math,
//    outputs rounded once). Parameter gradients are always f32.
//  - Backward writes activation gradients (=) and accumulates parameter
//    gradients (+=), so micro-batch accumulation is free.
//  - Each op has a scalar double-precision reference in ops/ref/ (the oracle)
//    and dispatches on device to backend/{cpu,cuda}.
#pragma once
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/copy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/loss.h"
#include "ops/norm.h"
#include "ops/optim_ops.h"
#include "ops/rope.h"
