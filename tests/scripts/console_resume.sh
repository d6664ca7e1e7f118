#!/usr/bin/env bash
# Console at a run's edges (issue 20 item 8): re-running a finished run in its
# checkpoint folder says the checkpoint is the final step and there is nothing
# to do (exit 0); Ctrl-C (SIGINT) stops after the current step with
# "interrupted at step N; run the same command to resume" and exit status 130,
# and the same command then resumes. For kestrel sft and kestrel train.
# Usage: console_resume.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=$1
W=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill -9 "$PID" 2>/dev/null; rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }

SFT=(sft model.partial_pretrain=builtin:tiny data.arith.num_train=64 data.arith.num_test=4 data.train_batch_size=8
     data.max_token_len_per_gpu=512 trainer.threads=1 data.val_files=null "trainer.logger=[]" trainer.save_freq=1)
RL=(train actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=2 actor_rollout_ref.rollout.n=2
    data.max_response_length=8 data.val_max_samples=2 data.train_max_samples=64
    actor_rollout_ref.actor.ppo_mini_batch_size=1 trainer.test_freq=-1 "trainer.logger=[]" trainer.save_freq=1)

for job in sft rl; do
  if [ $job = sft ]; then CMD=("${SFT[@]}"); else CMD=("${RL[@]}"); fi
  D=$W/$job
  # 1. A finished run, run again: resumes at its final step and says so.
  "$KESTREL" "${CMD[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$D/done" >"$W/log.txt" 2>&1 ||
    fail "$job: first run failed"
  "$KESTREL" "${CMD[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$D/done" >"$W/log.txt" 2>&1
  rc=$?
  [ $rc = 0 ] || fail "$job: re-run of a finished run exited $rc"
  grep -q "checkpoint at step 2 (.*global_step_2) is the final step of this run (trainer.total_training_steps=2); nothing to do: set trainer.total_training_steps higher or use a new trainer.default_local_dir" "$W/log.txt" ||
    fail "$job: re-run of a finished run did not say there is nothing to do"

  # 2. Ctrl-C after the first checkpoint: stops after the current step, exit 130.
  # A background job of a non-interactive shell starts with SIGINT ignored (and
  # kestrel, like any program, keeps an ignored SIGINT ignored): reset it.
  env --default-signal=INT "$KESTREL" "${CMD[@]}" trainer.total_training_steps=1000 \
    trainer.default_local_dir="$D/int" >"$W/log.txt" 2>&1 &
  PID=$!
  for _ in $(seq 1 600); do
    [ -f "$D/int/latest_checkpointed_iteration.txt" ] && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  [ -f "$D/int/latest_checkpointed_iteration.txt" ] || fail "$job: no checkpoint to interrupt after"
  kill -INT "$PID"
  wait "$PID"
  rc=$?
  PID=
  [ $rc = 130 ] || fail "$job: Ctrl-C exited $rc, want 130"
  grep -Eq "interrupted at step [0-9]+; run the same command to resume \(it continues from .*global_step_[0-9]+\)" \
    "$W/log.txt" || fail "$job: no 'interrupted at step N; run the same command to resume' line"
  step=$(grep -Eo 'interrupted at step [0-9]+' "$W/log.txt" | grep -Eo '[0-9]+$')
  [ "$step" -ge 1 ] && [ "$step" -lt 1000 ] || fail "$job: interrupted at step '$step'"
  # The same command resumes (here with a total just past it, so it ends soon).
  "$KESTREL" "${CMD[@]}" trainer.total_training_steps=$((step + 1)) trainer.default_local_dir="$D/int" \
    >"$W/log.txt" 2>&1 || fail "$job: resume after Ctrl-C failed"
  grep -q "resumed from .*global_step_$step " "$W/log.txt" || fail "$job: did not resume from step $step"
  [ "$(cat "$D/int/latest_checkpointed_iteration.txt")" = $((step + 1)) ] || fail "$job: resume did not finish"
done
echo "console_resume: ok"
