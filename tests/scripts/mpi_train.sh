#!/usr/bin/env bash
# `kestrel train` under mpirun equals one process: a short GRPO run (tiny
# random-init model, KL loss against a reference, two updates per step) on
# one process, then under `mpirun -np 2` as DP2, DP2 with the distributed
# optimizer, TP2 (rollout TP2, weights in place), TP1 training with a TP2
# rollout (weights resharded at every switch), PP2 and interleaved PP2 x
# VPP2 (each rank a pipeline stage; the rollout's whole-model copy gathered
# from the stages after every update), and CP2 (ring, and Ulysses by verl's
# ulysses_sequence_parallel_size; each rank trains and scores half of every
# sequence; prompt sharing off). A GAE run (the critic under CP2 too) equals
# its one-process run. The first step's rollout
# metrics must be identical (same samples), and the final weights must give the
# single-process logprobs within 1e-4 of each line's scale. A DP2 +
# distributed-optimizer run stopped after a checkpoint and resumed must end
# bit-identical to an uninterrupted one (the optimizer file too), and a PP2
# checkpoint resumes under PP1 and under TP2.
# usage: bash tests/scripts/mpi_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_train "$BUILD"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "mpi_train: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

# The reward program scores a response by the length of its request line
# (without the "id", which differs after a resume) mod 5,
# so groups differ and the policy gradient is not zero (the random model never
# solves arith). Adam's eps 1e-5 keeps summation-order noise in near-zero gradients from
# becoming lr-sized steps (the distributed tests of tests/mpi do the same).
COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=2
        data.max_response_length=8 data.val_max_samples=4 data.train_max_samples=64
        actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.use_kl_loss=true
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-5
        trainer.test_freq=2 "trainer.logger=[]" trainer.resume_mode=disable
        'reward_model.reward_command=while read -r l; do expr length "$(echo "$l" | cut -d, -f2-)" % 5; done')
single() { "$KESTREL" train "${COMMON[@]}" "$@" >"$W/log.txt" 2>&1 || fail "single process: $*"; }
multi() { timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]}" "$@" \
            >"$W/log.txt" 2>&1 || fail "mpirun -np 2: $*"; }

# Step 1's rollout (before any update): the same responses, so the same scores and lengths.
step1() { head -n 2 "$1/metrics.jsonl" | tail -n 1 | tr ',' '\n' |
          grep -E '"(critic/score|response_length|prompt_length)/(mean|max|min)"'; }
KEYS='actor/pg_loss actor/kl_loss actor/entropy actor/grad_norm actor/ppo_kl critic/score/mean response_length/mean'
source "$(dirname "$0")/lib/compare_runs.sh"
same_weights() {  # same_weights <ckpt-a> <ckpt-b> <what> [step]: the actor folders of step (2) score alike
  local step=${4:-2}
  same_logprobs "$1/global_step_$step/actor/model" "$2/global_step_$step/actor/model" "$3"
}

single trainer.total_training_steps=2 trainer.save_freq=2 trainer.default_local_dir="$W/one"
for layout in dp2 dp2_distopt tp2 tp1_rollout_tp2 pp2 pp2_vpp2 cp2 cp2_ulysses; do
  case $layout in
    # Context parallelism: the actor's and the reference's sequences split over 2 ranks (prompt sharing off).
    cp2) extra=(actor_rollout_ref.actor.megatron.context_parallel_size=2) ;;
    cp2_ulysses) extra=(actor_rollout_ref.actor.ulysses_sequence_parallel_size=2) ;;
    pp2) extra=(actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2) ;;
    pp2_vpp2) extra=(actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
                     actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2
                     actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1) ;;  # 4 micro-batches: interleaved
    dp2) extra=() ;;
    dp2_distopt) extra=(actor_rollout_ref.actor.megatron.use_distributed_optimizer=true) ;;
    tp2) extra=(actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
                actor_rollout_ref.rollout.tensor_model_parallel_size=2) ;;
    tp1_rollout_tp2) extra=(actor_rollout_ref.rollout.tensor_model_parallel_size=2) ;;
  esac
  multi trainer.total_training_steps=2 trainer.save_freq=2 trainer.default_local_dir="$W/$layout" "${extra[@]}"
  [[ -f "$W/$layout/global_step_2/actor/model/model.safetensors" ]] || fail "$layout: no checkpoint"
  diff <(step1 "$W/one") <(step1 "$W/$layout") >/dev/null || fail "$layout: step 1 rollout metrics differ"
  same_weights "$W/one" "$W/$layout" "$layout"
  same_metrics "$W/one" "$W/$layout" "$layout"
  echo "mpi_train: $layout equals one process"
