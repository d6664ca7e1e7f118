#!/usr/bin/env bash
# Issue 21's targets in one run: the small training step against PyTorch and
# the rollout against HF generate, each pair back to back, on this machine's
# own ISA and under the AVX2 setting (OpenBLAS's Haswell kernels and
# Kestrel's AVX2 kernel variants; the peer held to AVX2 as well).
#   bash bench/run_targets.sh [pairs] [threads]
# Needs the release build (make bench), torch + transformers from PyPI, and the
# rollout model saved once: build/release/bench_rollout_bench --save-model /tmp/rb_model
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-3}
THREADS=${2:-2}
MODEL=${RB_MODEL:-/tmp/rb_model}
R=build/release
[[ -x $R/bench_train_step_bench && -x $R/bench_rollout_bench ]] || { echo "build the release benchmarks first: make bench" >&2; exit 1; }
[[ -f $MODEL/config.json ]] || { echo "save the rollout model first: $R/bench_rollout_bench --save-model $MODEL" >&2; exit 1; }
export OMP_NUM_THREADS=$THREADS
S=(--config bench/configs/small.json --threads "$THREADS" --seq 512 --batch-tokens 2048 --steps 5)
A2K=(OPENBLAS_CORETYPE=Haswell KESTREL_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2)
A2P=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 DNNL_MAX_CPU_ISA=AVX2)
RB=(--threads "$THREADS" --prompts 32 --n 8 --new 128 --only throughput)
# One pair: Kestrel's JSON line, the peer's, then the ratio of their
# tokens/s (both from the median step) and of their fastest steps (what a
# quiet moment of a shared machine gives each side).
train_pair() {  # $1: env for Kestrel, $2: env for the peer (space-separated VAR=value, may be empty)
  local k p
  k=$(env $1 $R/bench_train_step_bench "${S[@]}" | tail -1)
  p=$(env $2 python3 bench/peers/torch_train_step.py "${S[@]}" --dtype fp32 | tail -1)
  echo "$k"
  echo "$p"
  python3 -c 'import json, sys
k, p = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print("ratio %.2fx (tokens/s of the median steps: %.1f vs %.1f), %.2fx (fastest steps: %.3f vs %.3f s)" % (
    k["tokens_per_s"] / p["tokens_per_s"], k["tokens_per_s"], p["tokens_per_s"],
    p["step_s_min"] / k["step_s_min"], k["step_s_min"], p["step_s_min"]))' "$k" "$p"
}
# Output tokens/s is the third column of both rollout tables' last row.
rollout_pair() {
  local k p
  k=$(env $1 $R/bench_rollout_bench "${RB[@]}" | tail -3)
  p=$(env $2 python3 bench/peers/hf_generate.py --model "$MODEL" "${RB[@]}" | tail -2)
  echo "$k"
  echo "$p"
  local kt pt
  kt=$(grep '^| [0-9]' <<<"$k" | tail -1 | awk -F'|' '{print $4}')
  pt=$(grep '^| [0-9]' <<<"$p" | tail -1 | awk -F'|' '{print $4}')
  awk -v a="$kt" -v b="$pt" 'BEGIN { printf "ratio %.2fx (output tokens/s: %.1f vs %.1f)\n", a / b, a, b }'
}
for i in $(seq "$PAIRS"); do
  echo "== train pair $i, native ISA, $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)"
  train_pair "" ""
  echo "== train pair $i, AVX2 setting, $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)"
  train_pair "${A2K[*]}" "${A2P[*]}"
done
echo "== rollout, native ISA, $(date +%T)"
rollout_pair "" ""
echo "== rollout, AVX2 setting, $(date +%T)"
rollout_pair "${A2K[*]}" "${A2P[*]}"
