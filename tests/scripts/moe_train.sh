#!/usr/bin/env bash
# Every command on the built-in mixture-of-experts models, nothing downloaded:
#  - kestrel train GRPO on builtin:tiny-qwen3-moe (f32; aux and z losses, router replay R2) and
#    builtin:tiny-deepseek-v3 (f32; sequence-wise aux loss, z loss, the expert-bias update, R2), the
#    actor/moe_* metrics logged; the DeepSeek run killed mid-update resumes bit-identical to an
#    uninterrupted one (weights incl. the f32 correction bias, optimizer, trainer state, per-step metrics);
#  - one bf16 run (DeepSeek-V3: its correction bias stays f32 in the bf16 checkpoint);
#  - router replay R3 (the rollout's routing replayed by the old-log-prob pass, the update and the reference);
#  - PPO (GAE) with a MoE critic: critic/moe_* metrics;
#  - kestrel sft with an HF export, kestrel logprobs and kestrel generate on the exported folders.
# Usage: moe_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
OT=actor_rollout_ref.actor.megatron.override_transformer_config

COMMON=(data.train_batch_size=2 actor_rollout_ref.rollout.n=3 data.max_response_length=10 data.val_max_samples=4
        data.train_max_samples=64 actor_rollout_ref.actor.ppo_mini_batch_size=1
        actor_rollout_ref.actor.entropy_coeff=0.01 actor_rollout_ref.actor.optim.lr=1e-3
        actor_rollout_ref.actor.router_replay.mode=R2 trainer.total_training_steps=4 trainer.save_freq=2
        trainer.test_freq=4 "trainer.logger=[]")
QWEN=(actor_rollout_ref.model.path=builtin:tiny-qwen3-moe "+$OT.moe_aux_loss_coeff=0.01" "+$OT.moe_z_loss_coeff=0.001")
DEEPSEEK=(actor_rollout_ref.model.path=builtin:tiny-deepseek-v3 "+$OT.moe_router_load_balancing_type=seq_aux_loss"
          "+$OT.moe_aux_loss_coeff=0.01" "+$OT.moe_z_loss_coeff=0.001" "+$OT.moe_router_enable_expert_bias=true"
          "+$OT.moe_router_bias_update_rate=0.01")

run() {  # run <dir> <crash point or ""> args...: prints the exit status
  local dir=$1 crash=$2
  shift 2
  set +e
  KESTREL_CRASH_AT=$crash "$KESTREL" train "${COMMON[@]}" "$@" trainer.default_local_dir="$dir" >"$W/log.txt" 2>&1
  local rc=$?
  set -e
  echo "$rc"
}
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }
det() { sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput)[^"]*":[^,}]*,?//g' "$1/metrics.jsonl"; }
has_metrics() {  # has_metrics <dir> <prefix>: every router metric on every training step
  local n
  for k in moe_aux_loss moe_z_loss moe_max_load moe_min_load moe_dropped_tokens; do
    n=$(grep -c "\"$2/$k\"" "$1/metrics.jsonl" || true)
    [ "$n" = 4 ] || fail "$1: $2/$k on $n of 4 steps"
  done
}
# The dtype of tensor $2 in safetensors file $1 (its JSON header).
tensor_dtype() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))[sys.argv[2]]["dtype"])
EOF
}

# 1. Qwen3-MoE, f32; a capacity factor of half the fair share drops token slots.
[ "$(run "$W/qwen" "" "${QWEN[@]}" "+$OT.moe_expert_capacity_factor=0.5")" = 0 ] || fail "Qwen3-MoE GRPO run failed"
has_metrics "$W/qwen" actor
python3 -c 'import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    assert "actor/moe_dropped_tokens" not in d or 0 < d["actor/moe_dropped_tokens"] < 1, d' "$W/qwen/metrics.jsonl" ||
  fail "the capacity factor dropped no token"
echo "moe_train: Qwen3-MoE GRPO (f32, aux + z loss, capacity, R2)"

# 2. DeepSeek-V3, f32, uninterrupted and killed in step 3's update then resumed.
[ "$(run "$W/ds_ref" "" "${DEEPSEEK[@]}")" = 0 ] || fail "DeepSeek-V3 GRPO run failed"
has_metrics "$W/ds_ref" actor
[ "$(run "$W/ds" train_step:3 "${DEEPSEEK[@]}")" = 137 ] || fail "expected SIGKILL in step 3"
[ "$(run "$W/ds" "" "${DEEPSEEK[@]}")" = 0 ] || fail "resumed DeepSeek-V3 run failed"
grep -q 'resumed from .*global_step_2 ' "$W/log.txt" || fail "the DeepSeek-V3 run did not resume from step 2"
for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors trainer_state.json; do
  cmp "$W/ds_ref/global_step_4/$f" "$W/ds/global_step_4/$f" || fail "DeepSeek-V3: $f differs from the uninterrupted run"
