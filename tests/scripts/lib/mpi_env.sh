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
