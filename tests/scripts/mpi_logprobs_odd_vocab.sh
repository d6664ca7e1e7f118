#!/usr/bin/env bash
# Tensor parallelism on a vocabulary tp does not divide (issue 11 item 7):
# `kestrel logprobs --tp 2` under mpirun -np 2 on tests/golden/models/odd_vocab
# (vocab_size 1001, padded to 1024 rows that never win) must equal the
# single-process output, fp32 within 1e-5 relative to each line's scale; and
# the TP2 training forward + backward, rollout logits and save/load on vocab
# 1001 equal one process (tests/mpi/vocab_padding_test.cpp).
# usage: bash tests/scripts/mpi_logprobs_odd_vocab.sh <kestrel-binary> <build-dir>
set -euo pipefail
source "$(dirname "$0")/lib/compare_jsonl.sh"
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "mpi_logprobs_odd_vocab: skipped, built without MPI (-DKESTREL_MPI=OFF)"
  exit 0
fi
[[ -x "$KESTREL" ]] || { echo "mpi_logprobs_odd_vocab: $KESTREL not found; build the kestrel target" >&2; exit 1; }
[[ -x "$BUILD/mpi_tests" ]] || { echo "mpi_logprobs_odd_vocab: $BUILD/mpi_tests not found" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
fail() { echo "mpi_logprobs_odd_vocab: FAILED: $*" >&2; exit 1; }

timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$BUILD/mpi_tests" --gtest_filter='VocabPaddingTp*' \
  --gtest_color=no || fail "VocabPaddingTp tests under mpirun -np 2"

MODEL=tests/golden/models/odd_vocab  # vocab 1001, tied embeddings, 4 heads / 2 kv heads
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Ids on both ranks' halves, up to the last real id 1000 (rank 1 holds 512..1000 and 23 padding rows).
cat >"$TMP/in.jsonl" <<'JSONL'
{"input_ids": [1, 500, 999, 1000, 511, 512, 7]}
{"input_ids": [4, 4, 4, 800, 12, 0, 613, 17, 990, 3, 3, 8, 44]}
{"input_ids": [1000, 19]}
{"input_ids": [250, 251, 252, 753, 754, 755, 956, 957, 958, 959, 960]}
JSONL
"$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl"
timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" logprobs --model "$MODEL" --tp 2 \
  --input "$TMP/in.jsonl" --output "$TMP/tp2.jsonl" || fail "kestrel logprobs --tp 2 on vocab 1001"
same_numbers "$TMP/single.jsonl" "$TMP/tp2.jsonl" 1e-5 || fail "--tp 2 output differs from the single-process output"
echo "mpi_logprobs_odd_vocab: passed (--tp 2 on vocab 1001 under mpirun -np 2 equals one process)"
