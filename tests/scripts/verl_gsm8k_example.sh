#!/usr/bin/env bash
# configs/examples/gsm8k_grpo.sh, verl's examples/grpo_trainer/
# run_qwen2-7b_math_megatron_trtllm.sh with only the launcher changed, runs 2
# GRPO steps on the built-in tiny model: its first argument (the rollout TP)
# and overrides appended ("${@:2}", as verl's script takes them) point it at a
# small GSM8K-layout file and shrink the batch. The data is JSONL: verl's
# gsm8k preprocessing writes parquet (its rows: data_source, prompt,
# ability, reward_model.ground_truth, extra_info), which Kestrel reads as JSONL.
# Usage: verl_gsm8k_example.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_CACHE="$W/cache" KESTREL_NO_PROGRESS=1 OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; cat "$W/log.txt"; exit 1; }

# Eight GSM8K-style rows (our own questions) in verl's gsm8k layout.
python3 - "$W" <<'PY'
import json, sys
qs = [("Tom has 3 boxes with 4 apples each. How many apples does he have?", "12"),
      ("A shop sells 5 pens for 2 dollars each. What do the pens cost?", "10"),
      ("Ann reads 6 pages a day for 7 days. How many pages does she read?", "42"),
      ("There are 20 birds and 8 fly away. How many are left?", "12"),
      ("Sam earns 9 dollars an hour and works 3 hours. What does he earn?", "27"),
      ("A class has 14 girls and 11 boys. How many pupils are there?", "25"),
      ("Lee had 50 stamps and gave 15 away. How many does he keep?", "35"),
      ("Each car has 4 wheels. How many wheels do 6 cars have?", "24")]
for split, rows in (("train", qs), ("test", qs[:4])):
    with open(f"{sys.argv[1]}/{split}.jsonl", "w") as f:
        for i, (q, a) in enumerate(rows):
            prompt = q + ' Let\'s think step by step and output the final answer after "####".'
            f.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": prompt}],
                                "ability": "math", "reward_model": {"style": "rule", "ground_truth": a},
                                "extra_info": {"split": split, "index": i, "answer": "#### " + a}}) + "\n")
PY

# `kestrel` on PATH is the binary under test; the script runs from an empty
# folder, so its --config-path=config has no ppo_megatron_trainer.yaml there.
mkdir -p "$W/bin" "$W/cwd"
ln -s "$KESTREL" "$W/bin/kestrel"
set +e
(cd "$W/cwd" && PATH="$W/bin:$PATH" ACTOR_TP=1 bash "$SRC/configs/examples/gsm8k_grpo.sh" 1 \
    actor_rollout_ref.model.path=builtin:tiny \
    data.train_files="$W/train.jsonl" data.val_files="$W/test.jsonl" \
    data.train_batch_size=2 data.max_prompt_length=96 data.max_response_length=16 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.rollout.n=2 trainer.total_training_steps=2 trainer.n_gpus_per_node=1 \
    trainer.default_local_dir="$W/ckpt") >"$W/log.txt" 2>&1
rc=$?
set -e
[ "$rc" = 0 ] || fail "the example exited with $rc"
grep -q "train: done, 2 steps" "$W/log.txt" || fail "no 2-step summary"
for note in "rollout.name has 'trtllm'" "rollout.mode has 'async'" "trainer.logger has 'wandb'"; do
  grep -q "$note" "$W/log.txt" || fail "missing notice: $note"
done
[ "$(grep -c '"training/global_step"' "$W/ckpt/metrics.jsonl")" = 2 ] || fail "metrics.jsonl lacks 2 steps"
ls "$W/ckpt/tensorboard" | grep -q . || fail "no TensorBoard events"

# Without trainer.n_gpus_per_node=1 the script's 8 x 1 processes do not match
# this single process: refused up front, saying what to do.
set +e
(cd "$W/cwd" && PATH="$W/bin:$PATH" ACTOR_TP=1 bash "$SRC/configs/examples/gsm8k_grpo.sh" 1 \
    actor_rollout_ref.model.path=builtin:tiny data.train_files="$W/train.jsonl" data.val_files="$W/test.jsonl" \
    data.train_batch_size=2 trainer.default_local_dir="$W/ckpt2") >"$W/log.txt" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] || fail "8 x 1 processes on a 1-process run was accepted"
grep -q "launch with mpirun -np 8 kestrel train" "$W/log.txt" || fail "the world-size error does not say what to do"
# A verl command without --config-name (main_ppo's default tree) names its
# data: it gets verl's defaults, not the built-in arith run, so its
# checkpoints land under verl's default trainer.default_local_dir.
(cd "$W/cwd" && "$KESTREL" train algorithm.adv_estimator=grpo data.train_files="$W/train.jsonl"     data.val_files="$W/test.jsonl" data.train_batch_size=2 data.max_prompt_length=96 data.max_response_length=8     actor_rollout_ref.model.path=builtin:tiny actor_rollout_ref.actor.ppo_mini_batch_size=2     actor_rollout_ref.rollout.n=2 actor_rollout_ref.rollout.tensor_model_parallel_size=1     actor_rollout_ref.actor.fsdp_config.param_offload=False trainer.total_training_steps=1     trainer.val_before_train=False) >"$W/log.txt" 2>&1 || fail "a verl-style command without --config-name"
[ -f "$W/cwd/checkpoints/verl_examples/gsm8k/metrics.jsonl" ] || fail "verl's default checkpoint folder was not used"
echo "verl_gsm8k_example: verl's GRPO script ran 2 steps with only the launcher changed"
