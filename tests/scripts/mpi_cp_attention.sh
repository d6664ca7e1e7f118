#!/usr/bin/env bash
# Context-parallel attention under mpirun (tests/mpi/cp_attention_test.cpp):
# with 2 ranks (CP2) and 4 ranks (CP4, oversubscribed) Ulysses, ring (zigzag)
# and, on 4 ranks, the 2x2 hybrid equal one process's attention over the full
# packed batch (out, lse, dq/dk/dv of every real row; GQA, MHA, replicated kv
# heads, narrower values; f32 and bf16), the Ulysses all-to-all round trip is
# the identity, head constraints name the numbers, scoring's gather inverts
# the split, and the bytes each rank sends equal the closed form (printed as
# "[cp bytes]" lines). Checks that each test really ran (not skipped, not
# filtered away), not only the exit status.
# usage: bash tests/scripts/mpi_cp_attention.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_cp_attention "$BUILD"
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  echo "mpi_cp_attention: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
ALWAYS=(UlyssesEqualsOneProcess RingEqualsOneProcess AllToAllRoundTripIsTheIdentity HeadConstraintsNameTheNumbers
        GatherRowsInvertsTheSplit)
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=CpAttentionMpi.*"
  want=("${ALWAYS[@]}")
  if [[ $np == 4 ]]; then want+=(HybridEqualsOneProcess); fi
  mpi_gtests mpi_cp_attention "$np" 300 'CpAttentionMpi.*' "$W/log$np.txt" "${want[@]/#/CpAttentionMpi.}"
  # Every algorithm's byte line, per case (4 f32 shapes + bf16).
  for algo in ulysses ring $([[ $np == 4 ]] && echo hybrid); do
    n=$(grep -c "^\[cp bytes\] $algo cp=$np " "$W/log$np.txt" || true)
    if [[ "$n" -ne 5 ]]; then
      echo "mpi_cp_attention: $n '[cp bytes] $algo cp=$np' lines with $np ranks, expected 5" >&2
      exit 1
    fi
  done
  grep -E '^\[cp (bytes|err)\]' "$W/log$np.txt"
done
echo "mpi_cp_attention: Ulysses, ring and hybrid equal one process with 2 and 4 ranks"
