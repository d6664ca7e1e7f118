#!/usr/bin/env bash
# Asynchronous RL on a long-tail workload (docs/benchmarks.md "Asynchronous
# RL"): GRPO on a mix of the built-in arith task's problems, 90% with 1-2
# events and 10% with 10-14 (worked solutions about 6-8x longer), with the
# tiny policy warm-started by SFT on the same mix (600 steps, about 2 minutes,
# cached under $KESTREL_CACHE/arith_longtail_sft), rollout.n=8, T=1.0,
# responses up to 640 tokens (the tiny model has 1024 positions). One run each, the same steps and seeds:
#   sync          the synchronous trainer
#   one_step_off  async_training.staleness_threshold=1
#   staleness_2   async_training.staleness_threshold=2
#   partial       algorithm.partial_rollout_max_split=4 (rounds of 160 tokens)
#   partial_stale_1  both: staleness 1 and max_split 4 (verl's fully-async trainer with partial rollout)
#   disagg_1_1    mpirun -np 2: one trainer rank, one rollout rank, staleness 1
#   disagg_1_1_partial  the same with max_split 4
# Stale data has its old log-probs recomputed by the actor (one more forward,
# as verl's one-step-off trainer does). (async_training.use_rollout_log_probs
# skips it, but needs rollout.calculate_log_probs, whose rollout_corr/ metrics
# then make the update score every sequence: slower here.)
# Prints per mode: training seconds (sum of timing_s/step), steps per hour,
# tokens per second, the mean score over all steps and the last half, the
# response length mean and max, and (partial) the responses that spanned rounds.
# Colocated runs use both cores (OMP_NUM_THREADS=2); the disaggregated ranks
# one core each.
# usage: bash bench/async_rl_bench.sh [kestrel-binary (build/release/kestrel)] [steps (60)]
set -euo pipefail
KESTREL=${1:-build/release/kestrel}
STEPS=${2:-60}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_NO_PROGRESS=1
CACHE=${KESTREL_CACHE:-$HOME/.cache/kestrel}
D=$CACHE/arith_longtail
if [[ ! -f $D/sft/hf_model/model.safetensors ]]; then
  mkdir -p "$D"
  "$KESTREL" builtin arith --out "$D/short" --min-steps 1 --max-steps 2 --num-train 3600 --num-test 90 --seed 11 >/dev/null
  "$KESTREL" builtin arith --out "$D/long" --min-steps 10 --max-steps 14 --num-train 400 --num-test 10 --seed 12 >/dev/null
  for f in sft_train train test; do cat "$D/short/$f.jsonl" "$D/long/$f.jsonl" >"$D/$f.jsonl"; done
  "$KESTREL" sft data.train_files="$D/sft_train.jsonl" data.val_files=null data.max_length=2048 data.train_batch_size=16 \
    data.use_dynamic_bsz=true data.max_token_len_per_gpu=8192 model.partial_pretrain=builtin:tiny optim.lr=3e-3 \
    "optim.betas=[0.9,0.95]" optim.weight_decay=0.01 optim.warmup_steps_ratio=0.03 optim.clip_grad=1.0 \
    optim.lr_scheduler=cosine optim.min_lr_ratio=0.1 trainer.default_local_dir="$D/sft" trainer.total_training_steps=600 \
    "trainer.logger=[file]" trainer.save_freq=100 trainer.resume_mode=auto trainer.export_dir="$D/sft/hf_model" \
    >"$W/sft.log" 2>&1 || { tail -20 "$W/sft.log"; exit 1; }
fi
COMMON=(algorithm.adv_estimator=grpo "data.train_files=[$D/train.jsonl]" "data.val_files=[$D/test.jsonl]"
        data.train_batch_size=16 data.max_prompt_length=384 data.max_response_length=640
        actor_rollout_ref.model.path="$D/sft/hf_model" actor_rollout_ref.actor.megatron.dtype=float32
        actor_rollout_ref.rollout.dtype=float32 actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.use_dynamic_bsz=true
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 actor_rollout_ref.actor.optim.lr=5e-5
        "actor_rollout_ref.actor.optim.betas=[0.9,0.95]" actor_rollout_ref.actor.use_kl_loss=false
        trainer.device=cpu trainer.total_training_steps="$STEPS" trainer.test_freq=-1 trainer.val_before_train=false
        trainer.save_freq=-1 "trainer.logger=[]" trainer.resume_mode=disable)
