#!/usr/bin/env bash
# The memory plan of mixture-of-experts and latent-attention models under
# tensor parallelism against the allocator (tests/mpi/moe_tp_memory_test.cpp),
# with 2 and 4 ranks: one actor update of the tiny Qwen3-MoE, DeepSeek-V3,
# Qwen2-MoE and DeepSeek-V2 goldens (and the dense Qwen3, Qwen2 and Llama
# goldens beside them) under TP2 with sequence parallelism, ETP2 at TP1, TP2
# with whole experts (ETP1), TP2 x DP2, EP2 x TP2 (with ETP2 and ETP1), EP2 x
# ETP2 at TP1, and TP2 x DP2 and EP2 x TP2 with the distributed optimizer, f32
# and bf16, in five recompute modes: every rank's Params, Grads,
# OptimizerState and Other peaks and the largest rank's Activations peak equal
# the plan's to the byte (EP runs replay a routing that balances the experts'
# ranks, the plan's assumption). Checks that the test ran and prints the
# "[moe tp memory]" lines.
# usage: bash tests/scripts/mpi_moe_tp_memory.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_moe_tp_memory "$BUILD"
BIN="$BUILD/mpi_tests"
[[ -x "$BIN" ]] || { echo "mpi_moe_tp_memory: $BIN not found; build the mpi_tests target" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  mpi_gtests mpi_moe_tp_memory "$np" 300 'MoeTpMemory.*' "$W/log$np.txt" MoeTpMemory.ActorUpdateFollowsThePlan
  grep "\[moe tp memory\]" "$W/log$np.txt" || true
done
echo "mpi_moe_tp_memory: OK (MoE/MLA plan equals the allocator per category at TP2, ETP, TP2 x DP2, EP2 x TP2)"
