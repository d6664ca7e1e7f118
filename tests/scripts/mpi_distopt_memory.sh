#!/usr/bin/env bash
# The distributed optimizer's memory under mpirun (2 and 4 ranks, dp = world):
# bf16 optimizer state 12 -> 12/dp bytes per parameter (AdamW holds the f32
# master for its owned range only), f32 8 -> 8/dp, checked against the
# allocator's OptimizerState bytes; parameters after 3 AdamW steps equal one
# process's (bit for bit with the same gradients, bf16 tolerance with real
# ones). Also runs the DP gradient tests the optimizer relies on.
# usage: bash tests/scripts/mpi_distopt_memory.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_distopt_memory: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_distopt_memory: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='DistOpt*:Dp*'
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 120 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "mpi_distopt_memory: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "mpi_distopt_memory: passed with 2 and 4 ranks"
