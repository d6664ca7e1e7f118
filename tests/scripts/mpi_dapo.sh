#!/usr/bin/env bash
# DAPO dynamic sampling under mpirun -np 2 (DP2) equals one process: the
# filter metric is computed on world rank 0 and broadcast, so both ranks keep
# the same groups; the per-step metrics (train/num_gen_batches, scores,
# lengths) match the single-process run.
# usage: bash tests/scripts/mpi_dapo.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_dapo "$BUILD"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_dapo: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

# The reward program scores a response by the parity of its request line's length:
# some groups vary, some do not. reward_manager=dapo logs a float result as acc.
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 data.gen_batch_size=4
        actor_rollout_ref.rollout.n=2 data.max_response_length=8 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.optim.lr=1e-3
        trainer.total_training_steps=2 trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[file]"
        trainer.resume_mode=disable reward_model.reward_manager=dapo algorithm.filter_groups.enable=true
        algorithm.filter_groups.metric=acc algorithm.filter_groups.max_num_gen_batches=20
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 2; done')
"$KESTREL" train "${COMMON[@]}" trainer.default_local_dir="$W/single" >"$W/log.txt" 2>&1 || fail "single process"
timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" \
  trainer.default_local_dir="$W/dp2" >"$W/log.txt" 2>&1 || fail "mpirun -np 2"
pick() { tr ',' '\n' <"$1/metrics.jsonl" | grep -E '"(train/num_gen_batches|critic/score/mean|response_length/mean|step)"'; }
[ -n "$(pick "$W/single" | grep num_gen_batches)" ] || fail "no train/num_gen_batches in the metrics"
diff <(pick "$W/single") <(pick "$W/dp2") || fail "DP2 kept other groups than one process"
echo "mpi_dapo: DP2 dynamic sampling equals one process"
