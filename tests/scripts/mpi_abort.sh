#!/usr/bin/env bash
# Abort path: under mpirun -np 2, rank 1 throws and calls comm::abort_world
# while rank 0 blocks in an all-reduce. The whole job must end non-zero well
# inside the timeout (no hung rank), and rank 1's message must be printed.
# usage: bash tests/scripts/mpi_abort.sh <kestrel-binary> <build-dir>
set -uo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_abort: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_abort: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export KESTREL_ABORT_DEMO=1
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
start=$SECONDS
timeout -k 5 60 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter='*AbortDemo*' --gtest_color=no >"$LOG" 2>&1
rc=$?
elapsed=$((SECONDS - start))
cat "$LOG"
fail() { echo "mpi_abort: FAILED: $*" >&2; exit 1; }
# 124/137: timeout had to stop it, i.e. a rank hung instead of being aborted.
[[ $rc -ne 124 && $rc -ne 137 ]] || fail "the job did not end within 60 s (rc=$rc): a rank hung"
[[ $rc -ne 0 ]] || fail "mpirun exited 0: the ranks should have been aborted"
grep -q 'kestrel: rank 1: abort demo: rank 1 failed on purpose' "$LOG" || fail "rank 1's message is missing"
# mpirun only returns once every rank has exited; no rank may have completed the test.
! grep -q '\[       OK \] AbortDemo' "$LOG" || fail "a rank finished the test instead of being aborted"
! grep -q 'abort_world returned\|left the collective' "$LOG" || fail "a rank got past abort_world or the collective"
echo "mpi_abort: passed (job aborted with rc=$rc after ${elapsed}s)"
