#!/usr/bin/env bash
# Asynchronous RL end to end (rl/async_rollout.h, rl/disaggregated.h), GRPO
# on the tiny model, 4 steps:
#   - bounded staleness (async_training.staleness_threshold=1, one-step off
#     policy) and partial rollout (algorithm.partial_rollout_max_split=3), each
#     and both together (verl's fully-async trainer with partial rollout): no
#     batch trains beyond its bound (fully_async/staleness/max), responses span
#     rounds (fully_async/partial/total_partial_num);
#   - rewards scored in the background as responses finish
#     (reward_model.launch_reward_fn_async), and by several copies of the
#     reward program (reward_model.num_workers): every run above bit for bit;
#   - killed with SIGKILL inside step 3 and resumed: the sample store is part
#     of the checkpoint, so the run ends bit-identical to an uninterrupted one
#     (weights, optimizer, trainer state, the store, per-step metrics): no
#     sample lost or trained twice;
#   - under mpirun, the disaggregated layout (rollout.nnodes x
#     rollout.n_gpus_per_node rollout ranks, 1+1 and 1+2): every weight update
#     reaches the rollout ranks (their checksums match the trainer's) and the
#     run trains exactly the colocated run's batches (1+1: the same bits; 1+2:
#     the rollout ranks split each round, so within 1e-4), validates
#     on the rollout ranks as the colocated run does; killed and resumed under
#     mpirun it ends as the uninterrupted run; a data-parallel trainer of 2
#     ranks with 1 rollout rank matches the single-process run within 1e-4.
# usage: bash tests/scripts/async_rl.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "async_rl: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=12 data.train_max_samples=64 actor_rollout_ref.actor.ppo_mini_batch_size=2
        actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.entropy_coeff=0.01
        actor_rollout_ref.actor.optim.lr=1e-3 trainer.total_training_steps=4 trainer.save_freq=2
        trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[]"
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
STALE=(+async_training.staleness_threshold=1)
PARTIAL=(+algorithm.partial_rollout_max_split=3)
run() {  # run <dir> <crash point or ""> <overrides...>: prints the exit status
  local dir=$1 crash=$2
  shift 2
  set +e
  KESTREL_CRASH_AT=$crash "$KESTREL" train "${COMMON[@]}" "$@" trainer.default_local_dir="$dir" >"$W/log.txt" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
pointer() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null | tr -d '\n' || echo none; }
# metrics.jsonl without wall-clock values (and the disaggregated trainer's waiting)
det() {
  sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput|perf\/reshard_bytes|fully_async\/trainer|trainer\/idle_ratio|reward\/streamed_fraction)[^"]*":[^,}]*,?//g' \
    "$1/metrics.jsonl"
}
metric_column() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
same_run() {  # same_run <ref> <run> <what>: final checkpoint files and per-step metrics identical
  for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors trainer_state.json sample_store.json; do
    cmp -s "$1/global_step_4/$f" "$2/global_step_4/$f" || fail "$3: $f differs from $1's"
  done
  diff <(det "$1") <(det "$2") >/dev/null || fail "$3: per-step metrics differ from $1's"
}

# 1. Staleness 1 and partial rollout, colocated: the bounds and the metrics.
[ "$(run "$W/stale" "" "${STALE[@]}")" = 0 ] || fail "staleness 1"
[ "$(metric_column "$W/stale" fully_async/staleness/max)" = "0.0 1.0 1.0 1.0 " ] ||
  fail "staleness 1: max staleness per step $(metric_column "$W/stale" fully_async/staleness/max), want 0 1 1 1"
[ "$(run "$W/partial" "" "${PARTIAL[@]}")" = 0 ] || fail "partial rollout"
for s in $(metric_column "$W/partial" fully_async/staleness/max); do
  awk -v s="$s" 'BEGIN { exit !(s <= 2) }' || fail "partial rollout: a batch trained $s versions late (bound 2)"
done
partial=$(metric_column "$W/partial" fully_async/partial/total_partial_num | awk '{ for (i = 1; i <= NF; i++) t += $i; print t }')
awk -v p="$partial" 'BEGIN { exit !(p > 0) }' || fail "partial rollout: no response spanned rounds"
# Both: a group may train ceil(1) + 3 - 1 = 3 versions after its first token; after the first step each
# batch was finished by the previous step's rounds, so some train off-policy.
[ "$(run "$W/both" "" "${STALE[@]}" "${PARTIAL[@]}" +async_training.partial_rollout=true)" = 0 ] ||
  fail "staleness 1 with partial rollout"
