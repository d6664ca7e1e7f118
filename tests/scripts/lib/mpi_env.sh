# Shared start of the tests/scripts/mpi_*.sh tests: `mpi_env <name> <build-dir>`
# exits 0 with a "skipped" line when the build has no MPI, and otherwise sets
# the OpenMPI environment every one of them runs under (root allowed, more
# ranks than cores, shared-memory transport, ranks that yield while waiting,
# one OpenMP thread per rank).
mpi_env() {
  local name=$1 build=$2
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$build/CMakeCache.txt" 2>/dev/null; then
    echo "$name: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
}

# `mpi_gtests <name> <np> <timeout s> <gtest filter> <log> [Suite.Test ...]`
# runs $BIN (the mpi_tests binary) on np ranks into <log>, and fails with the
# log's tail unless it passed, some test ran (a filter that matches nothing,
# or a stale binary without the suites, must not pass as green) and each
# named test ran and passed.
mpi_gtests() {
  local name=$1 np=$2 limit=$3 filter=$4 log=$5 t
  shift 5
  if ! timeout -k 5 "$limit" mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$filter" \
       --gtest_color=no >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "$name: FAILED with $np ranks" >&2
    exit 1
  fi
  grep -Eq '^\[  PASSED  \] [1-9][0-9]* tests?' "$log" ||
    { tail -40 "$log" >&2; echo "$name: no test matched '$filter' with $np ranks" >&2; exit 1; }
  for t in "$@"; do
    grep -q "^\[       OK \] $t " "$log" ||
      { tail -40 "$log" >&2; echo "$name: $t did not run and pass with $np ranks" >&2; exit 1; }
  done
}
