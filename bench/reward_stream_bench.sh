#!/usr/bin/env bash
# Rewards scored in the background as responses finish
# (reward_model.launch_reward_fn_async, rl/reward_stream.h) against the
# synchronous trainer, with an external reward program that takes a fixed
# time per response (a stand-in for a sandbox or a verifier: a Python
# program that sleeps, then scores the answer's length mod 3), GRPO on the
# built-in arith task, 8 prompts x 8 responses per step (MODEL, default
# builtin:arith-sft: the demo's warm start, whose responses end at EOS with a
# spread of lengths; builtin:tiny runs every response to the length limit, so
# none finishes early). One run each, the same steps and seeds: the scores and
# the weights are the same bits either way; only the time differs.
# The modes: sync, async, and both with WORKERS (default 4) copies of the
# reward program (reward_model.num_workers): sync-wN scores a batch's shares
# at once, async-wN runs N background scorers.
# Prints per mode: the mean step time, the mean generation time and reward wait
# (timing_s/gen, timing_s/reward), the share of responses handed over as they
# finished, and the speed-up. Needs python3 (for the reward program only).
# usage: [WORKERS=4] bash bench/reward_stream_bench.sh [kestrel-binary (build/release/kestrel)] [steps (10)] [ms per response (5)]
set -euo pipefail
KESTREL=${1:-build/release/kestrel}
STEPS=${2:-10}
MS=${3:-5}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
MODEL=${MODEL:-builtin:arith-sft}
WORKERS=${WORKERS:-4}
COMMON=(actor_rollout_ref.model.path="$MODEL" data.train_batch_size=8 actor_rollout_ref.rollout.n=8
        actor_rollout_ref.actor.ppo_mini_batch_size=4 trainer.total_training_steps="$STEPS" trainer.test_freq=-1
        trainer.val_before_train=false trainer.save_freq=-1 "trainer.logger=[file]" trainer.resume_mode=disable
        "reward_model.reward_command=python3 $W/reward.py")
cat >"$W/reward.py" <<PY
import json, sys, time
for line in sys.stdin:
    time.sleep($MS / 1000)
    print(len(json.loads(line)["solution_str"]) % 3, flush=True)
PY
column() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
mean() { column "$1" "$2" | awk '{ s += $1; n++ } END { printf "%.3f", n ? s / n : 0 }'; }
echo "$(lscpu | sed -n 's/^Model name: *//p'), OMP_NUM_THREADS=$OMP_NUM_THREADS, reward program ${MS} ms per response, $STEPS steps"
printf "%-8s %8s %8s %14s %10s %8s\n" mode "step s" "gen s" "reward wait s" streamed speedup
base=
for mode in sync async "sync-w$WORKERS" "async-w$WORKERS"; do
  extra=()
  [[ $mode == async* ]] && extra+=(reward_model.launch_reward_fn_async=true)
  [[ $mode == *-w* ]] && extra+=(reward_model.num_workers="$WORKERS")
  "$KESTREL" train "${COMMON[@]}" "${extra[@]}" trainer.default_local_dir="$W/$mode" >"$W/$mode.log" 2>&1 ||
    { tail -20 "$W/$mode.log"; exit 1; }
  step=$(mean "$W/$mode" timing_s/step)
  [[ -z $base ]] && base=$step
  printf "%-8s %8s %8s %14s %10s %7.2fx\n" "$mode" "$step" "$(mean "$W/$mode" timing_s/gen)" "$(mean "$W/$mode" timing_s/reward)" \
    "$(mean "$W/$mode" reward/streamed_fraction)" "$(awk -v a="$base" -v b="$step" 'BEGIN { print a / b }')"
done
same=1
for mode in async "sync-w$WORKERS" "async-w$WORKERS"; do
  cmp -s <(column "$W/sync" critic/score/mean) <(column "$W/$mode" critic/score/mean) || same=0
done
[[ $same == 1 ]] && echo "scores per step: the same in every run" || echo "scores per step DIFFER"
