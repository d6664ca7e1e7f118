#!/usr/bin/env bash
# Multi-rank tests: runs <build-dir>/mpi_tests under mpirun with 2 and 4 ranks
# (oversubscribed: CI has 2 cores). Collectives vs local references, adjoint
# checks of the TP mapping pairs, ProcessGrid groups vs the rank tables and the
# reused-fp32-param checks. The other suites of mpi_tests have their own
# scripts (tests/scripts/mpi_*.sh) with the rank counts they are written for;
# running them here too only doubled the time (past this script's limit on CI).
# usage: bash tests/scripts/mpi_collectives.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_collectives: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_collectives: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
# Open MPI refuses root and more ranks than cores unless told; run alone, this
# script must not depend on scripts/run_tests.sh having exported these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# One node: shared memory and self only (no network probing); yield while
# waiting so oversubscribed ranks do not starve each other.
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='MpiCollectives.*:Adjoint.*:GridMpi.*:ReuseFp32Mpi.*'
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 300 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" \
      --gtest_filter="$FILTER" --gtest_color=no | tee "$OUT"; then
    echo "mpi_collectives: FAILED with $np ranks" >&2
    exit 1
  fi
  # A stale binary without the suites would pass an empty filter.
  grep -q 'PASSED' "$OUT" && ! grep -q 'PASSED.* 0 tests' "$OUT" \
    || { echo "mpi_collectives: FAILED: no tests ran with $np ranks" >&2; exit 1; }
done
echo "mpi_collectives: passed with 2 and 4 ranks"
