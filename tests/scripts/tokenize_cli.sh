#!/usr/bin/env bash
# kestrel tokenize: plain text and chat (with the generation prompt) agree with
# each other on the built-in tokenizer, and a bad line names file:line.
# Usage: tokenize_cli.sh <kestrel-binary> <build-dir>
set -euo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$KESTREL" builtin tokenizer --out "$W/tok" >/dev/null
[ -f "$W/tok/tokenizer.json" ] && [ -f "$W/tok/tokenizer_config.json" ] || fail "tokenizer files missing"

printf '%s\n' '{"text": "<|im_start|>user\nWhat is 12 + 305?<|im_end|>\n<|im_start|>assistant\n"}' \
  '{"text": "317"}' > "$W/text.jsonl"
printf '%s\n' '{"messages": [{"role": "user", "content": "What is 12 + 305?"}]}' > "$W/chat.jsonl"
"$KESTREL" tokenize --tokenizer "$W/tok" --input "$W/text.jsonl" --output "$W/text_ids.jsonl" 2>/dev/null
"$KESTREL" tokenize --tokenizer "$W/tok" --input "$W/chat.jsonl" --output "$W/chat_ids.jsonl" --chat \
  --add-generation-prompt 2>/dev/null
[ "$(sed -n 1p "$W/text_ids.jsonl")" = "$(cat "$W/chat_ids.jsonl")" ] || fail "chat template and text differ"
# Digits are single tokens: "317" is three ids.
sed -n 2p "$W/text_ids.jsonl" | grep -Eq '^\{"input_ids":\[[0-9]+,[0-9]+,[0-9]+\]\}$' \
  || fail "317 should be three tokens: $(sed -n 2p "$W/text_ids.jsonl")"
# Without the generation prompt the chat is shorter by the assistant header.
"$KESTREL" tokenize --tokenizer "$W/tok" --input "$W/chat.jsonl" --output "$W/chat2.jsonl" --chat 2>/dev/null
n1=$(grep -o ',' "$W/chat_ids.jsonl" | wc -l); n2=$(grep -o ',' "$W/chat2.jsonl" | wc -l)
[ $((n1 - n2)) -ge 2 ] || fail "add-generation-prompt should add the assistant header"

printf '%s\n' '{"text": "ok"}' '{"txt": "bad"}' > "$W/bad.jsonl"
if "$KESTREL" tokenize --tokenizer "$W/tok" --input "$W/bad.jsonl" --output "$W/bad_ids.jsonl" 2>"$W/err.txt"; then
  fail "a bad line should fail"
fi
grep -q "bad.jsonl:2: field 'text'" "$W/err.txt" || fail "error should name bad.jsonl:2: $(cat "$W/err.txt")"
[ ! -e "$W/bad_ids.jsonl" ] || fail "no output file may appear on failure"
echo "tokenize_cli: OK"
