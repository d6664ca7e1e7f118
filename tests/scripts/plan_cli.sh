#!/usr/bin/env bash
# kestrel plan: the per-rank table for kestrel train's built-in run, --json
# that parses and adds up, a --device-memory too small gives the advice and
# exit status 3, bad input names its flag or key (exit 1), not-built layouts
# are planned and say "not supported yet", every recompute mode is planned as
# the model runs it (and kestrel train's start-up check honours it),
# reuse_fp32_param takes 2 B/param off, a Qwen2.5-0.5B-shaped config.json
# plans without weights, and plan's copy of train's built-in run layer equals
# the one `kestrel train --help` prints.
# Usage: plan_cli.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export KESTREL_DEVICE_MEMORY=$((24 * 1024 * 1024 * 1024))

# 1. The table of the built-in run.
"$KESTREL" plan >"$W/table.txt" 2>"$W/err.txt" || fail "plan of the built-in run: exit $? $(cat "$W/err.txt")"
for want in "bytes per rank" "Params" "Grads" "OptimizerState" "Activations" "KVCache" "actor update" "rollout" \
  "peak:" "fits" "FLOPs per rank per step"; do
  grep -q "$want" "$W/table.txt" || fail "table lacks '$want': $(cat "$W/table.txt")"
done

# 2. JSON parses; each phase's categories add up to its total; the peak is the largest phase.
"$KESTREL" plan --json >"$W/plan.json"
if command -v python3 >/dev/null; then
  python3 - "$W/plan.json" <<'PY' || fail "plan --json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["fits"] is True, j["fits"]
for ph in j["phases"]:
    assert sum(ph["bytes"].values()) == ph["total"], ph
assert j["peak"]["bytes"] == max(ph["total"] for ph in j["phases"])
assert {p["name"] for p in j["phases"]} >= {"rollout", "actor update"}
assert j["micro_batch"]["max_tokens"] > 0 and j["flops"]["actor_update"] > 0
PY
else
  head -c1 "$W/plan.json" | grep -q '{' || fail "plan --json is not a JSON object"
fi

# 3. Too little memory: exit 3, the advice (the cheapest change that fits first).
# The rollout's KV share is the peak: a lower gpu_memory_utilization fits.
set +e
"$KESTREL" plan --device-memory 400MiB actor_rollout_ref.rollout.gpu_memory_utilization=0.95 >"$W/kv.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "a plan that does not fit should exit 3, got $rc: $(cat "$W/kv.txt")"
grep -q "peak: .* in rollout" "$W/kv.txt" || fail "the rollout should be the peak: $(cat "$W/kv.txt")"
grep -q "DOES NOT FIT" "$W/kv.txt" || fail "no DOES NOT FIT: $(cat "$W/kv.txt")"
grep -A1 "to fit 400.0 MiB, cheapest first:" "$W/kv.txt" | grep -q "gpu_memory_utilization=0.4" ||
  fail "the rollout's KV share should be advised first: $(cat "$W/kv.txt")"
# Far too little: no single change fits, the combination is advised.
set +e
"$KESTREL" plan --device-memory 40MiB >"$W/small.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "exit 3 expected, got $rc"
grep -q "combined: " "$W/small.txt" || fail "no combined advice: $(cat "$W/small.txt")"
"$KESTREL" plan --device-memory 40MiB --json >"$W/small.json" || true
grep -q '"fits": false' "$W/small.json" || fail "--json of a plan that does not fit"
grep -q '"advice"' "$W/small.json" || fail "--json lacks the advice"

# 4. Bad input names the flag or key, exit 1.
expect_error() {  # <what to find in stderr> <args...>
  local want=$1
  shift
  set +e
  "$KESTREL" plan "$@" >"$W/out.txt" 2>"$W/err.txt"
  local rc=$?
  set -e
  [ "$rc" -eq 1 ] || fail "plan $* should exit 1, got $rc"
  grep -q -- "$want" "$W/err.txt" || fail "plan $*: error should name '$want': $(cat "$W/err.txt")"
}
expect_error "--device-memory" --device-memory lots
expect_error "--world" --world 0
expect_error "tensor_model_parallel_size" actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3 --world 3
expect_error "pipeline_model_parallel_size" actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3 --world 3
expect_error "unknown config key" actor_rollout_ref.actor.ppo_mini_batch_sise=4

# 5. Pipeline and context parallelism are built: planned, and not marked "not supported yet".
"$KESTREL" plan --world 4 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
  actor_rollout_ref.actor.megatron.context_parallel_size=2 >"$W/pp.txt" || fail "pp=2 cp=2 plan"
grep -q "not supported yet: pipeline parallelism" "$W/pp.txt" && fail "pp is built, but marked: $(cat "$W/pp.txt")"
grep -q "not supported yet: context" "$W/pp.txt" && fail "cp is built, but marked: $(cat "$W/pp.txt")"
"$KESTREL" plan --world 2 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 >"$W/uly.txt" \
  || fail "Ulysses cp=2 plan: $(cat "$W/uly.txt")"
grep -q "cp 2" "$W/uly.txt" || fail "verl's ulysses_sequence_parallel_size=2 is not planned as cp 2: $(cat "$W/uly.txt")"
# The pipeline's layer split is kestrel train's: noop slots pad 4 layers to 6 over pp 3.
"$KESTREL" plan --world 3 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3 \
  "actor_rollout_ref.actor.megatron.override_transformer_config.noop_layers=[0,5]" >"$W/noop.txt" \
  || fail "pp=3 with 2 noop layers: $(cat "$W/noop.txt")"
"$KESTREL" plan actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full \
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform \
  actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1 >"$W/rc.txt"
