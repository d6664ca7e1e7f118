#!/usr/bin/env bash
# Deterministic mode (core/parallel_for.h; Megatron's
# override_transformer_config.deterministic_mode for train, KESTREL_DETERMINISTIC=1 for the others): GRPO training (rollout, scoring, update), and the
# rollout and scoring commands on their own, give the same bits at 1, 2 and 3
# threads. The default mode promises the same bits only at a fixed thread
# count (the GEMM library's threaded kernels split, and may round, per count).
# usage: bash tests/scripts/deterministic.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1
fail() { echo "deterministic: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -20 "$W/log.txt" >&2; exit 1; }
det() { sed -E 's/"(timing_s|perf\/time_per_step|perf\/throughput)[^"]*":[^,}]*,?//g' "$1/metrics.jsonl"; }

RL=(actor_rollout_ref.model.path=builtin:tiny data.train_batch_size=4 actor_rollout_ref.rollout.n=4
    data.max_response_length=16 data.val_max_samples=8 data.train_max_samples=64
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.entropy_coeff=0.01
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.optim.lr=1e-3
    trainer.total_training_steps=3 trainer.save_freq=3 trainer.test_freq=3 "trainer.logger=[]"
    +actor_rollout_ref.actor.megatron.override_transformer_config.deterministic_mode=true)
for t in 1 2 3; do
  OMP_NUM_THREADS=$t "$KESTREL" train "${RL[@]}" trainer.default_local_dir="$W/t$t" >"$W/log.txt" 2>&1 ||
    fail "train at $t threads"
done
grep -q "deterministic mode" "$W/log.txt" || fail "the GEMM line does not say deterministic mode"
for t in 2 3; do
  for f in actor/model/model.safetensors actor/optimizer_pp0.safetensors; do
    cmp -s "$W/t1/global_step_3/$f" "$W/t$t/global_step_3/$f" || fail "train: $f at $t threads differs from 1 thread"
  done
  diff <(det "$W/t1") <(det "$W/t$t") >/dev/null || fail "train: metrics at $t threads differ from 1 thread"
done
echo "deterministic: GRPO run bit-identical at 1, 2 and 3 threads"

# The commands without a config tree take the environment variable.
export KESTREL_DETERMINISTIC=1
M="$W/t1/global_step_3/actor/model"
cat >"$W/in.jsonl" <<'JSONL'
{"input_ids": [1, 5, 9, 33, 70, 2]}
{"input_ids": [4, 4, 80, 12, 61, 17, 90, 3, 8, 44]}
{"input_ids": [7]}
JSONL
for t in 1 3; do
  "$KESTREL" generate --model "$M" --input "$W/in.jsonl" --output "$W/gen$t.jsonl" --threads $t \
    temperature=1.0 response_length=24 n=4 >"$W/log.txt" 2>&1 || fail "generate at $t threads"
done
cmp -s "$W/gen1.jsonl" "$W/gen3.jsonl" || fail "generate: samples at 3 threads differ from 1 thread"
cp "$W/in.jsonl" "$W/ids.jsonl"
for t in 1 3; do
  "$KESTREL" logprobs --model "$M" --input "$W/ids.jsonl" --output "$W/lp$t.jsonl" --threads $t >"$W/log.txt" 2>&1 ||
    fail "logprobs at $t threads"
done
cmp -s "$W/lp1.jsonl" "$W/lp3.jsonl" || fail "logprobs at 3 threads differ from 1 thread"
echo "deterministic: generate and logprobs bit-identical at 1 and 3 threads"
echo "deterministic: passed"
