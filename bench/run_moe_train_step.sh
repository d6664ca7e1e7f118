#!/usr/bin/env bash
# MoE/MLA training-step throughput, Kestrel against PyTorch eager in the same
# run: forward + backward + AdamW on the Qwen3-MoE-shaped and
# DeepSeek-V3-shaped (MLA, sigmoid routing with groups and the correction
# bias) small configs, same tokens and thread count, Kestrel and the peer
# interleaved per config and dtype. The peer runs twice per pair: with
# transformers' default experts implementation (grouped_mm) and with
# experts_implementation="eager" (a loop of per-expert linears).
#   bash bench/run_moe_train_step.sh [threads] [steps] [rounds] ["fp32 bf16"] ["qwen3-moe-small deepseek-v3-small"]
# Prints JSON lines: a {"load": ...} line (uptime's load averages) before each
# round, then one line per run; Kestrel's names the CPU, kernel ISA and GEMM
# line, both sides print tokens_per_s (wall) and cpu_step_s (process CPU
# seconds per step / threads: leaves out time descheduled on a shared machine).
# Needs the release build (make bench) and torch + transformers from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
STEPS=${2:-3}
ROUNDS=${3:-1}
DTYPES=${4:-fp32 bf16}
CONFIGS=${5:-qwen3-moe-small deepseek-v3-small}
BIN=build/release/bench_train_step_bench
[[ -x $BIN ]] || { echo "build the release benchmarks first: make bench" >&2; exit 1; }
export OMP_NUM_THREADS=$THREADS
FLAGS=(--threads "$THREADS" --seq 512 --batch-tokens 2048 --steps "$STEPS")
for round in $(seq 1 "$ROUNDS"); do
  read -r l1 l5 l15 _ </proc/loadavg
  echo "{\"round\": $round, \"load\": [$l1, $l5, $l15], \"date\": \"$(date -u +%FT%TZ)\"}"
  for cfg in $CONFIGS; do
    for dtype in $DTYPES; do
      $BIN --config bench/configs/$cfg.json "${FLAGS[@]}" --dtype "$dtype"
      for impl in default eager; do
        extra=()
        [[ $impl == default ]] || extra=(--experts-implementation "$impl")
        python3 bench/peers/torch_train_step.py --config bench/configs/$cfg.json "${FLAGS[@]}" --dtype "$dtype" \
          "${extra[@]}"
      done
    done
  done
done
