#!/usr/bin/env bash
# The NaN/Inf guard and reuse_fp32_param under mpirun (2 and 4 ranks, dp =
# world): a NaN gradient or a non-finite loss on one rank skips the update on
# every rank (weights unchanged and identical), K consecutive skips abort
# everywhere (tests/mpi/nan_guard_test.cpp); bf16 training with
# reuse_fp32_param equals the same layout without it bit for bit, with the
# distributed optimizer and with the all-reduce, at 2 bytes per owned
# parameter less, and each rank's optimizer file resumes bit for bit
# (tests/mpi/reuse_fp32_test.cpp).
# usage: bash tests/scripts/nan_guard_mpi.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "nan_guard_mpi: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "nan_guard_mpi: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='NanGuardMpi*:ReuseFp32Mpi*'
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 180 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "nan_guard_mpi: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "nan_guard_mpi: passed with 2 and 4 ranks"
