#!/usr/bin/env bash
# kestrel train with ...override_transformer_config.reuse_fp32_param=true
# (BF16 parameter-copy reuse, optim/adamw.h): a bf16 GRPO run equals the same
# run without it bit for bit (weights, trainer state, every metric; the optimizer file
# differs in layout: with reuse the master is saved as the held owned range), and
# an f32 run refuses the key with a message.
# usage: bash tests/scripts/reuse_fp32_cli.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "reuse_fp32_cli: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -20 "$W/log.txt" >&2; exit 1; }
det() { sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput)[^"]*":[^,}]*,?//g' "$1/metrics.jsonl"; }
K=actor_rollout_ref.actor.megatron.override_transformer_config.reuse_fp32_param
RL=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=4
    data.max_response_length=12 data.val_max_samples=4 data.train_max_samples=64
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.entropy_coeff=0.01
    actor_rollout_ref.actor.optim.lr=1e-3 trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=-1
    "trainer.logger=[]" actor_rollout_ref.actor.megatron.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16)
"$KESTREL" train "${RL[@]}" trainer.default_local_dir="$W/plain" >"$W/log.txt" 2>&1 || fail "plain bf16 run"
"$KESTREL" train "${RL[@]}" "+$K=true" trainer.default_local_dir="$W/reuse" >"$W/log.txt" 2>&1 || fail "reuse run"
for f in actor/model/model.safetensors trainer_state.json; do
  cmp -s "$W/plain/global_step_3/$f" "$W/reuse/global_step_3/$f" || fail "$f differs with reuse_fp32_param"
done
diff <(det "$W/plain") <(det "$W/reuse") >/dev/null || fail "metrics differ with reuse_fp32_param"
if "$KESTREL" train "${RL[@]}" actor_rollout_ref.actor.megatron.dtype=float32 actor_rollout_ref.rollout.dtype=float32 \
     "+$K=true" trainer.default_local_dir="$W/f32" >"$W/log.txt" 2>&1; then
  fail "an f32 run accepted reuse_fp32_param"
fi
grep -q "reuse_fp32_param" "$W/log.txt" || fail "the f32 refusal does not name reuse_fp32_param"
echo "reuse_fp32_cli: passed (bf16 run bit-identical with reuse; f32 refused)"
