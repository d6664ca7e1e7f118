#!/usr/bin/env bash
# `kestrel logprobs` with tensor parallelism: under mpirun -np 2 with --tp 2
# (each rank holds half the heads, half the MLP and half the vocabulary) the
# per-token logprobs and entropies must equal the single-process output,
# fp32 within 1e-5 relative to each line's scale.
# usage: bash tests/scripts/mpi_logprobs_tp.sh <kestrel-binary> <build-dir>
set -euo pipefail
source "$(dirname "$0")/lib/compare_jsonl.sh"
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "mpi_logprobs_tp: skipped, built without MPI (-DKESTREL_MPI=OFF)"
  exit 0
fi
[[ -x "$KESTREL" ]] || { echo "mpi_logprobs_tp: $KESTREL not found; build the kestrel target" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
MODEL=tests/golden/models/qwen2  # vocab 96, 4 heads / 2 kv heads, tied embeddings, q/k/v biases
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/in.jsonl" <<'JSONL'
{"input_ids": [1, 5, 9, 33, 70, 2, 95]}
{"input_ids": [4, 4, 4, 80, 12, 0, 61, 17, 90, 3, 3, 8, 44]}
{"input_ids": [7, 19]}
{"input_ids": [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]}
JSONL
"$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl"
timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" logprobs --model "$MODEL" --tp 2 \
  --input "$TMP/in.jsonl" --output "$TMP/tp2.jsonl"
fail() { echo "mpi_logprobs_tp: FAILED: $*" >&2; exit 1; }
same_numbers "$TMP/single.jsonl" "$TMP/tp2.jsonl" 1e-5 || fail "--tp 2 output differs from the single-process output"
echo "mpi_logprobs_tp: passed (--tp 2 under mpirun -np 2 equals one process)"
