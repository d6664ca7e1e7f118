#!/usr/bin/env bash
# Every command takes the same key=value overrides from its config table and
# refuses unknown ones with the nearest key and a non-zero exit; a key that
# does nothing in Kestrel is accepted with a one-line notice.
# Usage: cli_overrides.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1

"$KESTREL" builtin model tiny --out "$W/m" --seed 3 >/dev/null
printf '%s\n' '{"input_ids": [5, 17, 33, 2]}' > "$W/in.jsonl"
refused() {  # refused <expected text> <command...>
  local want=$1; shift
  if "$@" >"$W/out.txt" 2>"$W/err.txt"; then fail "accepted: $*"; fi
  grep -qF "$want" "$W/err.txt" || fail "'$*' should say \"$want\": $(cat "$W/err.txt")"
}
refused "unknown config key 'bogus.key'" "$KESTREL" logprobs --model "$W/m" --input "$W/in.jsonl" --output "$W/o.jsonl" bogus.key=3
refused "did you mean 'actor_rollout_ref.actor.megatron.tensor_model_parallel_size'" \
  "$KESTREL" logprobs --model "$W/m" --input "$W/in.jsonl" --output "$W/o.jsonl" \
  actor_rollout_ref.actor.megatron.tensor_model_paralel_size=1
refused "did you mean 'actor_rollout_ref.rollout.temperature'" \
  "$KESTREL" generate --model "$W/m" --input "$W/in.jsonl" --output "$W/o.jsonl" temprature=0
refused "does not apply to kestrel generate" \
  "$KESTREL" generate --model "$W/m" --input "$W/in.jsonl" --output "$W/o.jsonl" data.train_batch_size=2
refused "did you mean 'optim.lr_scheduler'" "$KESTREL" sft optim.lr_schedular=cosine
refused "did you mean 'actor_rollout_ref.actor.ppo_epochs'" "$KESTREL" train actor_rollout_ref.actor.ppo_epoch=2
[ ! -e "$W/o.jsonl" ] || fail "a refused run wrote output"

# Overrides that apply work: the engine's sampling keys, the memory share, scoring's budget.
"$KESTREL" generate --model "$W/m" --input "$W/in.jsonl" --output "$W/g.jsonl" --quiet temperature=0 \
  actor_rollout_ref.rollout.response_length=3 actor_rollout_ref.rollout.gpu_memory_utilization=0.2 \
  disable_log_stats=false 2>"$W/err.txt" || { cat "$W/err.txt"; fail "generate with overrides"; }
grep -q '"token_ids":\[[0-9]*,[0-9]*,[0-9]*\]' "$W/g.jsonl" || fail "response_length=3: $(cat "$W/g.jsonl")"
# A no-effect key set to a non-default value: one notice line, the run goes on.
[ "$(grep -c 'has no effect in Kestrel' "$W/err.txt")" = 1 ] || fail "expected one notice: $(cat "$W/err.txt")"
"$KESTREL" logprobs --model "$W/m" --input "$W/in.jsonl" --output "$W/l.jsonl" \
  actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=2 2>/dev/null || fail "logprobs with an override"
[ "$(wc -l < "$W/l.jsonl")" = 1 ] || fail "logprobs output"
# The memory share that holds no KV cache is an error naming the key.
refused "actor_rollout_ref.rollout.gpu_memory_utilization" env KESTREL_DEVICE_MEMORY=1000000 \
  "$KESTREL" generate --model "$W/m" --input "$W/in.jsonl" --output "$W/o.jsonl"
# Each tree documents itself.
for t in ppo_trainer sft_trainer generate logprobs; do
  "$KESTREL" config docs $t > "$W/docs_$t.txt" || fail "config docs $t"
  grep -q "^## " "$W/docs_$t.txt" || fail "config docs $t lists no section"
done
grep -A1 '^data.val_batch_size$' "$W/docs_ppo_trainer.txt" | grep -q 'no effect in Kestrel' || fail "docs show no-effect keys"
# A bad kernel ISA level fails before any command runs, naming the variable.
refused "KESTREL_ISA='sse4' is not a kernel ISA level" env KESTREL_ISA=sse4 "$KESTREL" config show
echo "cli_overrides: OK"
