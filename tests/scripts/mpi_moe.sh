#!/usr/bin/env bash
# MoE / MLA models under mpirun (tests/mpi/moe_mpi_test.cpp, 2 ranks): DP2
# (plain and with the distributed optimizer) and PP2 train the tiny Qwen3-MoE
# and DeepSeek-V3 goldens exactly as one process, router losses and the
# aux-loss-free bias update on.
# usage: bash tests/scripts/mpi_moe.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_moe: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_moe: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='MoeMpi.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
if ! timeout -k 5 600 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no \
    | tee "$OUT"; then
  echo "mpi_moe: FAILED" >&2
  exit 1
fi
# A stale binary without the tests would pass an empty filter.
grep -q 'PASSED.* 2 tests' "$OUT" || { echo "mpi_moe: FAILED: the MoeMpi tests did not run" >&2; exit 1; }
echo "mpi_moe: DP2, DP2 with the distributed optimizer and PP2 equal one process"
