#!/usr/bin/env bash
# Layout-independent optimizer checkpoints under mpirun -np 2
# (tests/mpi/optimizer_ckpt_mpi_test.cpp): a checkpoint saved under TP2
# resumes under TP1 and the reverse (a replicated kv head, a padded
# vocabulary), DP2 with the distributed optimizer under DP1 and the reverse
# (f32, bf16, bf16 with reuse_fp32_param), a PP2 checkpoint under TP2 and
# TP2 x PP2 under one process (the pipeline emulated with model slices), and
# a real 2-stage pp group (ProcessGrid dims.pp = 2) whose stages write their
# files into one folder at once. The restored state re-saved is the saved
# file bit for bit; the same layout resumes bit for bit; across layouts the
# resumed run is within 1e-6 of the old layout's uninterrupted run. The
# one-process cases (1 -> 1, PP2 <-> PP1, refusals) are in test_train
# (OptimizerCheckpoint.*).
# usage: bash tests/scripts/mpi_optimizer_ckpt.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_optimizer_ckpt: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_optimizer_ckpt: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='OptimizerCkptMpi.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
if ! timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
  echo "mpi_optimizer_ckpt: FAILED" >&2
  exit 1
fi
echo "mpi_optimizer_ckpt: TP2 <-> TP1, DP2+distributed optimizer <-> DP1, PP2 -> TP2, TP2xPP2 -> TP1 and a real pp group resume (2 ranks)"