grep -q "recompute full/uniform/1" "$W/rc.txt" || fail "recompute not planned: $(cat "$W/rc.txt")"
grep -q "not supported yet" "$W/rc.txt" && fail "recompute is built: $(cat "$W/rc.txt")"

# 5b. Recompute is planned as kestrel train runs it (model/'s policy): selective mlp and the MindSpeed
# combinations plan and lower the update's activations; a combination the model refuses is refused (exit 1).
OT=actor_rollout_ref.actor.megatron.override_transformer_config
act_peak() { "$KESTREL" plan --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["actor_activations"]["peak"])'; }
if command -v python3 >/dev/null; then
  none=$(act_peak)
  for mode in "$OT.recompute_granularity=selective $OT.recompute_modules=[mlp]" \
    "$OT.recompute_granularity=full $OT.recompute_method=block $OT.recompute_num_layers=2 $OT.recompute_activation_function=true $OT.recompute_norm=true" \
    "$OT.recompute_granularity=selective $OT.recompute_modules=[core_attn,layernorm] $OT.recompute_activation_function=true" \
    "actor_rollout_ref.model.enable_gradient_checkpointing=true"; do
    # shellcheck disable=SC2086
    got=$(act_peak $mode) || fail "plan $mode"
    [ "$got" -lt "$none" ] || fail "plan $mode: activations $got not below none's $none"
  done
fi
"$KESTREL" plan $OT.recompute_granularity=selective "$OT.recompute_modules=[mlp]" >"$W/mlp.txt" || fail "selective mlp"
grep -q "recompute selective\[mlp\]" "$W/mlp.txt" || fail "selective mlp not planned: $(head -1 "$W/mlp.txt")"
expect_error "recompute_method=block" $OT.recompute_granularity=full $OT.recompute_method=uniform \
  $OT.recompute_num_layers=1 $OT.recompute_norm=true

# 5c. kestrel train's start-up check plans the recompute it runs: with memory between the two peaks
# no recompute is refused before anything loads, full recompute passes (validation only, 2 samples).
LOW="actor_rollout_ref.rollout.gpu_memory_utilization=0.1 trainer.val_only=true data.val_max_samples=2"
FULL="$OT.recompute_granularity=full $OT.recompute_method=uniform $OT.recompute_num_layers=1"
(cd "$W" && set +e
  # shellcheck disable=SC2086
  KESTREL_DEVICE_MEMORY=$((280 * 1024 * 1024)) "$KESTREL" train $LOW trainer.default_local_dir="$W/ck" >"$W/t1.txt" 2>&1
  echo $? >"$W/t1.rc"
  # shellcheck disable=SC2086
  KESTREL_DEVICE_MEMORY=$((280 * 1024 * 1024)) "$KESTREL" train $LOW $FULL trainer.default_local_dir="$W/ck" >"$W/t2.txt" 2>&1
  echo $? >"$W/t2.rc")
[ "$(cat "$W/t1.rc")" != 0 ] && grep -q "exceeds the device memory 280.0 MiB" "$W/t1.txt" ||
  fail "train without recompute at 280 MiB should be refused at start: $(tail -3 "$W/t1.txt")"
grep -q "recompute_" "$W/t1.txt" || fail "the start-up refusal should advise recompute: $(tail -1 "$W/t1.txt")"
[ "$(cat "$W/t2.rc")" = 0 ] || fail "train with full recompute at 280 MiB should pass the start-up check: $(tail -3 "$W/t2.txt")"

# 5d. reuse_fp32_param: bf16 masters as the weights + a 16-bit residual, 2 B/param less optimizer state.
BF="actor_rollout_ref.actor.megatron.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16"
if command -v python3 >/dev/null; then
  opt() { "$KESTREL" plan --json "$@" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["phases"][-1]["bytes"]["OptimizerState"], j["params_per_rank"])'; }
  # shellcheck disable=SC2086
  read -r o1 n < <(opt $BF)
  # shellcheck disable=SC2086
  read -r o2 _ < <(opt $BF --reuse-fp32-param)
  [ $((o1 - o2)) -eq $((2 * n)) ] || fail "reuse_fp32_param: optimizer state $o1 -> $o2 for $n params"
fi
expect_error "needs bf16" --reuse-fp32-param

# 6. A Qwen2.5-0.5B-shaped config.json (no weights), bf16 with the distributed optimizer over 8 ranks.
"$KESTREL" plan --world 8 --device-memory 80GiB data.train_files=/nonexistent.parquet \
  actor_rollout_ref.model.path=configs/models/qwen2.5-0.5b-shape actor_rollout_ref.actor.megatron.dtype=bfloat16 \
  actor_rollout_ref.rollout.dtype=bfloat16 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true \
  actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  >"$W/qwen.txt" || fail "qwen-shaped plan: $(cat "$W/qwen.txt")"
grep -q "Qwen2ForCausalLM, 24 layers, hidden 896, vocab 151936" "$W/qwen.txt" || fail "qwen shapes: $(head -2 "$W/qwen.txt")"
grep -q "dp gradient reduce-scatter" "$W/qwen.txt" || fail "no dp communication: $(cat "$W/qwen.txt")"

# 7. plan's built-in run layer is train's.
"$KESTREL" train --help | sed -n '/verl.s defaults:$/,/^$/p' | sed '1d;$d' | sed 's/^  //' >"$W/train_layer.txt"
"$KESTREL" plan --show-builtin-layer >"$W/plan_layer.txt"
diff "$W/train_layer.txt" "$W/plan_layer.txt" >/dev/null ||
  fail "cli/commands.cpp builtin_train_layer() differs from train.cpp's kBuiltinRun: $(diff "$W/train_layer.txt" "$W/plan_layer.txt")"
echo "plan_cli: ok"
