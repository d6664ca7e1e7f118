#!/usr/bin/env bash
# kestrel generate on MoE and MLA model folders (the transformers goldens
# Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, DeepSeek-V3, f32 and bf16): token-id
# prompts generate n samples each with every output field; greedy output is
# reproducible and the same with chunked prefill in small blocks and without
# prefix caching; the DeepSeek folders (MLA) size their latent KV cache from
# gpu_memory_utilization like a dense model.
# Usage: moe_generate.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

# Prompts 0 and 1 share a 9-token prefix (prefix-cache hits); all ids are in the goldens' 96-token vocabulary.
printf '%s\n' '{"input_ids": [5, 17, 33, 21, 9, 10, 11, 40, 41, 7, 8]}' \
  '{"input_ids": [5, 17, 33, 21, 9, 10, 11, 40, 41, 60, 61, 62, 63, 64]}' \
  '{"input_ids": [70]}' > "$W/in.jsonl"

gen() {  # gen <folder> <output> [args...]
  local dir=$1 out=$2
  shift 2
  "$KESTREL" generate --model "$dir" --input "$W/in.jsonl" --output "$out" --quiet response_length=8 ignore_eos=true \
    "$@" 2>"$W/err.txt" || { cat "$W/err.txt"; fail "generate on $dir failed"; }
}

for name in qwen2_moe qwen3_moe deepseek_v2 deepseek_v3; do
  for variant in "" _bf16; do
    dir="$ROOT/tests/golden/models/$name$variant"
    dtype=float32
    [ -n "$variant" ] && dtype=bfloat16
    what="$name$variant ($dtype)"
    gen "$dir" "$W/g1.jsonl" dtype="$dtype" temperature=0
    [ "$(wc -l < "$W/g1.jsonl")" = 3 ] || fail "$what: expected 3 output lines"
    for key in prompt_ids outputs token_ids logprobs finish_reason; do
      grep -q "\"$key\"" "$W/g1.jsonl" || fail "$what: output lacks \"$key\""
    done
    # 8 tokens per prompt (ignore_eos): 3 x 8 ids in the token_ids lists.
    n_ids=$(grep -o '"token_ids":\[[0-9,]*\]' "$W/g1.jsonl" | sed 's/.*\[//; s/\]//' | tr ',' '\n' | grep -c .)
    [ "$n_ids" = 24 ] || fail "$what: expected 24 generated ids, got $n_ids"
    gen "$dir" "$W/g2.jsonl" dtype="$dtype" temperature=0
    cmp -s "$W/g1.jsonl" "$W/g2.jsonl" || fail "$what: greedy generation is not reproducible"
    # Chunked prefill of 3-token chunks in 4-token blocks, no prefix caching: the same tokens.
    gen "$dir" "$W/g3.jsonl" dtype="$dtype" temperature=0 max_num_batched_tokens=3 block_size=4 \
      enable_prefix_caching=false
    diff <(grep -o '"token_ids":\[[0-9,]*\]' "$W/g1.jsonl") <(grep -o '"token_ids":\[[0-9,]*\]' "$W/g3.jsonl") \
      >/dev/null || fail "$what: chunked prefill changed the greedy tokens"
    # n = 3 seeded samples per prompt, reproducible.
    gen "$dir" "$W/s1.jsonl" dtype="$dtype" temperature=1 n=3 seed=7
    gen "$dir" "$W/s2.jsonl" dtype="$dtype" temperature=1 n=3 seed=7
    cmp -s "$W/s1.jsonl" "$W/s2.jsonl" || fail "$what: seeded sampling is not reproducible"
    [ "$(grep -o '"finish_reason"' "$W/s1.jsonl" | wc -l)" = 9 ] || fail "$what: expected 3 x 3 samples"
  done
done

# The latent cache is sized from gpu_memory_utilization: kv = 0.8 x memory -
# weights; a block of 16 tokens holds 3 layers x (16 + 8) latent values x 4
# bytes = 4608 bytes (GQA of the same width would take 5.3 times that).
run_tiny() {  # run_tiny <memory bytes>: must fail; the message lands in err.txt
  KESTREL_DEVICE_MEMORY=$1 "$KESTREL" generate --model "$ROOT/tests/golden/models/deepseek_v3" --input "$W/in.jsonl" \
    --output "$W/tiny.jsonl" --quiet gpu_memory_utilization=0.8 2>"$W/err.txt" && fail "memory $1 should not hold a cache"
  true
}
run_tiny 300000
grep -q "blocks of 4608 bytes" "$W/err.txt" || fail "the latent cache's block should be 4608 bytes: $(cat "$W/err.txt")"
run_tiny 100000
grep -q "gpu_memory_utilization" "$W/err.txt" || fail "the error should name gpu_memory_utilization: $(cat "$W/err.txt")"
[ ! -e "$W/tiny.jsonl" ] || fail "a failed run must not leave an output file"
echo "moe_generate: OK"
