#!/usr/bin/env bash
# Pipeline parallelism under mpirun (tests/mpi/pipeline_test.cpp): PP2 (tied
# and untied embeddings), interleaved PP2 x VPP2, uneven stages, stages of
# noop layers, a PP2 critic and PP2 scoring on 2 ranks; PP4, PP2 x TP2 and
# PP2 x DP2 with the distributed optimizer on 4 ranks (oversubscribed). Each
# equals one process after 3 AdamW steps within 1e-5 relative (fp32).
# usage: bash tests/scripts/mpi_pipeline.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_pipeline: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_pipeline: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=PipelineMpi.*"
  if ! timeout -k 5 600 mpirun -np $np --oversubscribe --bind-to none "$BIN" --gtest_filter='PipelineMpi.*' --gtest_color=no; then
    echo "mpi_pipeline: FAILED at -np $np" >&2
    exit 1
  fi
done
echo "mpi_pipeline: every pipelined layout equals one process"
