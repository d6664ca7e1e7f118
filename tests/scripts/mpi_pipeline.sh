#!/usr/bin/env bash
# Pipeline parallelism under mpirun (tests/mpi/pipeline_test.cpp): PP2 (tied
# and untied embeddings), interleaved PP2 x VPP2, uneven stages, stages of
# noop layers, a PP2 critic and PP2 scoring on 2 ranks; PP4, PP2 x TP2 and
# PP2 x DP2 with the distributed optimizer on 4 ranks (oversubscribed). Each
# equals one process after 3 AdamW steps within 1e-5 relative (fp32).
# usage: bash tests/scripts/mpi_pipeline.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_pipeline "$BUILD"
BIN="$BUILD/mpi_tests"
[[ -x "$BIN" ]] || { echo "mpi_pipeline: $BIN not found; build the mpi_tests target" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=PipelineMpi.*"
  mpi_gtests mpi_pipeline "$np" 600 'PipelineMpi.*' "$W/np$np.log"
  grep -E '^\[  PASSED  \]' "$W/np$np.log" | head -1
done
echo "mpi_pipeline: every pipelined layout equals one process"
