#!/usr/bin/env bash
# `kestrel train` with trainer.device=cuda under mpirun -np 2 equals the same
# layout on the CPU: the GRPO run of tests/cuda_emu/grpo_on_device.sh as TP2
# (actor and rollout) and as DP2 with the distributed optimizer, each on the
# device (the grid's groups over NCCL) against the CPU (over MPI); every
# compared metric of every step within 1e-4 relative and the saved actor
# weights alike (tests/scripts/lib/compare_runs.sh). No validation (it is
# the same generation, and the slowest part on the emulator). By hand: the
# cuda-emu build's kestrel (the fake NCCL; minutes per device run, more on a
# loaded machine), or the cuda build's on a machine with a GPU per rank.
# STEPS (default 2) and LAYOUTS (default "tp2 dp2_distopt") shorten it:
#   [STEPS=1 LAYOUTS=tp2] bash tests/nccl/grpo_two_ranks.sh [<kestrel-binary>]
set -euo pipefail
ROOT=${KESTREL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
KESTREL=${1:-$ROOT/build/cuda-emu/kestrel}
[[ -x "$KESTREL" ]] || { echo "grpo_two_ranks: $KESTREL not found; build the kestrel target (cmake --preset cuda-emu)" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "grpo_two_ranks: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_kl_loss=true
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-5
        trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[]" trainer.resume_mode=disable
        trainer.total_training_steps=${STEPS:-2} trainer.save_freq=${STEPS:-2} trainer.time_budget_s=7200
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
run() {
  timeout -k 5 3600 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" "$@" >"$W/log.txt" 2>&1 ||
    fail "mpirun -np 2 kestrel train $*"
}
KEYS='actor/pg_loss actor/kl_loss actor/entropy actor/grad_norm actor/ppo_kl critic/score/mean response_length/mean'
source "$ROOT/tests/scripts/lib/compare_runs.sh"
M=actor_rollout_ref.actor.megatron
for layout in ${LAYOUTS:-tp2 dp2_distopt}; do
  case $layout in
    tp2) extra=($M.tensor_model_parallel_size=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2) ;;
    dp2_distopt) extra=($M.use_distributed_optimizer=true) ;;
  esac
  run trainer.device=cpu trainer.default_local_dir="$W/$layout-cpu" "${extra[@]}"
  run trainer.device=cuda trainer.default_local_dir="$W/$layout-cuda" "${extra[@]}"
  grep -q "on cuda)" "$W/log.txt" || fail "$layout: the trainer.device=cuda run did not say it ran on cuda"
  same_metrics "$W/$layout-cpu" "$W/$layout-cuda" "$layout: trainer.device=cuda against cpu"
  same_logprobs "$W/$layout-cpu/global_step_${STEPS:-2}/actor/model" "$W/$layout-cuda/global_step_${STEPS:-2}/actor/model" \
    "$layout: saved actor weights"
  echo "grpo_two_ranks: $layout ok"
done
echo "grpo_two_ranks: OK (${STEPS:-2} GRPO steps with trainer.device=cuda on 2 ranks equal the CPU's: ${LAYOUTS:-tp2 dp2_distopt})"
