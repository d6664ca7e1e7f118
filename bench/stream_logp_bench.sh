#!/usr/bin/env bash
# Reference and old log-probs scored on the trainer as each group's responses
# arrive (async_training.stream_log_probs) against scoring them when the batch
# comes, in the disaggregated layout at staleness 0 (mpirun -np 2: one
# trainer rank, one rollout rank; the trainer's core idles while the rollout
# generates). GRPO with the KL loss (so a reference model scores every
# response) and two mini-batches a step (so old log-probs are scored too) on
# the built-in arith task with the demo's warm start (builtin:arith-sft), 16
# prompts x 8 responses a step; one run each, the same steps and seeds.
# Prints per mode: the mean step time, the trainer's old + ref time after the
# batch came (timing_s/old_log_prob + timing_s/ref), its idle share
# (trainer/idle_ratio), the share streamed, and the speed-up.
# usage: bash bench/stream_logp_bench.sh [kestrel-binary (build/release/kestrel)] [steps (10)]
set -euo pipefail
KESTREL=${1:-build/release/kestrel}
STEPS=${2:-10}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_NO_PROGRESS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
COMMON=(actor_rollout_ref.model.path="${MODEL:-builtin:arith-sft}" data.train_batch_size=16 actor_rollout_ref.rollout.n=8
        actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.use_kl_loss=true
        trainer.total_training_steps="$STEPS" trainer.test_freq=-1 trainer.val_before_train=false trainer.save_freq=-1
        "trainer.logger=[file]" trainer.resume_mode=disable +rollout.nnodes=1 +rollout.n_gpus_per_node=1)
column() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
mean() { column "$1" "$2" | awk '{ s += $1; n++ } END { printf "%.3f", n ? s / n : 0 }'; }
echo "$(lscpu | sed -n 's/^Model name: *//p'), 1 trainer rank + 1 rollout rank (one core each), $STEPS steps"
printf "%-9s %8s %12s %12s %10s %8s\n" mode "step s" "old+ref s" "idle ratio" streamed speedup
base=
for mode in batch streamed; do
  extra=()
  [[ $mode == streamed ]] && extra=(+async_training.stream_log_probs=true)
  OMP_NUM_THREADS=1 mpirun -np 2 --bind-to none -x OMP_NUM_THREADS "$KESTREL" train "${COMMON[@]}" "${extra[@]}" \
    trainer.default_local_dir="$W/$mode" >"$W/$mode.log" 2>&1 || { tail -20 "$W/$mode.log"; exit 1; }
  step=$(mean "$W/$mode" timing_s/step)
  [[ -z $base ]] && base=$step
  lp=$(awk -v a="$(mean "$W/$mode" timing_s/old_log_prob)" -v b="$(mean "$W/$mode" timing_s/ref)" 'BEGIN { printf "%.3f", a + b }')
  printf "%-9s %8s %12s %12s %10s %7.2fx\n" "$mode" "$step" "$lp" \
    "$(mean "$W/$mode" trainer/idle_ratio)" "$(mean "$W/$mode" ref/streamed_fraction)" \
    "$(awk -v a="$base" -v b="$step" 'BEGIN { print a / b }')"
done
paste <(column "$W/batch" actor/kl_loss) <(column "$W/streamed" actor/kl_loss) |
  awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d } END { printf "largest difference of actor/kl_loss per step: %.2g\n", m }'
