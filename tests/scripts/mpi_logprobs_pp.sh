#!/usr/bin/env bash
# `kestrel logprobs` with pipeline parallelism: under mpirun -np 2 with --pp 2
# (even split; interleaved vpp 2 with noop layers padding 2
# layers to 4 slots at vpp 2, uneven with a noop slot) and -np 4 with --pp 2 --tp 2, each rank scores
# through its stage and the last stage's log-probs and entropies reach every
# rank; the written output must equal the single-process output, fp32 within
# 1e-5 relative to each line's scale (the stages run the same kernels in the
# same order: in practice bit for bit), including one sequence as long as the
# model's position table.
# usage: bash tests/scripts/mpi_logprobs_pp.sh <kestrel-binary> <build-dir>
set -euo pipefail
source "$(dirname "$0")/lib/compare_jsonl.sh"
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "mpi_logprobs_pp: skipped, built without MPI (-DKESTREL_MPI=OFF)"
  exit 0
fi
[[ -x "$KESTREL" ]] || { echo "mpi_logprobs_pp: $KESTREL not found; build the kestrel target" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
MODEL=tests/golden/models/qwen2  # 2 layers, vocab 96, tied embeddings, q/k/v biases
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/in.jsonl" <<'JSONL'
{"input_ids": [1, 5, 9, 33, 70, 2, 95]}
{"input_ids": [4, 4, 4, 80, 12, 0, 61, 17, 90, 3, 3, 8, 44]}
{"input_ids": [7, 19]}
{"input_ids": [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]}
JSONL
fail() { echo "mpi_logprobs_pp: FAILED: $*" >&2; exit 1; }
"$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl"
OT=actor_rollout_ref.actor.megatron.override_transformer_config
run() {  # run <np> <label> <args...>
  local np=$1 label=$2
  shift 2
  timeout -k 5 180 mpirun -np "$np" --oversubscribe --bind-to none "$KESTREL" logprobs --model "$MODEL" \
    --input "$TMP/in.jsonl" --output "$TMP/pp.jsonl" "$@" >"$TMP/log.txt" 2>&1 || { tail -20 "$TMP/log.txt"; fail "$label"; }
  same_numbers "$TMP/single.jsonl" "$TMP/pp.jsonl" 1e-5 || fail "$label: output differs from one process"
  echo "mpi_logprobs_pp: $label equals one process"
}
run 2 "pp2" --pp 2
# 2 real layers + noop slots 0 and 3 = 4 slots over pp 2 x vpp 2: rank 0's
# first chunk is the embedding alone, rank 1's last the head alone.
run 2 "pp2 vpp2 noop [0,3]" --pp 2 actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 \
  "$OT.noop_layers=[0,3]"
# 3 slots (noop 2), uneven: 1 on the first stage, 2 (a layer and the noop slot) on the last.
run 2 "pp2 uneven 1+2 with noop [2]" --pp 2 "$OT.noop_layers=[2]" "$OT.num_layers_in_first_pipeline_stage=1"
run 4 "pp2 x tp2" --pp 2 --tp 2
# One sequence filling the model's position table (longer ones are refused).
MAXPOS=$(tr ',' '\n' <"$MODEL/config.json" | grep max_position_embeddings | tr -dc '0-9')
N=$(( MAXPOS < 3000 ? MAXPOS : 3000 ))
awk -v n="$N" 'BEGIN { printf "{\"input_ids\": ["; for (i = 0; i < n; i++) printf "%s%d", (i ? ", " : ""), (i * 37 + 11) % 96; print "]}" }' >"$TMP/in.jsonl"
"$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" --output "$TMP/single.jsonl"
run 2 "pp2, one $N-token sequence" --pp 2
# Bad layouts name the keys and numbers.
if mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" logprobs --model "$MODEL" --input "$TMP/in.jsonl" \
     --output "$TMP/x.jsonl" --pp 2 actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 \
     >"$TMP/log.txt" 2>&1; then
  fail "2 layers over pp 2 x vpp 2 without noop layers was accepted"
fi
grep -q "virtual_pipeline_model_parallel_size" "$TMP/log.txt" || { cat "$TMP/log.txt"; fail "the layout error names no key"; }
echo "mpi_logprobs_pp: passed"