stale_both=$(metric_column "$W/both" fully_async/staleness/max)
for s in $stale_both; do
  awk -v s="$s" 'BEGIN { exit !(s <= 3) }' || fail "staleness 1 with partial rollout: a batch trained $s versions late (bound 3)"
done
[[ "$stale_both" == "0.0 "* && "$stale_both" =~ [123]\.0 ]] ||
  fail "staleness 1 with partial rollout: max staleness per step '$stale_both', want 0 first, then some >= 1"
partial=$(metric_column "$W/both" fully_async/partial/total_partial_num | awk '{ for (i = 1; i <= NF; i++) t += $i; print t }')
awk -v p="$partial" 'BEGIN { exit !(p > 0) }' || fail "staleness 1 with partial rollout: no response spanned rounds"
# The sample store changes nothing: the built-in job's first 3 steps (make demo's settings, with the tiny
# model instead of its SFT warm start, which takes minutes to make) through the store and generated directly,
# as the trainer did before the store (KESTREL_TEST_DIRECT_ROLLOUT, test only), are the same bits (metrics,
# weights, optimizer).
DEMO=(actor_rollout_ref.model.path=builtin:tiny trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1 trainer.val_before_train=false
      data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=4)
demo() {  # demo <dir> <direct: 0|1>
  KESTREL_TEST_DIRECT_ROLLOUT=$2 "$KESTREL" train "${DEMO[@]}" trainer.default_local_dir="$1" >"$W/log.txt" 2>&1 ||
    fail "the built-in job (direct=$2)"
}
demo "$W/demo-store" 0
demo "$W/demo-direct" 1
for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors; do
  cmp -s "$W/demo-store/global_step_3/$f" "$W/demo-direct/global_step_3/$f" || fail "built-in job: $f differs"
done
diff <(det "$W/demo-store") <(det "$W/demo-direct") >/dev/null || fail "built-in job: metrics differ with the store"
[ "$(run "$W/sync" "")" = 0 ] || fail "synchronous"
echo "async_rl: staleness and partial-rollout bounds hold; the store is the synchronous trainer"
# Rewards scored on a background thread from the moment each response finishes
# (reward_model.launch_reward_fn_async): the same runs bit for bit, and every
# response of the per-response reward program was handed over as it finished
# (reward/streamed_fraction 1); prime's batch-wise scores are one call per batch (0).
ARW=(reward_model.launch_reward_fn_async=true)
streamed() {  # streamed <dir> <want>: reward/streamed_fraction of every step
  local got
  got=$(metric_column "$1" reward/streamed_fraction)
  [ "$got" = "$2 $2 $2 $2 " ] || fail "$1: reward/streamed_fraction per step '$got', want $2 each"
}
for mode in sync stale partial; do
  case $mode in sync) extra=() ;; stale) extra=("${STALE[@]}") ;; partial) extra=("${PARTIAL[@]}") ;; esac
  [ "$(run "$W/$mode-arw" "" "${extra[@]}" "${ARW[@]}")" = 0 ] || fail "$mode with launch_reward_fn_async"
  same_run "$W/$mode" "$W/$mode-arw" "$mode with launch_reward_fn_async"
  streamed "$W/$mode-arw" 1.0
done
# Parallel reward programs (reward_model.num_workers): the batch's shares, or the streamed responses, scored by
# several copies of the program at once: the same runs bit for bit.
[ "$(run "$W/sync-w3" "" reward_model.num_workers=3)" = 0 ] || fail "num_workers=3"
same_run "$W/sync" "$W/sync-w3" "reward_model.num_workers=3"
[ "$(run "$W/stale-w2" "" "${STALE[@]}" "${ARW[@]}" reward_model.num_workers=2)" = 0 ] ||
  fail "num_workers=2 with launch_reward_fn_async"
