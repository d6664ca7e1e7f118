#!/usr/bin/env bash
# Activation recompute under mpirun: 3 AdamW steps with every recompute mode
# are bit-identical to none under TP2 with sequence parallelism and under DP2
# (tests/mpi/recompute_mpi_test.cpp; 2 ranks each: TP2 x DP2 needs 4 ranks,
# too slow on two loaded cores).
# Then `kestrel train` (GAE: actor and critic, one process) with the actor on
# full/block/1 + activation-function + norm recompute and the critic on
# selective core_attn,mlp,layernorm: its metrics and the step-2 checkpoint
# (weights and optimizer files of both) equal a run without recompute.
# usage: bash tests/scripts/mpi_recompute.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_recompute: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_recompute: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='RecomputeMpi.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
if ! timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
  echo "mpi_recompute: FAILED" >&2
  exit 1
fi
echo "mpi_recompute: TP2+SP and DP2 (2 ranks) bit-identical to none"

KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_recompute: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }
K=actor_rollout_ref.actor.megatron.override_transformer_config
C=critic.megatron.override_transformer_config
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.optim.lr=1e-3
        algorithm.adv_estimator=gae critic.ppo_mini_batch_size=4 critic.optim.lr=1e-3 trainer.save_freq=2
        trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[]" trainer.resume_mode=disable
        trainer.total_training_steps=2
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
"$KESTREL" train "${COMMON[@]}" trainer.default_local_dir="$W/none" >"$W/log.txt" 2>&1 || fail "no recompute"
"$KESTREL" train "${COMMON[@]}" trainer.default_local_dir="$W/rc" $K.recompute_granularity=full \
  $K.recompute_method=block $K.recompute_num_layers=1 $K.recompute_activation_function=true $K.recompute_norm=true \
  $C.recompute_granularity=selective "$C.recompute_modules=[core_attn,mlp,layernorm]" >"$W/log.txt" 2>&1 ||
  fail "with recompute"
# Metrics without the timing ones.
strip() { sed -E 's/"(timing|perf)[^"]*":[^,}]*,?//g' "$1"; }
[[ "$(strip "$W/none/metrics.jsonl")" == "$(strip "$W/rc/metrics.jsonl")" ]] || fail "metrics differ"
for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors critic/model/model.safetensors \
         critic/optimizer_pp0.safetensors; do
  cmp -s "$W/none/global_step_2/$f" "$W/rc/global_step_2/$f" || fail "$f differs"
done
echo "mpi_recompute: kestrel train with actor and critic recompute equals no recompute (metrics, checkpoint bits)"
