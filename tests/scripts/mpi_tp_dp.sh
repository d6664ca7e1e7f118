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
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_tp_dp "$BUILD"
BIN="$BUILD/mpi_tests"
[[ -x "$BIN" ]] || { echo "mpi_tp_dp: $BIN not found; build the mpi_tests target" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=Tp*:Dp*"
  mpi_gtests mpi_tp_dp "$np" 120 'Tp*:Dp*' "$W/np$np.log"
  grep -E '^\[  PASSED  \]' "$W/np$np.log" | head -1
done
echo "mpi_tp_dp: passed with 2 and 4 ranks"
