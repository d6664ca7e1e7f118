#!/usr/bin/env bash
# kestrel sft: a run killed with SIGKILL mid-step, mid-checkpoint-write and
# between the checkpoint rename and the pointer update resumes each time and
# ends with weights bit-identical to an uninterrupted run.
# Usage: sft_resume.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

COMMON=(model.partial_pretrain=builtin:tiny data.arith.num_train=96 data.arith.num_test=8
        data.train_batch_size=16 data.max_token_len_per_gpu=1024 trainer.total_training_steps=10
        trainer.save_freq=3 optim.lr=2e-3 trainer.threads=1 data.val_files=null "trainer.logger=[file]")

run() {  # run <dir> [crash point]: returns the exit status
  local dir=$1 crash=${2:-}
  set +e
  KESTREL_CRASH_AT=$crash "$KESTREL" sft "${COMMON[@]}" trainer.default_local_dir="$dir" \
    trainer.export_dir="$dir/final" >"$W/log.txt" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
pointer() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null | tr -d '\n' || echo none; }
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }

[ "$(run "$W/ref")" = 0 ] || fail "uninterrupted run failed"
[ "$(pointer "$W/ref")" = 10 ] || fail "reference pointer is $(pointer "$W/ref"), want 10"

# 1. Killed inside step 5 (after its first micro-batch): the step-3 checkpoint stands.
[ "$(run "$W/run" train_step:5)" = 137 ] || fail "expected SIGKILL in step 5"
[ "$(pointer "$W/run")" = 3 ] || fail "after the step-5 kill the pointer is $(pointer "$W/run"), want 3"
# 2. Resumes from 3, killed while writing checkpoint 6: a partial temp folder, pointer still 3.
[ "$(run "$W/run" ckpt_files:6)" = 137 ] || fail "expected SIGKILL while writing checkpoint 6"
ls -a "$W/run" | grep -q '^\.tmp\.global_step_6\.' || fail "no partial temp folder left by the kill"
[ ! -e "$W/run/global_step_6" ] || fail "global_step_6 exists although its write was killed"
[ "$(pointer "$W/run")" = 3 ] || fail "pointer moved to $(pointer "$W/run") during a killed write"
# 3. Resumes from 3 (temp folder ignored), killed after renaming checkpoint 9, before the pointer.
[ "$(run "$W/run" ckpt_pointer:9)" = 137 ] || fail "expected SIGKILL before the step-9 pointer update"
grep -q 'resumed from .*global_step_3 ' "$W/log.txt" || fail "run 3 did not resume from step 3"
[ -d "$W/run/global_step_9" ] || fail "global_step_9 should have been renamed into place"
[ "$(pointer "$W/run")" = 6 ] || fail "pointer is $(pointer "$W/run"), want 6"
ls -a "$W/run" | grep -q '^\.tmp\.' && fail "stale temp folder not cleaned"
# 4. Resumes from 6 and finishes.
[ "$(run "$W/run")" = 0 ] || fail "final resumed run failed"
grep -q 'resumed from .*global_step_6 ' "$W/log.txt" || fail "run 4 did not resume from step 6"
[ "$(pointer "$W/run")" = 10 ] || fail "final pointer is $(pointer "$W/run"), want 10"

cmp "$W/ref/final/model.safetensors" "$W/run/final/model.safetensors" || fail "exported weights differ"
cmp "$W/ref/global_step_10/optimizer_pp0.safetensors" "$W/run/global_step_10/optimizer_pp0.safetensors" \
  || fail "optimizer state differs"
cmp "$W/ref/global_step_10/trainer_state.json" "$W/run/global_step_10/trainer_state.json" \
  || fail "trainer state differs"
# The metrics of a resumed run continue the file without duplicate steps.
[ "$(grep -c '"step"' "$W/run/metrics.jsonl")" = 10 ] || fail "metrics.jsonl should hold 10 steps"
for f in config.json tokenizer.json tokenizer_config.json model.safetensors; do
  [ -f "$W/run/final/$f" ] || fail "export lacks $f"
done
echo "sft_resume: OK (bit-identical after 3 kills)"
