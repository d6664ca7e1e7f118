#!/usr/bin/env bash
# The ranks of one job use one GEMM choice: rank 1, started with another
# KESTREL_BLAS than rank 0 (as two nodes whose micro-benchmarks came out
# differently would be) adopts rank 0's and says so (the assertion that
# matters: its log line); the job's output, which rank 0 writes, still equals
# the single-process run under that library bit for bit.
# usage: bash tests/scripts/mpi_gemm_agree.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_gemm_agree "$BUILD"
unset OPENBLAS_CORETYPE  # it would make auto pick OpenBLAS on both ranks
MODEL=tests/golden/models/qwen2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "mpi_gemm_agree: FAILED: $*" >&2; exit 1; }
# Two libraries are needed to disagree; OpenBLAS and oneDNN are both installed deps.
other=""
for lib in dnnl blis; do
  KESTREL_BLAS=$lib "$KESTREL" logprobs --model "$MODEL" --input /dev/null --output "$TMP/probe.jsonl" \
    >/dev/null 2>&1 && { other=$lib; break; }
done
[ -n "$other" ] || { echo "mpi_gemm_agree: skipped, only one GEMM library loads here"; exit 0; }
make_rows() { for i in $(seq 1 40); do printf '{"input_ids": [%d, %d, %d, %d, %d, %d, %d, %d]}\n' \
  $((i % 90)) $((i * 7 % 96)) 3 $((i * 11 % 96)) 5 $((i * 13 % 96)) 8 $((i * 17 % 96)); done; }
make_rows >"$TMP/in.jsonl"
KESTREL_BLAS=openblas "$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl" \
  2>/dev/null
timeout -k 5 120 mpirun --oversubscribe --bind-to none \
  -np 1 -x KESTREL_BLAS=openblas "$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/dp.jsonl" : \
  -np 1 -x KESTREL_BLAS=$other "$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/dp.jsonl" \
  2>"$TMP/err.txt" || { cat "$TMP/err.txt"; fail "mpirun"; }
grep -q "GEMM: rank 1: .*rank 0's choice, adopted by rank 1" "$TMP/err.txt" || { cat "$TMP/err.txt"; fail "rank 1 did not adopt rank 0's choice"; }
cmp -s "$TMP/single.jsonl" "$TMP/dp.jsonl" || fail "the job's scores differ from one process under rank 0's library"
echo "mpi_gemm_agree: passed (rank 1 adopted rank 0's GEMM choice)"