column() { grep -o "\"$2\":[^,}]*" "$1/metrics.jsonl" | cut -d: -f2; }
report() {  # report <mode> <dir>
  local d=$2
  local secs tokens
  secs=$(column "$d" timing_s/step | awk '{ s += $1 } END { printf "%.1f", s }')
  tokens=$(column "$d" perf/total_num_tokens | awk '{ s += $1 } END { print s }')
  local score late len maxlen partial
  score=$(column "$d" critic/score/mean | awk '{ s += $1; n++ } END { printf "%.3f", s / n }')
  late=$(column "$d" critic/score/mean | awk -v h=$((STEPS / 2)) 'NR > h { s += $1; n++ } END { printf "%.3f", s / n }')
  len=$(column "$d" response_length/mean | awk '{ s += $1; n++ } END { printf "%.1f", s / n }')
  maxlen=$(column "$d" response_length/max | awk 'BEGIN { m = 0 } { if ($1 > m) m = $1 } END { print m }')
  partial=$( (column "$d" fully_async/partial/total_partial_num || true) | awk '{ s += $1 } END { print s + 0 }')
  awk -v m="$1" -v s="$secs" -v t="$tokens" -v n="$STEPS" -v sc="$score" -v l8="$late" -v len="$len" -v mx="$maxlen" \
      -v p="$partial" 'BEGIN { printf "%-13s %8.1f s %9.0f steps/h %8.0f tok/s  score %s (last half %s)  len %s max %s  partial %d\n",
                               m, s, n * 3600 / s, t / s, sc, l8, len, mx, p }'
}
run() {  # run <mode> <overrides...>
  local mode=$1
  shift
  OMP_NUM_THREADS=2 "$KESTREL" train "${COMMON[@]}" "$@" trainer.default_local_dir="$W/$mode" >"$W/$mode.log" 2>&1 ||
    { tail -20 "$W/$mode.log"; exit 1; }
  report "$mode" "$W/$mode"
}
echo "async_rl_bench: $STEPS steps of 16 prompts x 8, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run sync
grep -m1 'GEMM' "$W/sync.log" || true
run one_step_off +async_training.staleness_threshold=1
run staleness_2 +async_training.staleness_threshold=2
run partial +algorithm.partial_rollout_max_split=4
run partial_stale_1 +async_training.staleness_threshold=1 +algorithm.partial_rollout_max_split=4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
OMP_NUM_THREADS=1 mpirun -np 2 --bind-to none -x OMP_NUM_THREADS "$KESTREL" train "${COMMON[@]}" \
  +async_training.staleness_threshold=1 +rollout.nnodes=1 +rollout.n_gpus_per_node=1 \
  trainer.default_local_dir="$W/disagg_1_1" >"$W/disagg_1_1.log" 2>&1 || { tail -20 "$W/disagg_1_1.log"; exit 1; }
report disagg_1_1 "$W/disagg_1_1"
idle=$(column "$W/disagg_1_1" trainer/idle_ratio | awk '{ s += $1; n++ } END { printf "%.2f", s / n }')
echo "disagg_1_1: trainer idle ratio (waiting for the rollout) $idle"
OMP_NUM_THREADS=1 mpirun -np 2 --bind-to none -x OMP_NUM_THREADS "$KESTREL" train "${COMMON[@]}" \
  +async_training.staleness_threshold=1 +algorithm.partial_rollout_max_split=4 +rollout.nnodes=1 \
  +rollout.n_gpus_per_node=1 trainer.default_local_dir="$W/disagg_1_1_partial" >"$W/disagg_1_1_partial.log" 2>&1 ||
  { tail -20 "$W/disagg_1_1_partial.log"; exit 1; }
report disagg_1_1_partial "$W/disagg_1_1_partial"
idle=$(column "$W/disagg_1_1_partial" trainer/idle_ratio | awk '{ s += $1; n++ } END { printf "%.2f", s / n }')
echo "disagg_1_1_partial: trainer idle ratio (waiting for the rollout) $idle"
