#!/usr/bin/env bash
# Runs every test of a build folder through CTest. OpenMPI refuses to run as
# root and to oversubscribe 2 cores unless told; the MPI tests need both.
#
# Then the suites that compare against goldens recorded elsewhere (model and
# optimizer goldens from PyTorch/transformers, the RL golden run) run once
# more with OPENBLAS_CORETYPE=Haswell: OpenBLAS then uses its AVX2 kernel
# family instead of the one it picked for this CPU (AVX-512 on Skylake-X and
# later, Zen 4), and with KESTREL_ISA=avx2 Kestrel's own kernels run their
# AVX2 variants, and with DNNL_MAX_CPU_ISA=AVX2 oneDNN (the rollout's packed
# weights, backend/cpu/packed_linear.h) its AVX2 kernels, so every submission
# checks the tolerances against a second set of roundings, an AVX2 machine's.
# The kernel and GEMM-library suites (ops, backend_cpu) run in that pass
# too. KESTREL_SECOND_BLAS=0 skips it. On a machine without AVX-512 the
# first pass already ran those kernels (Kestrel's auto level is avx2 there,
# oneDNN's widest is AVX2, and OpenBLAS's Zen and Haswell targets share their
# AVX2 GEMM kernels), so the pass is skipped there, saying so.
set -euo pipefail
BUILD=${1:-build/dev}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$(pwd)
cd "$BUILD"
ctest --output-on-failure -j 2 --timeout 900
if [[ "${KESTREL_SECOND_BLAS:-1}" != 0 ]] && ! grep -qw avx512f /proc/cpuinfo; then
  echo "== the AVX2 pass: skipped, this CPU has no AVX-512 (the suites above ran its AVX2 kernels) =="
elif [[ "${KESTREL_SECOND_BLAS:-1}" != 0 ]]; then
  # backend_cpu and ops too: the GEMM-library tests hold claims (thread counts,
  # choice) that a machine running OpenBLAS's AVX2 kernels must also meet.
  echo "== golden and kernel suites again with OPENBLAS_CORETYPE=Haswell KESTREL_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2 (an AVX2 machine's kernels) =="
  OPENBLAS_CORETYPE=Haswell KESTREL_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2 ctest --output-on-failure -j 2 --timeout 900 \
    -L '^(model|train|optim|rl|parallel|backend_cpu|ops)$'
fi
# The device suites on the CUDA emulator (cmake --preset cuda-emu,
# tests/cuda_emu): the CUDA kernels compiled as C++ and run on fibers, the
# rest of Kestrel built as for a GPU, so the runtime tests (tests/cuda), the
# model, training and rollout on the device (tests/on_device) and the
# backend-consistency harness run where no GPU is, and the NCCL transport's
# 2-rank tests over the fake NCCL (tests/nccl, label nccl). KESTREL_CUDA_EMU=0 skips it.
if [[ "${KESTREL_CUDA_EMU:-1}" != 0 ]]; then
  echo "== the device suites on the CUDA emulator (cmake --preset cuda-emu) =="
  cd "$ROOT"
  cmake --preset cuda-emu >/dev/null
  cmake --build build/cuda-emu -j 2 --target test_cuda_emu_selftest test_cuda test_ops test_on_device nccl_tests
  cd build/cuda-emu
  ctest --output-on-failure -j 2 --timeout 900 -L '^(cuda|on_device|nccl)$'
  ctest --output-on-failure -j 2 --timeout 900 -L '^ops$' -R 'BackendConsistency'
fi
# The CUDA build (cmake --preset cuda, sm_90a) compiles wherever the toolkit
# is (nvcc on PATH), and its op and runtime suites run: on a machine without a
# GPU the device tests skip, naming why, and the CPU kernels must still pass
# with the CUDA kernels in their tables. KESTREL_CUDA_BUILD=0 skips it.
if [[ "${KESTREL_CUDA_BUILD:-1}" != 0 ]]; then
  if command -v nvcc >/dev/null; then
    echo "== the CUDA build (cmake --preset cuda): compile, then its op and runtime suites =="
    cd "$ROOT"
    cmake --preset cuda >/dev/null
    cmake --build build/cuda -j 2 --target test_ops test_cuda
    cd build/cuda
    ctest --output-on-failure -j 2 --timeout 900 -L '^(ops|cuda)$'
  else
    echo "== the CUDA build: skipped, nvcc not found (the CUDA toolkit is not installed here) =="
  fi
fi
