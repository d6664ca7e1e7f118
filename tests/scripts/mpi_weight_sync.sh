#!/usr/bin/env bash
# Weight transfer from a trainer rank to disaggregated rollout ranks
# (tests/mpi/weight_sync_test.cpp, rollout/weight_sync.h): bucketed publishes
# (many buckets, oversized tensors alone) arrive bitwise equal in f32 and bf16,
# each publish carries its own snapshot, and a mismatched receiver or a
# corrupted bucket fails naming the tensor while the sender still finishes.
# 2 ranks: one receiver; 3 ranks: two receivers of each publish.
# usage: bash tests/scripts/mpi_weight_sync.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_weight_sync: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_weight_sync: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='WeightSync*'
for np in 2 3; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 120 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "mpi_weight_sync: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "mpi_weight_sync: passed with 2 and 3 ranks"
