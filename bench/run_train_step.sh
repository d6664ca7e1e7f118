#!/usr/bin/env bash
# Training-step throughput, Kestrel against PyTorch eager in the same run:
# forward + backward + AdamW, fp32, same configs, tokens and thread count.
#   bash bench/run_train_step.sh [threads] [steps] ["<KESTREL_BLAS values>"]
# The third argument runs Kestrel once per GEMM library, interleaved with the
# peer (e.g. "openblas dnnl blis auto"); by default KESTREL_BLAS as set (auto).
# Each Kestrel JSON line names the CPU, kernel ISA and GEMM line that ran.
# Needs the release build (make bench) and torch + transformers from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
STEPS=${2:-3}
BLAS_LIST=${3:-${KESTREL_BLAS:-auto}}
BIN=build/release/bench_train_step_bench
[[ -x $BIN ]] || { echo "build the release benchmarks first: make bench" >&2; exit 1; }
export OMP_NUM_THREADS=$THREADS
for cfg in tiny small; do
  for blas in $BLAS_LIST; do
    KESTREL_BLAS=$blas $BIN --config bench/configs/$cfg.json --threads "$THREADS" --seq 512 --batch-tokens 2048 \
      --steps "$STEPS"
  done
  python3 bench/peers/torch_train_step.py --config bench/configs/$cfg.json --threads "$THREADS" --seq 512 \
    --batch-tokens 2048 --steps "$STEPS" --dtype fp32
done
