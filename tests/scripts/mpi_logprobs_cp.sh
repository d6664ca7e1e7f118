#!/usr/bin/env bash
# `kestrel logprobs` with context parallelism: under mpirun -np 2 with --cp 2
# (ring attention, and Ulysses) each rank scores its zigzag share of every
# sequence (a 3,000-token one packed with short ones) and the gathered
# per-token logprobs and entropies equal the single-process output, fp32
# within 1e-5 relative to each line's scale. Bad context-parallel settings
# fail naming the key and the fix.
# usage: bash tests/scripts/mpi_logprobs_cp.sh <kestrel-binary> <build-dir>
set -euo pipefail
source "$(dirname "$0")/lib/compare_jsonl.sh"
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
[[ -x "$KESTREL" ]] || { echo "mpi_logprobs_cp: $KESTREL not found; build the kestrel target" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "mpi_logprobs_cp: FAILED: $*" >&2; exit 1; }

# Refusals (one process: the settings are checked before any rank is needed).
"$KESTREL" builtin model tiny --out "$TMP/m" --seed 3 >/dev/null
if "$KESTREL" logprobs --model "$TMP/m" --input /dev/null --output "$TMP/x.jsonl" --cp 2 --cp-algo hybrid_cp_algo \
     2>"$TMP/err.txt"; then fail "hybrid_cp_algo without ulysses_degree_in_cp was accepted"; fi
grep -q "ulysses_degree_in_cp" "$TMP/err.txt" || { cat "$TMP/err.txt" >&2; fail "the hybrid refusal does not name ulysses_degree_in_cp"; }
if "$KESTREL" logprobs --model "$TMP/m" --input /dev/null --output "$TMP/x.jsonl" --cp 2 --cp-algo adaptive_cp_algo \
     2>"$TMP/err.txt"; then fail "adaptive_cp_algo was accepted"; fi
grep -q "not supported yet" "$TMP/err.txt" || { cat "$TMP/err.txt" >&2; fail "adaptive_cp_algo is not refused as not supported yet"; }

if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "mpi_logprobs_cp: refusals passed; the mpirun part skipped, built without MPI (-DKESTREL_MPI=OFF)"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
# The built-in tiny model (4 heads, 2 kv heads) with room for a 3,000-token sequence.
sed -i 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 4096/' "$TMP/m/config.json"
grep -q '"max_position_embeddings": 4096' "$TMP/m/config.json" || fail "could not widen the model's positions"
{
  echo '{"input_ids": [5, 9, 33, 2, 17]}'
  awk 'BEGIN { printf "{\"input_ids\": ["; for (i = 0; i < 3000; i++) printf "%s%d", (i ? ", " : ""), 3 + (i * 7 + (i * i) % 13) % 20; print "]}" }'
  echo '{"input_ids": [7]}'
  echo '{"input_ids": [4, 4, 12, 8, 3, 19, 6, 11, 2]}'
} >"$TMP/in.jsonl"
"$KESTREL" logprobs --model "$TMP/m" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl" --max-batch-tokens 8192
for algo in megatron_cp_algo ulysses_cp_algo; do
  timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" logprobs --model "$TMP/m" --cp 2 \
    --cp-algo "$algo" --max-batch-tokens 8192 --input "$TMP/in.jsonl" --output "$TMP/cp2_$algo.jsonl"
  same_numbers "$TMP/single.jsonl" "$TMP/cp2_$algo.jsonl" 1e-5 || fail "--cp 2 ($algo) differs from one process"
done
echo "mpi_logprobs_cp: passed (--cp 2, ring and Ulysses, under mpirun -np 2 equals one process on 3,000 tokens)"
