#!/usr/bin/env bash
# Rank death and hangs under mpirun (issue 20 item 5). Every other rank must
# exit within 60 s with a message naming the lost rank and the step, and no
# half-written checkpoint may become the latest.
#  1. A rank that stops (SIGSTOP) inside a collective test: the collective
#     timeout (comm/mpi/health.h) names world rank 1 and the step.
#  2. `kestrel train` as DP2 with actor_rollout_ref.nccl_timeout=8: rank 1's
#     process is stopped mid-run; rank 0 reports rank 1 and the step.
#  3. The same run with rank 1 SIGKILLed: mpirun names the rank, rank 0's
#     termination notice names the step; the checkpoint pointer still names a
#     complete checkpoint.
# usage: bash tests/scripts/mpi_rank_death.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_rank_death "$BUILD"
W=$(mktemp -d)
cleanup() { pkill -KILL -f "$W/" 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_rank_death: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -40 "$W/log.txt" >&2; exit 1; }

# ---- 1: the collective timeout in isolation ------------------------------------------------
export KESTREL_HANG_DEMO=1
start=$SECONDS
timeout -k 5 90 mpirun -np 2 --oversubscribe --bind-to none "$BUILD/mpi_tests" --gtest_filter='HangDemo.*' \
  --gtest_color=no >"$W/log.txt" 2>&1
rc=$?
unset KESTREL_HANG_DEMO
elapsed=$((SECONDS - start))
[[ $rc -ne 124 && $rc -ne 137 ]] || fail "hang demo: the job did not end within 90 s"
[[ $rc -ne 0 ]] || fail "hang demo: mpirun exited 0"
((elapsed <= 60)) || fail "hang demo: took ${elapsed}s (> 60)"
grep -q "kestrel: rank 0: MPI_Allreduce on group 'world' (rank 0 of 2) did not complete within" "$W/log.txt" ||
  fail "hang demo: rank 0's timeout report is missing"
grep -q "world rank 1 did not answer" "$W/log.txt" || fail "hang demo: the report does not name rank 1"
grep -q "at step 7 (update_actor)" "$W/log.txt" || fail "hang demo: the report does not name the step"
echo "mpi_rank_death: stopped rank named by the collective timeout after ${elapsed}s"

# ---- 2 and 3: a real training run ----------------------------------------------------------
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 trainer.test_freq=-1 "trainer.logger=[]"
        trainer.total_training_steps=400 trainer.save_freq=1 actor_rollout_ref.nccl_timeout=8
        'reward_model.reward_command=while read -r l; do expr length "$l" % 3; done')
# Starts the run in the background, waits until step 2's checkpoint exists,
# then applies `signal` to rank 1's process. Prints the elapsed seconds from
# the signal to the job's end.
run_and_hit() {  # run_and_hit <signal> <ckpt-dir>
  local sig=$1 ck=$2
  timeout -k 5 240 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" \
    trainer.default_local_dir="$ck" >"$W/log.txt" 2>&1 &
  local job=$! t=0
  until [[ -f "$ck/latest_checkpointed_iteration.txt" ]] && (( $(cat "$ck/latest_checkpointed_iteration.txt") >= 2 )); do
    sleep 0.5; t=$((t + 1))
    ((t < 400)) || { kill -KILL $job; fail "$sig: no checkpoint of step 2 after 200 s"; }
    kill -0 $job 2>/dev/null || fail "$sig: the run ended before step 2"
  done
  local pid
  pid=$(pgrep -f "kestrel train .*$ck" | while read -r p; do
          [[ "$(tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -c '^OMPI_COMM_WORLD_RANK=1$')" == 1 ]] && echo "$p"
        done | head -n 1)
  [[ -n "$pid" ]] || { kill -KILL $job; fail "$sig: rank 1's process not found"; }
  local s0=$SECONDS
  kill -"$sig" "$pid"
  wait $job
  local rc=$?
  # 124: `timeout` stopped it (a hang). mpirun itself returns 137 when a rank was SIGKILLed.
  [[ $rc -ne 124 ]] || fail "$sig: the job did not end within 240 s: a rank hung"
  [[ $rc -ne 0 ]] || fail "$sig: mpirun exited 0 after rank 1 was hit"
  echo $((SECONDS - s0))
}
latest_is_complete() {  # the pointer names a folder that holds a complete checkpoint
  local ck=$1 n
  n=$(cat "$ck/latest_checkpointed_iteration.txt")
  [[ -d "$ck/global_step_$n/actor" ]] || fail "the pointer names step $n, which has no actor checkpoint"
  "$KESTREL" logprobs --model "$ck/global_step_$n/actor/model" --input <(echo '{"input_ids": [1, 5, 9]}') \
    --output "$W/lp.jsonl" >/dev/null 2>&1 || fail "the latest checkpoint (step $n) does not load"
}

secs=$(run_and_hit STOP "$W/ck_stop") || exit 1
((secs <= 60)) || fail "STOP: the job took ${secs}s to end after rank 1 stopped (> 60)"
grep -q "did not complete within" "$W/log.txt" || fail "STOP: no collective-timeout report"
grep -q "world rank 1 did not answer" "$W/log.txt" || fail "STOP: the report does not name rank 1"
grep -Eq "did not complete within [0-9]+ s \(collective timeout actor_rollout_ref.nccl_timeout=8\), at step [0-9]+" \
  "$W/log.txt" || fail "STOP: the report does not name the step"
latest_is_complete "$W/ck_stop"
echo "mpi_rank_death: stopped rank 1 reported after ${secs}s: $(grep -o 'at step [0-9]* ([a-z_]*)' "$W/log.txt" | head -1)"

secs=$(run_and_hit KILL "$W/ck_kill") || exit 1
((secs <= 60)) || fail "KILL: the job took ${secs}s to end after rank 1 died (> 60)"
grep -Eq "rank 1 .*(exited on signal 9|Killed)|process rank 1" "$W/log.txt" || fail "KILL: the launcher did not name rank 1"
grep -Eq "kestrel: rank 0: (terminated by the launcher at step [0-9]+|.*world rank 1 did not answer)" "$W/log.txt" ||
  fail "KILL: rank 0 did not say at which step it was stopped"
latest_is_complete "$W/ck_kill"
echo "mpi_rank_death: killed rank 1: job ended after ${secs}s; latest checkpoint complete"
echo "mpi_rank_death: passed"
