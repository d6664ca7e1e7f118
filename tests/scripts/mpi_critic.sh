#!/usr/bin/env bash
# The PPO critic under mpirun: 3 critic updates under DP2 (with and without
# the distributed optimizer) and under TP2 against one process (values, value
# losses, grad norms, final weights; tests/mpi/critic_parallel_test.cpp).
# Then `kestrel train` with algorithm.adv_estimator=gae under mpirun -np 2 as
# DP2, TP2 and PP2 (actor and critic each split into two pipeline stages): step 1's critic metrics (values of the same rollouts, value
# loss, grad norm) equal one process's within 1e-4 relative, and a DP2 +
# distributed-optimizer run resumed from a checkpoint ends with the critic's
# weights and optimizer file bit-identical to an uninterrupted run.
# usage: bash tests/scripts/mpi_critic.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_critic: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_critic: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='CriticParallel.*'
echo "== mpirun -np 2 mpi_tests --gtest_filter=$FILTER"
if ! timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
  echo "mpi_critic: FAILED with 2 ranks" >&2
  exit 1
fi
echo "mpi_critic: critic updates equal one process under DP2, DP2 + distributed optimizer, TP2"

KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_critic: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }
# As tests/scripts/mpi_train.sh (a reward that differs within groups, Adam eps 1e-5), with a critic.
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.optim.lr=1e-3
        actor_rollout_ref.actor.optim.eps=1e-5 algorithm.adv_estimator=gae algorithm.lam=0.95
        critic.ppo_mini_batch_size=4 critic.optim.lr=1e-3 critic.optim.eps=1e-5
        trainer.test_freq=-1 trainer.val_before_train=false "trainer.logger=[]" trainer.resume_mode=disable
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
single() { "$KESTREL" train "${COMMON[@]}" "$@" >"$W/log.txt" 2>&1 || fail "single process: $*"; }
multi() { timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" "$@" \
            >"$W/log.txt" 2>&1 || fail "mpirun -np 2: $*"; }
metric() {  # metric <run-dir> <key>: the key's value in the first step's metrics
  head -n 1 "$1/metrics.jsonl" | tr ',{}' '\n\n\n' | grep "\"$2\":" | sed -E 's/.*: *//'
}
close() {  # close <a> <b> <what>: |a - b| <= 1e-4 * max(|a|, |b|, 1e-6)
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; t = b < 0 ? -b : b;
    if (t > s) s = t; if (s < 1e-6) s = 1e-6; exit !(d <= 1e-4 * s) }' || fail "$3: $1 vs $2"
}

single trainer.total_training_steps=1 trainer.save_freq=1 trainer.default_local_dir="$W/one"
for layout in dp2 tp2 pp2; do
  case $layout in
    dp2) extra=() ;;
    pp2) extra=(actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2) ;;  # the critic follows the actor's pp
    tp2) extra=(actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
                actor_rollout_ref.rollout.tensor_model_parallel_size=2
                critic.megatron.tensor_model_parallel_size=2) ;;
  esac
  multi trainer.total_training_steps=1 trainer.save_freq=1 trainer.default_local_dir="$W/$layout" "${extra[@]}"
  for k in critic/values/mean critic/vf_loss critic/grad_norm critic/vpred_mean critic/score/mean; do
    a=$(metric "$W/one" "$k"); b=$(metric "$W/$layout" "$k")
    [[ -n "$a" && -n "$b" ]] || fail "$layout: metric $k missing"
    close "$a" "$b" "$layout: $k"
    echo "  $layout $k: $b (one process: $a)"
  done
  [[ -f "$W/$layout/global_step_1/critic/model/model.safetensors" ]] || fail "$layout: no critic checkpoint"
  echo "mpi_critic: kestrel train (gae) under $layout equals one process"
done
[[ -f "$W/dp2/global_step_1/critic/optimizer_pp0.safetensors" ]] || fail "dp2: the critic's optimizer file is missing"

# Resume with the critic under DP2 + the distributed optimizer: 2 steps + 1 resumed == 3 steps.
D=(actor_rollout_ref.actor.megatron.use_distributed_optimizer=true)
multi trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/full" "${D[@]}"
multi trainer.total_training_steps=2 trainer.save_freq=1 trainer.default_local_dir="$W/resumed" "${D[@]}"
timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train \
  "${COMMON[@]/trainer.resume_mode=disable/trainer.resume_mode=auto}" \
  trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/resumed" "${D[@]}" >"$W/log.txt" 2>&1 \
  || fail "resume under mpirun"
grep -q "resumed from" "$W/log.txt" || fail "the second run did not resume"
for f in critic/model/model.safetensors critic/optimizer_pp0.safetensors actor/model/model.safetensors; do
  cmp "$W/full/global_step_3/$f" "$W/resumed/global_step_3/$f" || fail "resumed $f differs from the uninterrupted run"
done
echo "mpi_critic: OK"
