#!/usr/bin/env bash
# Context-parallel training under mpirun (tests/mpi/cp_train_test.cpp): 3 AdamW
# steps on micro-batches of a 3,001- and a 1,024-token sequence packed with
# short ones equal one process (losses, parameters, scoring log-probs; fp32
# 1e-5) with 2 ranks (Ulysses CP2, ring CP2) and 4 ranks (Ulysses CP4, ring
# CP4, hybrid 2x2, CP2 x TP2 with sequence parallelism, CP2 x DP2 plain and
# with the distributed optimizer); one step of a 4,096-token sequence's
# activation peak per rank and the bytes sent over the cp groups follow the
# memory model and the closed form (tests/mpi/cp_memory_test.cpp; printed as
# "[cp memory]" / "[cp step bytes]" lines). Checks that the tests ran, not
# only the exit status.
# usage: bash tests/scripts/mpi_cp_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_cp_train "$BUILD"
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  echo "mpi_cp_train: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=CpTrain.*:CpMemory.*"
  if ! timeout -k 5 900 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter='CpTrain.*:CpMemory.*' \
       --gtest_color=no >"$W/log$np.txt" 2>&1; then
    tail -60 "$W/log$np.txt" >&2
    echo "mpi_cp_train: FAILED with $np ranks" >&2
    exit 1
  fi
  t=$([[ $np == 2 ]] && echo TwoRanksEqualOneProcess || echo FourRanksEqualOneProcess)
  for want in "CpTrain.$t" CpTrain.RefusalsNameTheNumbers CpMemory.ActivationPeakAndBytesFollowTheModel; do
    if ! grep -q "^\[       OK \] $want " "$W/log$np.txt"; then
      tail -40 "$W/log$np.txt" >&2
      echo "mpi_cp_train: $want did not run and pass with $np ranks" >&2
      exit 1
    fi
  done
  grep -E '^\[cp (memory|step bytes)\]' "$W/log$np.txt"
done
echo "mpi_cp_train: Ulysses, ring, hybrid, CP x TP and CP x DP equal one process with 2 and 4 ranks"
