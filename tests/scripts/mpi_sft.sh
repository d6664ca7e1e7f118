#!/usr/bin/env bash
# `kestrel sft` under mpirun equals one process: a short SFT run (built-in
# tiny model, built-in arith data, 3 steps, validation at the end) on one
# process, then under mpirun as PP2, TP2, DP2, interleaved PP2 x VPP2, CP2
# (ring, and Ulysses by verl's ulysses_sequence_parallel_size), and PP2 x DP2,
# PP2 x TP2 and CP2 x PP2 on 4 ranks (trainer.tensor_model_parallel_size /
# pipeline_model_parallel_size / virtual_pipeline_model_parallel_size /
# context_parallel_size, dp = world / (tp * pp * cp)). Each run's per-step train/loss and its val/loss in
# metrics.jsonl must be within 1e-5 relative of one process's, and the final
# checkpoint's weights (and, for PP2, the HF export) must give one process's
# log-probs within 1e-4 of each line's scale. A PP2 run stopped at a
# checkpoint and resumed under PP2 ends bit for bit equal to an uninterrupted
# one (weights and both stages' optimizer files), and a PP2 checkpoint
# resumes in one process, equal to one process throughout. Layouts that do
# not fit the launch fail with a message naming the sizes.
# usage: bash tests/scripts/mpi_sft.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=${1:?usage: $0 <kestrel-binary> <build-dir>}
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_sft "$BUILD"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KESTREL_NO_PROGRESS=1
fail() { echo "mpi_sft: FAILED: $*" >&2; [[ -f "$W/log.txt" ]] && tail -30 "$W/log.txt" >&2; exit 1; }

# Micro-batches by a 200-token budget: 4-6 per step, so the pipeline runs 1F1B
# with several in flight. Adam's eps 1e-5 keeps summation-order noise in
# near-zero gradients from becoming lr-sized steps (as mpi_train.sh does).
COMMON=(model.partial_pretrain=builtin:tiny data.arith.num_train=64 data.arith.num_test=8 data.train_batch_size=8
        data.max_token_len_per_gpu=200 optim.lr=2e-3 optim.eps=1e-5 trainer.threads=1 trainer.test_freq=3
        "trainer.logger=[file]" trainer.resume_mode=disable)
single() { "$KESTREL" sft "${COMMON[@]}" "$@" >"$W/log.txt" 2>&1 || fail "single process: $*"; }
multi() {  # multi <np> args...
  local np=$1; shift
  timeout -k 5 300 mpirun -np "$np" --oversubscribe --bind-to none "$KESTREL" sft "${COMMON[@]}" "$@" \
    >"$W/log.txt" 2>&1 || fail "mpirun -np $np: $*"
}

# train/loss of every step, then val/loss, one number a line.
losses() { grep -o '"\(train\|val\)/loss":[-0-9.eE+]*' "$1/metrics.jsonl" | cut -d: -f2; }
same_losses() {  # same_losses <run-a> <run-b> <what>
  [[ $(losses "$1" | wc -l) -ge 4 ]] || fail "$3: metrics.jsonl of $1 holds too few losses"
  paste <(losses "$1") <(losses "$2") | awk -v what="$3" '
    { d = $1 - $2; if (d < 0) d = -d; s = $1 < 0 ? -$1 : $1;
      if (NF != 2 || d > 1e-5 * s) { printf "%s: loss %d: %s vs %s\n", what, NR, $1, $2; bad = 1 } }
    END { exit bad }' || fail "$3: losses differ from one process"
}
cat >"$W/ids.jsonl" <<'JSONL'
{"input_ids": [1, 5, 9, 33, 70, 2, 15, 20, 31, 17]}
{"input_ids": [4, 4, 4, 8, 12, 0, 6, 17, 9, 3, 3, 8, 44, 5]}
JSONL
nums() { sed -E 's/"[a-z_]+"//g' "$1" | tr -c '0-9eE.+\n-' ' '; }
same_weights() {  # same_weights <model-folder-a> <model-folder-b> <what>
  "$KESTREL" logprobs --model "$1" --input "$W/ids.jsonl" --output "$W/a.jsonl" >/dev/null 2>&1 || fail "$3: logprobs $1"
  "$KESTREL" logprobs --model "$2" --input "$W/ids.jsonl" --output "$W/b.jsonl" >/dev/null 2>&1 || fail "$3: logprobs $2"
  paste -d '|' <(nums "$W/a.jsonl") <(nums "$W/b.jsonl") | awk -F'|' -v what="$3" '
    { na = split($1, a, " "); nb = split($2, b, " ");
      if (na != nb || na == 0) { printf "%s: line %d: %d vs %d numbers\n", what, NR, na, nb; bad = 1; next }
      scale = 1e-30; err = 0;
      for (i = 1; i <= na; i++) { v = a[i] + 0; if (v < 0) v = -v; if (v > scale) scale = v;
                                  d = a[i] - b[i]; if (d < 0) d = -d; if (d > err) err = d }
      if (err > 1e-4 * scale) { printf "%s: line %d: max error %g, scale %g\n", what, NR, err, scale; bad = 1 } }
    END { exit bad }' || fail "$3: final weights differ from one process"
}

