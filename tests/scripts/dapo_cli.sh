#!/usr/bin/env bash
# kestrel train with the DAPO recipe's keys: reward_model.reward_manager=dapo
# with the overlong buffer, data.gen_batch_size and algorithm.filter_groups.*
# (dynamic sampling logs train/num_gen_batches), and the max_num_gen_batches
# error naming the keys when no group varies.
# Usage: dapo_cli.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }

COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=2 data.gen_batch_size=3
        actor_rollout_ref.rollout.n=3 data.max_response_length=12 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=1 reward_model.reward_manager=dapo
        reward_model.overlong_buffer.enable=true reward_model.overlong_buffer.len=8
        reward_model.overlong_buffer.penalty_factor=1.0 algorithm.filter_groups.enable=true
        trainer.total_training_steps=2 trainer.val_before_train=false "trainer.logger=[file]")

# The in-reward KL makes every response's final reward differ: every group is kept.
"$KESTREL" train "${COMMON[@]}" algorithm.filter_groups.metric=seq_final_reward algorithm.use_kl_in_reward=true \
  reward_model.overlong_buffer.log=true trainer.val_before_train=true \
  trainer.default_local_dir="$W/ok" >"$W/log.txt" 2>&1 || fail "DAPO run failed"
grep -q 'reward_manager=dapo' "$W/log.txt" || fail "startup line does not name the reward manager"
grep -q 'overlong buffer 8 of 12 tokens' "$W/log.txt" || fail "startup line does not name the overlong buffer"
[ "$(grep -c '"train/num_gen_batches"' "$W/ok/metrics.jsonl")" = 2 ] || fail "train/num_gen_batches not logged per step"
# Validation reports the reward and the dapo manager's reward_extra_info as verl's val-aux variables.
for k in reward overlong_reward overlong; do
  grep -q "\"val-aux/arith/$k/mean@1\"" "$W/ok/metrics.jsonl" || fail "val-aux/arith/$k/mean@1 missing"
done

# arith's acc is 0 for a random model: no group varies, the bound stops the run with verl's message.
set +e
"$KESTREL" train "${COMMON[@]}" algorithm.filter_groups.metric=acc algorithm.filter_groups.max_num_gen_batches=2 \
  trainer.default_local_dir="$W/bad" >"$W/log.txt" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] || fail "expected the max_num_gen_batches error"
grep -q 'num_gen_batches=2 >= max_num_gen_batches=2. Generated too many' "$W/log.txt" || fail "message missing"
grep -q 'algorithm.filter_groups.max_num_gen_batches' "$W/log.txt" || fail "message does not name the key"

# filter_groups.enable without a metric is refused at startup, naming the key.
set +e
"$KESTREL" train "${COMMON[@]}" trainer.default_local_dir="$W/nometric" >"$W/log.txt" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] && grep -q 'algorithm.filter_groups.metric' "$W/log.txt" || fail "missing metric not refused"
echo "dapo_cli: dynamic sampling, overlong buffer and the max_num_gen_batches error"
