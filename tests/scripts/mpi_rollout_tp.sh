#!/usr/bin/env bash
# The rollout engine under tensor parallelism and the train -> rollout weight
# resharding (tests/mpi/rollout_tp_test.cpp): greedy and seeded outputs of a
# TP engine (with prefix caching, chunked prefill and forced preemption) equal
# the single-process engine's; TP -> TP1, TP1 -> TP and (4 ranks) TP2 <-> TP4
# resharding give the single-process weights and outputs. 2 ranks: TP2;
# 4 ranks: TP4 with replicated kv heads.
# usage: bash tests/scripts/mpi_rollout_tp.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_rollout_tp: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_rollout_tp: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='RolloutTp*'
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 120 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "mpi_rollout_tp: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "mpi_rollout_tp: passed with 2 and 4 ranks"
