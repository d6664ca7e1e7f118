#!/usr/bin/env bash
# Runs the CUDA backend's kernels on the CPU, in an emulator, against the
# backend-consistency tests (tests/ops/backend_consistency*_test.cpp): a check
# of the kernels' logic where no GPU is present. Every .cu file is rewritten to
# C++ (gen.py: launches become emu::launch; needs python3, no packages); each
# CUDA thread is a coroutine with warp-level shuffles and __syncwarp, block-
# level __syncthreads (emu_runtime.cpp, shim/); device memory is host memory
# poisoned with 0xFF and guarded; cuBLAS is a column-major GEMM honouring
# cuBLAS's argument rules; the real host-side files and ops run unchanged.
# It cannot see CUDA's own math-library ulps, real warp scheduling or races
# between blocks. Not part of `make test` (it needs python3); run it by hand
# after changing a kernel:
#   bash scripts/cuda_emu/run.sh                  # builds build/cuda_emu, runs every consistency test
#   MUT='kernels_block.cu|old|new' bash scripts/cuda_emu/run.sh '*RingBlock*'   # a mutation check
# Needs the dev build's CPU libraries (cmake --build build/dev first).
set -euo pipefail
S=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$S/../.." && pwd)
E=${EMU_BUILD:-$ROOT/build/cuda_emu}
export KESTREL_ROOT=$ROOT EMU_BUILD=$E
[[ -f $ROOT/build/dev/libkestrel_core.a ]] || { echo "cuda_emu: build the dev preset first (cmake --build build/dev)" >&2; exit 1; }
python3 "$S/gen.py" >/dev/null
make -s -f "$S/Makefile" -j "${JOBS:-2}" M="$ROOT" E="$E" "$E/emu_test"
# The emulator's own check of warp semantics and of the faults it must report.
g++ -std=c++20 -O1 -g -ffp-contract=off -I"$S/shim" -I"$ROOT/src" "$S/selftest.cpp" "$E/obj/emu_runtime.o" \
  "$ROOT/build/dev/libkestrel_core.a" -o "$E/selftest"
"$E/selftest" >/dev/null 2>&1 || { echo "cuda_emu: the emulator's self-test failed" >&2; exit 1; }
"$E/emu_test" --gtest_filter="${1:-*BackendConsistency*}"
