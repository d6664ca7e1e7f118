#!/usr/bin/env bash
# Tensor / sequence / data parallelism under mpirun: the parallel building
# blocks (column/row linear, vocab-parallel embedding and logprob/entropy,
# head-sharded GQA attention, sharding, DP buckets and the distributed
# optimizer) against the single-process ops, and the model's acceptance tests
# (3 AdamW steps under TP2, TP2+SP, DP, DP + distributed optimizer; with 4
# ranks TP2 x DP2 and TP4 with replicated kv heads) against one process.
# usage: bash tests/scripts/mpi_tp_dp.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_tp_dp: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_tp_dp: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='Tp*:Dp*'
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 120 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "mpi_tp_dp: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "mpi_tp_dp: passed with 2 and 4 ranks"