done
diff <(det "$W/ds_ref") <(det "$W/ds") || fail "DeepSeek-V3: per-step metrics differ from the uninterrupted run"
BIAS=model.layers.1.mlp.gate.e_score_correction_bias
cmp <(tensor_dtype "$W/ds/global_step_2/actor/model/model.safetensors" "$BIAS") <(echo F32) || fail "bias not f32"
echo "moe_train: DeepSeek-V3 GRPO (f32, seq aux + z loss, expert bias, R2) resumed bit-identical"

# 3. bf16: the weights in bf16, the correction bias in f32.
[ "$(run "$W/bf16" "" "${DEEPSEEK[@]}" actor_rollout_ref.actor.megatron.dtype=bfloat16 \
      actor_rollout_ref.rollout.dtype=bfloat16 trainer.total_training_steps=2)" = 0 ] || fail "bf16 run failed"
M="$W/bf16/global_step_2/actor/model/model.safetensors"
[ "$(tensor_dtype "$M" "$BIAS")" = F32 ] || fail "bf16 checkpoint: $BIAS is $(tensor_dtype "$M" "$BIAS")"
[ "$(tensor_dtype "$M" model.layers.1.mlp.experts.0.gate_proj.weight)" = BF16 ] || fail "bf16 checkpoint: experts not bf16"
echo "moe_train: bf16 DeepSeek-V3 GRPO (correction bias f32 in the checkpoint)"

# 4. Router replay R3: the rollout records every token's routing, the old-log-prob pass, the update and the
#    reference (KL loss) replay it.
[ "$(run "$W/r3" "" "${DEEPSEEK[@]}" actor_rollout_ref.rollout.enable_rollout_routing_replay=true \
      actor_rollout_ref.actor.router_replay.mode=R3 actor_rollout_ref.ref.router_replay.mode=R3 \
      actor_rollout_ref.actor.use_kl_loss=true trainer.total_training_steps=2)" = 0 ] || fail "R3 run failed"
grep -q '"actor/kl_loss"' "$W/r3/metrics.jsonl" || fail "R3 run: no KL loss"
echo "moe_train: DeepSeek-V3 GRPO with router replay R3 (rollout, old log-probs, update, reference)"

# 5. PPO with a MoE critic.
[ "$(run "$W/ppo" "" "${QWEN[@]}" algorithm.adv_estimator=gae critic.optim.lr=1e-3 \
      "+critic.megatron.override_transformer_config.moe_aux_loss_coeff=0.01" \
      "+critic.megatron.override_transformer_config.moe_expert_capacity_factor=1.0")" = 0 ] || fail "PPO run failed"
has_metrics "$W/ppo" critic
has_metrics "$W/ppo" actor
echo "moe_train: PPO with a MoE critic"

# 6. SFT with an HF export, then scoring and generation on the exported and trained folders.
declare -A TRAINED=([tiny-qwen3-moe]="$W/qwen/global_step_4/actor/model" [tiny-deepseek-v3]="$W/ds/global_step_4/actor/model")
for m in tiny-qwen3-moe tiny-deepseek-v3; do
  "$KESTREL" sft model.partial_pretrain=builtin:$m data.arith.num_train=64 data.train_batch_size=8 data.val_files=null \
    trainer.total_training_steps=2 trainer.default_local_dir="$W/sft_$m" trainer.export_dir="$W/sft_$m/export" \
    "+model.override_transformer_config.moe_aux_loss_coeff=0.01" "trainer.logger=[file]" >"$W/log.txt" 2>&1 ||
    fail "sft on $m failed"
  grep -q '"train/moe_aux_loss"' "$W/sft_$m/metrics.jsonl" || fail "sft on $m: no train/moe_aux_loss"
  echo '{"input_ids": [3, 4, 5, 6, 7]}' >"$W/in.jsonl"
  for dir in "$W/sft_$m/export" "${TRAINED[$m]}"; do
    "$KESTREL" logprobs --model "$dir" --input "$W/in.jsonl" --output "$W/lp.jsonl" >"$W/log.txt" 2>&1 ||
      fail "logprobs on $dir failed"
    grep -q '"logprobs"' "$W/lp.jsonl" || fail "logprobs on $dir: no output"
    "$KESTREL" generate --model "$dir" --input "$W/in.jsonl" --output "$W/gen.jsonl" response_length=4 \
      temperature=0 >"$W/log.txt" 2>&1 || fail "generate on $dir failed"
    grep -q '"token_ids"' "$W/gen.jsonl" || fail "generate on $dir: no output"
  done
done
echo "moe_train: OK (GRPO f32/bf16 and PPO on both built-in MoE models, resume bit-identical, sft/logprobs/generate)"