same_run "$W/stale" "$W/stale-w2" "reward_model.num_workers=2 with launch_reward_fn_async"
[ "$(run "$W/prime" "" reward_model.reward_manager=prime)" = 0 ] || fail "prime manager"
[ "$(run "$W/prime-arw" "" reward_model.reward_manager=prime "${ARW[@]}")" = 0 ] || fail "prime, async reward"
same_run "$W/prime" "$W/prime-arw" "prime manager with launch_reward_fn_async"
streamed "$W/prime-arw" 0.0
KESTREL_TEST_DIRECT_ROLLOUT=0 "$KESTREL" train "${DEMO[@]}" "${ARW[@]}" trainer.default_local_dir="$W/demo-arw" \
  >"$W/log.txt" 2>&1 || fail "the built-in job with launch_reward_fn_async"
for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors; do
  cmp -s "$W/demo-store/global_step_3/$f" "$W/demo-arw/global_step_3/$f" || fail "built-in job, async reward: $f differs"
done
diff <(det "$W/demo-store") <(det "$W/demo-arw") >/dev/null || fail "built-in job: metrics differ with async rewards"
echo "async_rl: rewards scored as responses finish equal the synchronous ones"
# The rollout's log-probs as the old ones (verl's fully-async default): trains, no old-log-prob pass.
[ "$(run "$W/rlogp" "" "${STALE[@]}" +async_training.use_rollout_log_probs=true \
      actor_rollout_ref.rollout.calculate_log_probs=true)" = 0 ] || fail "use_rollout_log_probs"
refuse() {  # refuse <message> <overrides...>: the run stops at start-up with the message
  local msg=$1
  shift
  [ "$(run "$W/refused" "" "$@")" != 0 ] || fail "accepted: $*"
  grep -qF "$msg" "$W/log.txt" || fail "refusal of '$*' lacks: $msg"
}
refuse "async_training.partial_rollout=true: Kestrel's partial rollout runs in rounds" +async_training.partial_rollout=true
refuse "async_training.trigger_parameter_sync_step" +async_training.trigger_parameter_sync_step=4
refuse "use_rollout_log_probs=true trains with the rollout's log-probs: set actor_rollout_ref.rollout.calculate_log_probs=true" \
  +async_training.use_rollout_log_probs=true
refuse "not supported yet: reward_model.launch_reward_fn_async=true with algorithm.filter_groups.enable" \
  "${ARW[@]}" algorithm.filter_groups.enable=true algorithm.filter_groups.metric=score data.gen_batch_size=4
refuse "stream_log_probs=true scores log-probs while the rollout ranks generate: it needs rollout ranks" \
  +async_training.stream_log_probs=true
refuse "set both (disaggregated rollout ranks) or neither" +rollout.nnodes=1
refuse "actor_rollout_ref.hybrid_engine=false puts the rollout on its own processes" actor_rollout_ref.hybrid_engine=false
refuse "no trainer among the 1 processes" +rollout.nnodes=1 +rollout.n_gpus_per_node=1

# 2. SIGKILL inside step 3, resumed: identical to the uninterrupted run.
for mode in stale partial both; do
  case $mode in stale) extra=("${STALE[@]}") ;; partial) extra=("${PARTIAL[@]}") ;; both) extra=("${STALE[@]}" "${PARTIAL[@]}") ;; esac
  [ "$(run "$W/$mode-k" train_step:3 "${extra[@]}")" = 137 ] || fail "$mode: expected SIGKILL in step 3"
  [ "$(pointer "$W/$mode-k")" = 2 ] || fail "$mode: pointer $(pointer "$W/$mode-k") after the kill, want 2"
  [ "$(run "$W/$mode-k" "" "${extra[@]}")" = 0 ] || fail "$mode: resumed run failed"
  grep -q 'resumed from .*global_step_2 ' "$W/log.txt" || fail "$mode: did not resume from step 2"
  same_run "$W/$mode" "$W/$mode-k" "$mode killed and resumed"
done
echo "async_rl: killed and resumed, staleness and partial rollout (each and both) continue bit for bit"