S3=(trainer.total_training_steps=3 trainer.save_freq=3)
single "${S3[@]}" trainer.default_local_dir="$W/one" trainer.export_dir="$W/one/hf"
PP=(trainer.pipeline_model_parallel_size=2)
for layout in pp2 tp2 dp2 pp2_vpp2 pp2_dp2 pp2_tp2 cp2 cp2_ulysses cp2_pp2; do
  np=2
  case $layout in
    pp2) extra=("${PP[@]}" trainer.export_dir="$W/$layout/hf") ;;
    tp2) extra=(trainer.tensor_model_parallel_size=2) ;;
    dp2) extra=() ;;
    # Two chunks per rank; 4 micro-batches of 2 samples a step (a multiple of pp: interleaved, no fallback).
    pp2_vpp2) extra=("${PP[@]}" trainer.virtual_pipeline_model_parallel_size=2 data.use_dynamic_bsz=false
                     data.micro_batch_size_per_gpu=2) ;;
    pp2_dp2) np=4 extra=("${PP[@]}") ;;
    pp2_tp2) np=4 extra=("${PP[@]}" trainer.tensor_model_parallel_size=2) ;;
    # Context parallelism: every sequence split over 2 ranks (ring; verl's Ulysses key), and CP2 x PP2.
    cp2) extra=(trainer.context_parallel_size=2) ;;
    cp2_ulysses) extra=(ulysses_sequence_parallel_size=2) ;;
    cp2_pp2) np=4 extra=(trainer.context_parallel_size=2 "${PP[@]}") ;;
  esac
  multi "$np" "${S3[@]}" trainer.default_local_dir="$W/$layout" "${extra[@]}"
  [[ -f "$W/$layout/global_step_3/model/model.safetensors" ]] || fail "$layout: no checkpoint weights"
  [[ -f "$W/$layout/global_step_3/model/tokenizer.json" ]] || fail "$layout: no tokenizer next to the weights"
  same_losses "$W/one" "$W/$layout" "$layout"
  same_weights "$W/one/global_step_3/model" "$W/$layout/global_step_3/model" "$layout"
  echo "mpi_sft: $layout equals one process"
done
# One optimizer file per pipeline stage; the HF export is one folder from both stages.
for s in 0 1; do
  [[ -f "$W/pp2/global_step_3/optimizer_pp$s.safetensors" ]] || fail "pp2: stage $s's optimizer file missing"
done
same_weights "$W/one/hf" "$W/pp2/hf" "pp2 export (trainer.export_dir)"
[[ -f "$W/pp2/hf/tokenizer.json" ]] || fail "pp2: the export lacks tokenizer.json"
[[ $(grep -c '"step"' "$W/pp2/metrics.jsonl") == 3 ]] || fail "pp2: metrics.jsonl should hold 3 steps (one writer)"

