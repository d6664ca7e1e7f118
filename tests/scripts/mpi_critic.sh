#!/usr/bin/env bash
# The PPO critic under mpirun: 3 critic updates under DP2 (with and without
# the distributed optimizer) and under TP2 against one process (values, value
# losses, grad norms, final weights; tests/mpi/critic_parallel_test.cpp).
# usage: bash tests/scripts/mpi_critic.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_critic: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_critic: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='CriticParallel.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
if ! timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
  echo "mpi_critic: FAILED with 2 ranks" >&2
  exit 1
fi
echo "mpi_critic: passed with 2 ranks (DP2, DP2 + distributed optimizer, TP2)"
