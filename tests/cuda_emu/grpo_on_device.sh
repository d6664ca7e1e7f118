#!/usr/bin/env bash
# A GRPO run with trainer.device=cuda equals the same run on the CPU: the
# tiny random-init model (builtin:tiny), KL loss against the reference, two
# updates per step, a validation; every compared metric of every step within
# 1e-4 relative (tests/scripts/lib/compare_runs.sh), and the saved actor
# weights score alike. A third run with MindSpeed's swap optimizer (3 pieces)
# on the device must match the plain device run too, and so must a fourth with param_offload and grad_offload
# of the actor and param_offload of the reference (weights and gradients idle in host memory between phases). On the CPU emulator by hand (the kestrel binary of the
# cuda-emu preset: `bash tests/cuda_emu/grpo_on_device.sh`), and on a GPU by
# scripts/device_check.sh with the cuda preset's binary:
#   bash tests/cuda_emu/grpo_on_device.sh [<kestrel-binary>]
set -euo pipefail
# The source tree: KESTREL_SOURCE_DIR when set (scripts/device_check.sh runs a copy of this script from its bundle).
ROOT=${KESTREL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
KESTREL=${1:-}
if [[ -z "$KESTREL" ]]; then
  cd "$ROOT"
  cmake --preset cuda-emu >/dev/null
  cmake --build build/cuda-emu -j "${JOBS:-2}" --target kestrel
  KESTREL=$ROOT/build/cuda-emu/kestrel
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fail() { echo "grpo_on_device: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }
# The reward program scores a response by the length of its request line mod 5, so groups differ and the
# policy gradient is not zero; Adam's eps 1e-5 keeps summation-order noise in near-zero gradients from
# becoming lr-sized steps (as tests/scripts/mpi_train.sh does for its layouts). A 2-hour time budget: the built-in
# run's 590 s would stop a slow emulated run after one step, and the runs would not compare.
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_kl_loss=true
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-5
        trainer.test_freq=2 "trainer.logger=[]" trainer.resume_mode=disable
        trainer.total_training_steps=2 trainer.save_freq=2 trainer.time_budget_s=7200
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
run() { "$KESTREL" train "${COMMON[@]}" "$@" >"$W/log.txt" 2>&1 || fail "kestrel train $*"; }
run trainer.device=cpu trainer.default_local_dir="$W/cpu"
run trainer.device=cuda trainer.default_local_dir="$W/cuda"
grep -q "params, on cuda)" "$W/log.txt" || fail "the trainer.device=cuda run did not say it ran on cuda"
OT=actor_rollout_ref.actor.megatron.override_transformer_config
run trainer.device=cuda trainer.default_local_dir="$W/swap" "+$OT.swap_optimizer=True" "+$OT.swap_optimizer_times=3"
run trainer.device=cuda trainer.default_local_dir="$W/offload" actor_rollout_ref.actor.megatron.param_offload=true \
  actor_rollout_ref.actor.megatron.grad_offload=true actor_rollout_ref.ref.megatron.param_offload=true
KEYS='actor/pg_loss actor/kl_loss actor/entropy actor/grad_norm actor/ppo_kl critic/score/mean response_length/mean'
source "$ROOT/tests/scripts/lib/compare_runs.sh"
same_metrics "$W/cpu" "$W/cuda" "trainer.device=cuda against cpu"
same_logprobs "$W/cpu/global_step_2/actor/model" "$W/cuda/global_step_2/actor/model" "saved actor weights"
same_metrics "$W/cuda" "$W/swap" "the swap optimizer against the state on the device"
cmp -s "$W/cuda/global_step_2/actor/model/model.safetensors" "$W/swap/global_step_2/actor/model/model.safetensors" ||
  fail "the swap optimizer's saved weights differ from the plain device run's (they must be bit-identical)"
same_metrics "$W/cuda" "$W/offload" "param_offload and grad_offload against everything on the device"
cmp -s "$W/cuda/global_step_2/actor/model/model.safetensors" "$W/offload/global_step_2/actor/model/model.safetensors" ||
  fail "param_offload/grad_offload changed the saved weights (they must be bit-identical)"
echo "grpo_on_device: OK (2 GRPO steps with trainer.device=cuda equal the CPU run's metrics and weights; the swap optimizer's and param/grad offload's weights equal the device run's bit for bit)"
