#!/usr/bin/env bash
# The CUDA kernels on the CPU, by hand: builds the cuda-emu preset (the CUDA
# backend on this emulator, build/cuda-emu) and runs the backend-consistency
# tests on the emulated device (`make test` runs them, the runtime suite and
# tests/on_device there; scripts/run_tests.sh). The emulator:
# every src/backend/cuda/*.cu compiled as C++ against shim/ (a fiber per CUDA
# thread; warp-level shuffles and __syncwarp, block-level __syncthreads, each
# checked for divergence and deadlock; device memory is host memory poisoned
# with 0xFF and guarded; cudaMemcpy directions checked; cublasGemmEx a
# column-major GEMM that enforces cuBLAS's argument rules), the kernel launch
# macro KS_LAUNCH (backend/cuda/device_util.cuh) routed to it, the real
# host-side files and ops. It cannot see CUDA's math-library ulps, real warp
# scheduling or races between blocks. To check that a test catches a bug,
# break the kernel, rerun, and restore it.
#   bash tests/cuda_emu/run.sh ['<gtest filter>']
# Device memory is PROT_NONE to host code (the emulator opens it only for its
# launches, copies, memsets and GEMMs): a host dereference of a Device::CUDA
# tensor's pointer aborts with the allocation it hit and a backtrace, as it
# would segfault on a GPU; EMU_HOST_ACCESS=allow turns that off for debugging.
# EMU_REVERSE=1 runs each block's threads in reverse order;
# EMU_LAUNCH_REPORT=<file> writes the launch count of every kernel.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
cmake --preset cuda-emu >/dev/null
cmake --build build/cuda-emu -j "${JOBS:-2}" --target test_ops test_cuda_emu_selftest
build/cuda-emu/test_cuda_emu_selftest >/dev/null
build/cuda-emu/test_ops --gtest_filter="${1:-*BackendConsistency*}"
