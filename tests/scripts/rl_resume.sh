#!/usr/bin/env bash
# kestrel train: a GRPO run killed with SIGKILL mid-update and again while
# writing a checkpoint resumes each time and ends bit-identical (weights,
# optimizer, trainer state, per-step metrics) to an uninterrupted run.
# Tiny random-init model, 6 steps; entropy bonus so every update moves the weights.
# Usage: rl_resume.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1

COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=2 actor_rollout_ref.rollout.n=3
        data.max_response_length=12 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=1 actor_rollout_ref.actor.entropy_coeff=0.01
        actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.optim.lr=1e-3
        trainer.total_training_steps=6 trainer.save_freq=2 trainer.test_freq=3 "trainer.logger=[]")

EXTRA=()
run() {  # run <dir> [crash point]: prints the exit status
  local dir=$1 crash=${2:-}
  set +e
  KESTREL_CRASH_AT=$crash "$KESTREL" train "${COMMON[@]}" "${EXTRA[@]}" trainer.default_local_dir="$dir" >"$W/log.txt" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
pointer() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null | tr -d '\n' || echo none; }
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }
# metrics.jsonl without wall-clock values
det() { sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput)[^"]*":[^,}]*,?//g' "$1/metrics.jsonl"; }

[ "$(run "$W/ref")" = 0 ] || fail "uninterrupted run failed"
[ "$(pointer "$W/ref")" = 6 ] || fail "reference pointer is $(pointer "$W/ref"), want 6"

# 1. Killed inside step 3's update: the step-2 checkpoint stands.
[ "$(run "$W/run" train_step:3)" = 137 ] || fail "expected SIGKILL in step 3"
[ "$(pointer "$W/run")" = 2 ] || fail "after the kill the pointer is $(pointer "$W/run"), want 2"
# 2. Resumes from 2, killed while writing checkpoint 4.
[ "$(run "$W/run" ckpt_files:4)" = 137 ] || fail "expected SIGKILL while writing checkpoint 4"
grep -q 'resumed from .*global_step_2 ' "$W/log.txt" || fail "run 2 did not resume from step 2"
[ "$(pointer "$W/run")" = 2 ] || fail "pointer moved to $(pointer "$W/run") during a killed write"
# 3. Resumes from 2 again and finishes.
[ "$(run "$W/run")" = 0 ] || fail "final resumed run failed"
[ "$(pointer "$W/run")" = 6 ] || fail "final pointer is $(pointer "$W/run"), want 6"

for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors trainer_state.json; do
  cmp "$W/ref/global_step_6/$f" "$W/run/global_step_6/$f" || fail "$f differs from the uninterrupted run"
done
diff <(det "$W/ref") <(det "$W/run") || fail "per-step metrics differ from the uninterrupted run"
echo "rl_resume: GRPO bit-identical after 2 kills"

# PPO with a critic (GAE) and the adaptive in-reward KL: killed mid-update and
# resumed, the actor, the critic (weights and optimizer) and the KL
# controller's coefficient continue bit for bit.
EXTRA=(algorithm.adv_estimator=gae algorithm.lam=0.95 algorithm.use_kl_in_reward=true
       algorithm.kl_ctrl.type=adaptive critic.optim.lr=1e-3 trainer.total_training_steps=4)
[ "$(run "$W/ppo_ref")" = 0 ] || fail "uninterrupted PPO run failed"
[ "$(run "$W/ppo" train_step:3)" = 137 ] || fail "expected SIGKILL in PPO step 3"
[ "$(run "$W/ppo")" = 0 ] || fail "resumed PPO run failed"
grep -q 'resumed from .*global_step_2 ' "$W/log.txt" || fail "the PPO run did not resume from step 2"
for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors critic/model/model.safetensors \
         critic/optimizer_pp0.safetensors trainer_state.json; do
  cmp "$W/ppo_ref/global_step_4/$f" "$W/ppo/global_step_4/$f" || fail "PPO: $f differs from the uninterrupted run"
done
diff <(det "$W/ppo_ref") <(det "$W/ppo") || fail "PPO: per-step metrics differ from the uninterrupted run"
grep -q '"critic/vf_loss"' "$W/ppo/metrics.jsonl" || fail "PPO: no critic metrics"
echo "rl_resume: OK (GRPO and PPO bit-identical after kills)"