# 3. Disaggregated rollout ranks under mpirun.
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env async_rl "$BUILD"  # without MPI: the colocated parts passed, the rest is skipped
mrun() {  # mrun <np> <dir> <crash point or ""> <overrides...>: prints the exit status
  local np=$1 dir=$2 crash=$3
  shift 3
  set +e
  KESTREL_CRASH_AT=$crash timeout -k 5 300 mpirun -np "$np" --oversubscribe --bind-to none -x KESTREL_CRASH_AT \
    "$KESTREL" train "${COMMON[@]}" "$@" trainer.default_local_dir="$dir" >"$W/log.txt" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
DIS1=(+rollout.nnodes=1 +rollout.n_gpus_per_node=1)
DIS2=(+rollout.nnodes=1 +rollout.n_gpus_per_node=2)
[ "$(mrun 2 "$W/dis-stale" "" "${STALE[@]}" "${DIS1[@]}")" = 0 ] || fail "disaggregated 1+1, staleness 1"
grep -q 'disaggregated rollout: 4 weight updates received by 1 rollout rank(s), the last one.s checksum [0-9]* matching' \
  "$W/log.txt" || fail "disaggregated 1+1: the weight-update report is missing"
same_run "$W/stale" "$W/dis-stale" "disaggregated 1+1, staleness 1"
# The rollout leader sends each response it finishes; the trainer scores it while the rollout goes on.
[ "$(mrun 2 "$W/dis-arw" "" "${STALE[@]}" "${DIS1[@]}" "${ARW[@]}")" = 0 ] || fail "disaggregated, async reward"
same_run "$W/stale" "$W/dis-arw" "disaggregated 1+1, staleness 1, launch_reward_fn_async"
streamed "$W/dis-arw" 1.0
grep -q '"trainer/idle_ratio"' "$W/dis-stale/metrics.jsonl" || fail "disaggregated: no trainer/idle_ratio"
[ "$(mrun 2 "$W/dis-both" "" "${STALE[@]}" "${PARTIAL[@]}" "${DIS1[@]}")" = 0 ] ||
  fail "disaggregated 1+1, staleness 1 with partial rollout"
same_run "$W/both" "$W/dis-both" "disaggregated 1+1, staleness 1 with partial rollout"
[ "$(mrun 3 "$W/dis2-partial" "" "${PARTIAL[@]}" "${DIS2[@]}")" = 0 ] || fail "disaggregated 1+2, partial rollout"
grep -q 'received by 2 rollout rank(s)' "$W/log.txt" || fail "disaggregated 1+2: the weight-update report is missing"
# Two rollout ranks each generate a share of a round's requests: other GEMM row counts, so the rollout
# log-probs round differently (OpenBLAS's kernels): the metrics within 1e-4, not the same bits.
source "$(dirname "$0")/lib/compare_runs.sh"
KEYS='actor/pg_loss actor/kl_loss actor/entropy actor/grad_norm critic/score/mean response_length/mean val-core/arith/acc/mean@1 fully_async/partial/total_partial_num'
same_metrics "$W/partial" "$W/dis2-partial" "disaggregated 1+2, partial rollout"
[ "$(mrun 2 "$W/dis-sync" "" "${DIS1[@]}")" = 0 ] || fail "disaggregated 1+1, synchronous"
same_run "$W/sync" "$W/dis-sync" "disaggregated 1+1, synchronous"
# Log-probs scored on the trainer as each group comes in (async_training.stream_log_probs): the reference
# ones, and at staleness 0 without partial rollout the old ones (two mini-batches here need them). Every group
# is streamed with one rollout rank (with two, what the leader does not see finish would be scored when the
# batch comes). Each group is its own micro-batch: the metrics within 1e-4 of the batch pass's.
REF=(+async_training.stream_log_probs=true)
[ "$(mrun 2 "$W/dis-ref" "" "${DIS1[@]}" "${REF[@]}")" = 0 ] || fail "disaggregated 1+1, streamed log-probs"
for k in ref/streamed_fraction old_log_prob/streamed_fraction; do
  [ "$(metric_column "$W/dis-ref" $k)" = "1.0 1.0 1.0 1.0 " ] ||
    fail "streamed log-probs: $k per step '$(metric_column "$W/dis-ref" $k)', want 1 each"
done
same_metrics "$W/sync" "$W/dis-ref" "disaggregated 1+1, streamed log-probs"
[ "$(mrun 3 "$W/dis2-ref" "" "${PARTIAL[@]}" "${DIS2[@]}" "${REF[@]}")" = 0 ] ||
  fail "disaggregated 1+2, partial rollout, streamed log-probs"
for f in $(metric_column "$W/dis2-ref" ref/streamed_fraction); do
  awk -v f="$f" 'BEGIN { exit !(f > 0) }' || fail "1+2 streamed ref log-probs: fraction $f, want some streamed"
done
! grep -q '"old_log_prob/streamed_fraction"' "$W/dis2-ref/metrics.jsonl" ||
  fail "old log-probs streamed under partial rollout (a continued response's versions differ)"
same_metrics "$W/partial" "$W/dis2-ref" "disaggregated 1+2, partial rollout, streamed log-probs"
[ "$(mrun 2 "$W/bad-ref" "" "${DIS1[@]}" "${REF[@]}" actor_rollout_ref.actor.use_kl_loss=false \
      actor_rollout_ref.actor.ppo_mini_batch_size=4)" != 0 ] || fail "streamed log-probs with nothing to stream accepted"
grep -q 'stream_log_probs=true: this run scores neither reference log-probs' "$W/log.txt" || fail "the nothing-to-stream refusal"
# Killed under mpirun inside step 3 and resumed.
rc=$(mrun 2 "$W/dis-k" train_step:3 "${STALE[@]}" "${DIS1[@]}")
[ "$rc" != 0 ] || fail "disaggregated: expected the kill in step 3"
[ "$(pointer "$W/dis-k")" = 2 ] || fail "disaggregated: pointer $(pointer "$W/dis-k") after the kill, want 2"
[ "$(mrun 2 "$W/dis-k" "" "${STALE[@]}" "${DIS1[@]}")" = 0 ] || fail "disaggregated: resumed run failed"
grep -q 'resumed from .*global_step_2 ' "$W/log.txt" || fail "disaggregated: did not resume from step 2"
same_run "$W/stale" "$W/dis-k" "disaggregated killed and resumed"
# Validation on the rollout ranks (before training, every 2 steps): as the colocated run's.
VAL=(trainer.test_freq=2 trainer.val_before_train=true data.val_max_samples=16)
[ "$(run "$W/val" "" "${STALE[@]}" "${VAL[@]}")" = 0 ] || fail "colocated with validation"
[ "$(mrun 2 "$W/dis-val" "" "${STALE[@]}" "${VAL[@]}" "${DIS1[@]}")" = 0 ] || fail "disaggregated with validation"
grep -q '"val-core/' "$W/dis-val/metrics.jsonl" || fail "disaggregated: no validation metrics"
same_run "$W/val" "$W/dis-val" "disaggregated 1+1 with validation"
# A data-parallel trainer of 2 ranks and 1 rollout rank: the colocated single-process run's metrics (dp sums
# round differently: within compare_runs.sh's 1e-4), validation included.
[ "$(mrun 3 "$W/dis-dp2" "" "${STALE[@]}" "${VAL[@]}" "${DIS1[@]}")" = 0 ] || fail "disaggregated 2+1"
grep -q 'received by 1 rollout rank(s)' "$W/log.txt" || fail "disaggregated 2+1: the weight-update report is missing"
same_metrics "$W/val" "$W/dis-dp2" "disaggregated 2+1 (dp2 trainer)"
# Refusals name their keys.
[ "$(mrun 2 "$W/bad" "" "${DIS1[@]}" trainer.val_only=true)" != 0 ] || fail "val_only with rollout ranks accepted"
grep -q 'not supported yet: trainer.val_only with rollout.nnodes' "$W/log.txt" || fail "the val_only refusal"
[ "$(mrun 3 "$W/bad2" "" "${DIS1[@]}" actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2)" != 0 ] ||
  fail "a tp2 trainer with rollout ranks accepted"
grep -q 'not supported yet: a disaggregated trainer with tensor' "$W/log.txt" || fail "the tp2-trainer refusal"
[ "$(mrun 2 "$W/bad3" "" "${DIS1[@]}" actor_rollout_ref.rollout.tensor_model_parallel_size=2)" != 0 ] ||
  fail "rollout tp2 on rollout ranks accepted"
grep -q 'tensor_model_parallel_size=2 on disaggregated rollout ranks' "$W/log.txt" || fail "the rollout-tp refusal"
echo "async_rl: passed (colocated, killed and resumed, disaggregated 1+1 and 1+2 equal the colocated runs)"
