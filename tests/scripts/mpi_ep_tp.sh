#!/usr/bin/env bash
# Tensor parallelism of the MoE and MLA layers under mpirun
# (tests/mpi/ep_tp_test.cpp) with 2 and 4 ranks: the etp exchange's gather
# and reduce-scatter deliver every rank's rows and are adjoint, their bytes
# equal the closed form; 3 AdamW steps
# of the tiny Qwen3-MoE, DeepSeek-V3, Qwen2-MoE and DeepSeek-V2 goldens under
# TP2 (sequence parallel; Qwen3-MoE also with capacity 1 padded), the loss,
# log-probs and gradients of one forward/backward under TP2 (with and without
# capacity), EP2 x TP2, EP2 with ETP2 and TP4 on 3 tokens (a rank with no row
# of its own),
# ETP2 at TP1, ETP1 at TP2, TP2 x DP2, EP2 x TP2 (each expert's FFN split over
# the tp group; also with the distributed optimizer), EP2 with ETP2 and EP2 x
# TP2 with ETP1 equal one process; saving an HF folder and the rollout's
# whole-model copy under TP2 and EP2 x TP2 hold every tensor bit for bit; the
# layout-independent optimizer checkpoint moves between one process and EP2 x
# TP2 with the distributed optimizer; the rollout engine under TP2 and TP4
# (all four models) and on the actor's EP2 x TP2 layout gives one process's
# greedy tokens (log-probs 1e-5) (training: losses and every parameter
# gathered whole within 1e-5 of scale, the correction biases bit for bit).
# Checks that the tests ran.
# usage: bash tests/scripts/mpi_ep_tp.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_ep_tp "$BUILD"
BIN="$BUILD/mpi_tests"
[[ -x "$BIN" ]] || { echo "mpi_ep_tp: $BIN not found; build the mpi_tests target" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  tests=(EpTp.EtpGatherAndReduceScatterAreAdjoint EpTp.TrainingEqualsOneProcess EpTp.SavingAndRolloutWeightsGatherEveryTensor
         EpTp.RolloutUnderTpEqualsOneProcess EpTp.GradientsEqualOneProcess EpTp.EtpExchangeBytesEqualTheFormula)
  [[ $np == 4 ]] && tests+=(EpTp.OptimizerCheckpointMovesBetweenOneProcessAndEp2Tp2 EpTp.RolloutUnderEp2Tp2EqualsOneProcess)
  mpi_gtests mpi_ep_tp "$np" 600 'EpTp.*' "$W/log$np.txt" "${tests[@]}"
  grep "\[ measured \]" "$W/log$np.txt" || true
done
echo "mpi_ep_tp: OK (etp exchange; TP2 gradients; TP2, ETP2, TP2 x DP2, EP2 x TP2, EP2 with ETP2 train equal to one process; saving, rollout copy and optimizer checkpoints under EP x TP; rollout under TP2, TP4 and EP2 x TP2)"