done
# PPO with the critic (GAE): the critic's values and updates under CP2 equal one process's.
GAE=(algorithm.adv_estimator=gae critic.optim.lr=1e-3 critic.optim.eps=1e-5)
single trainer.total_training_steps=2 trainer.save_freq=2 trainer.default_local_dir="$W/gae_one" "${GAE[@]}"
multi trainer.total_training_steps=2 trainer.save_freq=2 trainer.default_local_dir="$W/gae_cp2" "${GAE[@]}" \
  actor_rollout_ref.actor.megatron.context_parallel_size=2
KEYS="$KEYS critic/vf_loss critic/grad_norm critic/values/mean" same_metrics "$W/gae_one" "$W/gae_cp2" "gae cp2"
same_weights "$W/gae_one" "$W/gae_cp2" "gae cp2"
echo "mpi_train: GAE (actor and critic) under cp2 equals one process"

# The optimizer state is one file per pipeline stage, whatever the dp / tp layout.
[[ -f "$W/dp2_distopt/global_step_2/actor/optimizer_pp0.safetensors" ]] || fail "dp2_distopt: no optimizer file"
for s in 0 1; do
  [[ -f "$W/pp2/global_step_2/actor/optimizer_pp$s.safetensors" ]] || fail "pp2: stage $s's optimizer file missing"
done

# A PP2 checkpoint resumes under another layout: 2 steps under PP2, then step 3
# under PP1 (one process) and under TP2, and a PP2 x VPP2 checkpoint under
# PP1, each equal to an uninterrupted
# single-process run of 3 steps (the restored state is the saved one bit for
# bit; the layouts' arithmetic differs in rounding only).
single trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/one3"
PP=(actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2)
TP=(actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.rollout.tensor_model_parallel_size=2)
RESUME=("${COMMON[@]/trainer.resume_mode=disable/trainer.resume_mode=auto}" trainer.total_training_steps=3 trainer.save_freq=1)
VPP=(actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1)
for to in pp1 tp2 vpp2_to_pp1; do
  from=("${PP[@]}")
  [[ $to == vpp2_to_pp1 ]] && from+=("${VPP[@]}")  # interleaved chunks saved, one process resumes
  multi trainer.total_training_steps=2 trainer.save_freq=1 trainer.default_local_dir="$W/pp2_to_$to" "${from[@]}"
  if [[ $to != tp2 ]]; then
    "$KESTREL" train "${RESUME[@]}" trainer.default_local_dir="$W/pp2_to_$to" >"$W/log.txt" 2>&1 || fail "PP2 -> PP1 resume"
  else
    timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${RESUME[@]}" "${TP[@]}" \
      trainer.default_local_dir="$W/pp2_to_$to" >"$W/log.txt" 2>&1 || fail "PP2 -> TP2 resume"
  fi
  grep -q "resumed from" "$W/log.txt" || fail "PP2 -> $to: the second run did not resume"
  same_weights "$W/one3" "$W/pp2_to_$to" "PP2 checkpoint resumed under $to" 3
  echo "mpi_train: a PP2 checkpoint resumed under $to equals one process"
done

# Resume under the distributed optimizer: 2 steps + 1 resumed == 3 steps.
D=(actor_rollout_ref.actor.megatron.use_distributed_optimizer=true)
multi trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/full" "${D[@]}"
multi trainer.total_training_steps=2 trainer.save_freq=1 trainer.default_local_dir="$W/resumed" "${D[@]}"
timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" train "${COMMON[@]/trainer.resume_mode=disable/trainer.resume_mode=auto}" \
  trainer.total_training_steps=3 trainer.save_freq=1 trainer.default_local_dir="$W/resumed" "${D[@]}" >"$W/log.txt" 2>&1 \
  || fail "resume under mpirun"
grep -q "resumed from" "$W/log.txt" || fail "the second run did not resume"
cmp "$W/full/global_step_3/actor/model/model.safetensors" "$W/resumed/global_step_3/actor/model/model.safetensors" \
  || fail "resumed weights differ from the uninterrupted run"
cmp "$W/full/global_step_3/actor/optimizer_pp0.safetensors" "$W/resumed/global_step_3/actor/optimizer_pp0.safetensors" \
  || fail "resumed optimizer state differs"

echo "mpi_train: OK"
