#!/usr/bin/env bash
# kestrel generate: prompts given as token ids, as text and as chat messages
# (the model folder's tokenizer and chat template) generate; the text and the
# messages forms give the ids `kestrel tokenize` gives; greedy output is
# reproducible and the output file carries every field; a bad line names
# file:line and writes no output.
# Usage: generate_cli.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_NUM_THREADS=1

"$KESTREL" builtin model tiny --out "$W/m" --seed 3 >/dev/null
[ -f "$W/m/tokenizer.json" ] || fail "the built-in model folder has no tokenizer"
printf '%s\n' '{"input_ids": [5, 17, 33, 2]}' \
  '{"prompt": "Tom has 3 apples."}' \
  '{"messages": [{"role": "user", "content": "What is 12 + 305?"}]}' > "$W/in.jsonl"
run() { "$KESTREL" generate --model "$W/m" --input "$W/in.jsonl" --output "$1" temperature=0 response_length=6 \
          2>"$W/err.txt" || { cat "$W/err.txt"; fail "generate failed"; }; }
run "$W/out.jsonl"
[ "$(wc -l < "$W/out.jsonl")" = 3 ] || fail "expected 3 output lines"
for key in prompt_ids outputs token_ids logprobs finish_reason; do
  grep -q "\"$key\"" "$W/out.jsonl" || fail "output lacks \"$key\""
done
sed -n 2p "$W/out.jsonl" | grep -q '"text"' || fail "a text prompt's output should carry the decoded text"
# The prompt ids of the text and chat forms are the tokenizer's.
printf '%s\n' '{"text": "Tom has 3 apples."}' > "$W/t.jsonl"
"$KESTREL" tokenize --tokenizer "$W/m" --input "$W/t.jsonl" --output "$W/t_ids.jsonl" 2>/dev/null
printf '%s\n' '{"messages": [{"role": "user", "content": "What is 12 + 305?"}]}' > "$W/c.jsonl"
"$KESTREL" tokenize --tokenizer "$W/m" --input "$W/c.jsonl" --output "$W/c_ids.jsonl" --chat --add-generation-prompt 2>/dev/null
ids() { grep -o "\"$2\":\[[0-9,]*\]" "$1" | head -1 | sed 's/.*\[//; s/\]//'; }
[ "$(sed -n 2p "$W/out.jsonl" > "$W/l2"; ids "$W/l2" prompt_ids)" = "$(ids "$W/t_ids.jsonl" input_ids)" ] \
  || fail "text prompt ids differ from kestrel tokenize"
[ "$(sed -n 3p "$W/out.jsonl" > "$W/l3"; ids "$W/l3" prompt_ids)" = "$(ids "$W/c_ids.jsonl" input_ids)" ] \
  || fail "chat prompt ids differ from kestrel tokenize --chat --add-generation-prompt"
# Greedy is reproducible.
run "$W/out2.jsonl"
cmp -s "$W/out.jsonl" "$W/out2.jsonl" || fail "greedy generation is not reproducible"
# A bad line: the error names file:line, and no output file appears.
printf '%s\n' '{"input_ids": [1, 2]}' '{"prompt": 42}' > "$W/bad.jsonl"
if "$KESTREL" generate --model "$W/m" --input "$W/bad.jsonl" --output "$W/bad_out.jsonl" 2>"$W/err.txt"; then
  fail "a bad line should fail"
fi
grep -q "bad.jsonl:2" "$W/err.txt" || fail "the error should name bad.jsonl:2: $(cat "$W/err.txt")"
[ ! -e "$W/bad_out.jsonl" ] || fail "a failed run must not leave an output file"
echo "generate_cli: OK"
