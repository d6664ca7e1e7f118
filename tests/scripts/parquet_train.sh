#!/usr/bin/env bash
# Parquet datasets (issue 12 item 4): a file pyarrow wrote in verl's gsm8k
# layout trains exactly like the same rows in JSONL: `kestrel train` for 2
# GRPO steps (validation before and after) on the tiny built-in model gives
# the same per-step metrics with train/val files in Parquet (snappy +
# dictionary, zstd + data page v2) as with JSONL. Also: a wrong prompt column
# fails before any model loads, naming the file and listing its columns, and
# `kestrel data inspect` shows the schema, row groups and rows.
# Usage: parquet_train.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
D=tests/data/parquet
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; cat "$W/log.txt" 2>/dev/null; exit 1; }
# metrics.jsonl without wall-clock values
det() { sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput)[^"]*":[^,}]*,?//g' "$1/metrics.jsonl"; }

COMMON=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=2 actor_rollout_ref.rollout.n=2
        data.max_prompt_length=512 data.max_response_length=8 actor_rollout_ref.actor.ppo_mini_batch_size=2
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.entropy_coeff=0.01
        trainer.total_training_steps=2 trainer.test_freq=2 trainer.save_freq=-1 trainer.val_before_train=true actor_rollout_ref.rollout.tensor_model_parallel_size=1
        "trainer.logger=[]")
train() {  # train <out dir> <train file> <val file>
  "$KESTREL" train "${COMMON[@]}" "data.train_files=[$2]" "data.val_files=[$3]" trainer.default_local_dir="$1" \
    >"$W/log.txt" 2>&1 || fail "kestrel train with $2 failed"
}

train "$W/jsonl" "$D/gsm8k.jsonl" "$D/gsm8k.jsonl"
train "$W/parquet" "$D/gsm8k_snappy.parquet" "$D/gsm8k_zstd_v2.parquet"
grep -q '"val-core/openai/gsm8k' "$W/parquet/metrics.jsonl" || fail "no gsm8k validation metrics"
[ "$(det "$W/jsonl" | grep -c '"actor/')" = 2 ] || fail "expected 2 training steps in metrics.jsonl"
diff <(det "$W/jsonl") <(det "$W/parquet") || fail "Parquet metrics differ from the JSONL run's"
echo "parquet_train: 2 GRPO steps on Parquet equal the JSONL run"

# A wrong column fails in the schema check, before the model is materialised.
[ -e "$W/cache/model_tiny" ] || fail "no $W/cache/model_tiny after a run (did the cache layout change?)"
set +e
KESTREL_CACHE="$W/cache2" "$KESTREL" train "${COMMON[@]}" "data.train_files=[$D/gsm8k_snappy.parquet]" "data.val_files=[$D/gsm8k.jsonl]" \
  data.prompt_key=question trainer.default_local_dir="$W/bad" >"$W/log.txt" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] || fail "a missing prompt column was accepted"
grep -q "gsm8k_snappy.parquet: no column 'question'" "$W/log.txt" || fail "the error does not name the file and column"
grep -q "columns are: data_source, prompt, ability, reward_model, extra_info" "$W/log.txt" || fail "no column list"
[ ! -e "$W/cache2/model_tiny" ] || fail "the model was materialised before the data check"

# kestrel data inspect on Parquet and on JSONL.
"$KESTREL" data inspect "$D/gsm8k_snappy.parquet" --rows 2 >"$W/log.txt" 2>&1 || fail "data inspect (parquet) failed"
for want in "rows: 10 in 3 row groups (4, 4, 2)" "  prompt: optional group (LIST)" \
            "        content: optional BYTE_ARRAY (STRING)" "  extra_info.index: INT64, SNAPPY" "first 2 rows:" \
            '{"data_source":"openai/gsm8k","prompt":[{"role":"user","content":"Natalia sold'; do
  grep -qF -- "$want" "$W/log.txt" || fail "data inspect output lacks: $want"
done
[ "$(grep -c '^{"data_source"' "$W/log.txt")" = 2 ] || fail "data inspect --rows 2 printed another count of rows"
"$KESTREL" data inspect "$D/gsm8k.jsonl" --rows 1 >"$W/log.txt" 2>&1 || fail "data inspect (jsonl) failed"
grep -qF "rows: 10" "$W/log.txt" || fail "data inspect (jsonl): no row count"
grep -qF "keys of the first row: data_source, prompt, ability, reward_model, extra_info" "$W/log.txt" ||
  fail "data inspect (jsonl): no keys"
"$KESTREL" data --help | grep -q "usage: kestrel data inspect FILE" || fail "no data --help"
echo "parquet_train: OK (same metrics, early schema error, data inspect)"