# Resume. A constant schedule, so a 2-step run's learning rates are a 4-step run's first two.
R=(optim.lr_scheduler=constant optim.warmup_steps_ratio=0 trainer.save_freq=2 trainer.test_freq=2)
RESUME=("${COMMON[@]/trainer.resume_mode=disable/trainer.resume_mode=auto}" "${R[@]}" trainer.total_training_steps=4)
multi 2 "${R[@]}" "${PP[@]}" trainer.total_training_steps=4 trainer.default_local_dir="$W/full"
multi 2 "${R[@]}" "${PP[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$W/resumed"
timeout -k 5 300 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" sft "${RESUME[@]}" "${PP[@]}" \
  trainer.default_local_dir="$W/resumed" >"$W/log.txt" 2>&1 || fail "resume under PP2"
grep -q "resumed from .*global_step_2 " "$W/log.txt" || fail "the PP2 run did not resume from step 2"
for f in model/model.safetensors optimizer_pp0.safetensors optimizer_pp1.safetensors; do
  cmp "$W/full/global_step_4/$f" "$W/resumed/global_step_4/$f" || fail "PP2 resumed under PP2: $f differs"
done
[[ $(grep -c '"step"' "$W/resumed/metrics.jsonl") == 4 ]] || fail "the resumed metrics.jsonl should hold 4 steps"
echo "mpi_sft: a PP2 run resumed under PP2 is bit-identical to an uninterrupted one"

# A PP2 checkpoint resumed in one process: equal to one process's 4 steps.
single "${R[@]}" trainer.total_training_steps=4 trainer.default_local_dir="$W/one4"
multi 2 "${R[@]}" "${PP[@]}" trainer.total_training_steps=2 trainer.default_local_dir="$W/pp2_to_one"
"$KESTREL" sft "${RESUME[@]}" trainer.default_local_dir="$W/pp2_to_one" >"$W/log.txt" 2>&1 || fail "PP2 -> one process"
grep -q "resumed from .*global_step_2 " "$W/log.txt" || fail "the one-process run did not resume the PP2 checkpoint"
same_losses "$W/one4" "$W/pp2_to_one" "PP2 checkpoint resumed in one process"
same_weights "$W/one4/global_step_4/model" "$W/pp2_to_one/global_step_4/model" "PP2 checkpoint resumed in one process"
echo "mpi_sft: a PP2 checkpoint resumed in one process equals one process"

# Layouts that do not fit the launch.
if "$KESTREL" sft "${COMMON[@]}" "${PP[@]}" trainer.default_local_dir="$W/bad" >"$W/log.txt" 2>&1; then
  fail "pp 2 in one process should fail"
fi
grep -q "trainer.pipeline_model_parallel_size=2 .* must divide the number of processes (1)" "$W/log.txt" \
  || fail "pp 2 in one process: the message does not name the sizes"
if timeout -k 5 120 mpirun -np 2 --oversubscribe --bind-to none "$KESTREL" sft "${COMMON[@]}" "${PP[@]}" \
     trainer.tensor_model_parallel_size=2 trainer.default_local_dir="$W/bad" >"$W/log.txt" 2>&1; then
  fail "tp 2 x pp 2 on 2 ranks should fail"
fi
grep -q "= 4 ranks per model replica must divide the number of processes (2)" "$W/log.txt" \
  || fail "tp 2 x pp 2 on 2 ranks: the message does not name the sizes"
if "$KESTREL" sft "${COMMON[@]}" trainer.virtual_pipeline_model_parallel_size=2 trainer.default_local_dir="$W/bad" \
     >"$W/log.txt" 2>&1; then
  fail "vpp 2 without pp should fail"
fi
grep -q "needs trainer.pipeline_model_parallel_size > 1" "$W/log.txt" || fail "vpp 2 without pp: the message"

echo "mpi_sft: OK"
