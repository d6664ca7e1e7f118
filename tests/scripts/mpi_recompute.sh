#!/usr/bin/env bash
# Activation recompute under mpirun: 3 AdamW steps with every recompute mode
# are bit-identical to none under TP2 with sequence parallelism and under DP2
# (tests/mpi/recompute_mpi_test.cpp; 2 ranks each: TP2 x DP2 needs 4 ranks,
# too slow on two loaded cores).
# usage: bash tests/scripts/mpi_recompute.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_recompute: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_recompute: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='RecomputeMpi.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
if ! timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
  echo "mpi_recompute: FAILED" >&2
  exit 1
fi
echo "mpi_recompute: passed (TP2+SP and DP2, 2 ranks)"
