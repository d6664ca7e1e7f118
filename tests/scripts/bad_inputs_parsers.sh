#!/usr/bin/env bash
# The parser half of issue 20's bad-input table: each case is a bad file or
# flag, the command a user runs on it, and the assertions: a non-zero exit, no
# crash signal or timeout, a message naming the file/key/line (and the limit),
# and no output under the final name. (Config/CLI/output cases:
# tests/scripts/bad_inputs.sh.)
# Usage: bad_inputs_parsers.sh <kestrel-binary> <build-dir>
set -uo pipefail
KESTREL=$1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0 n=0

# case NAME EXPECTED_MESSAGE OUTPUT_THAT_MUST_NOT_EXIST -- COMMAND...
case_() {
  local name=$1 want=$2 out=$3
  shift 4
  n=$((n + 1))
  timeout 120 "$@" >"$W/stdout" 2>"$W/stderr"
  local rc=$?
  local why=""
  if [[ $rc -eq 0 ]]; then why="exit 0"
  elif [[ $rc -eq 124 ]]; then why="timed out (120 s)"
  elif [[ $rc -ge 128 ]]; then why="killed by signal $((rc - 128))"
  elif ! grep -qF -- "$want" "$W/stderr"; then why="message lacks '$want'"
  elif [[ -n $out && -e $out ]]; then why="left $out"
  fi
  if [[ -n $why ]]; then
    echo "FAIL $name: $why; stderr: $(head -c 600 "$W/stderr")"
    fails=$((fails + 1))
  else
    echo "ok   $name (exit $rc)"
  fi
}

"$KESTREL" builtin tokenizer --out "$W/tok" >/dev/null || { echo "FAIL: builtin tokenizer"; exit 1; }
"$KESTREL" builtin model tiny --out "$W/m" --seed 3 >/dev/null || { echo "FAIL: builtin model"; exit 1; }
printf '%s\n' '{"text": "12 + 3"}' >"$W/in.jsonl"
printf '%s\n' '{"input_ids": [1, 2, 3]}' >"$W/ids.jsonl"

# A tokenizer folder with one edit to tokenizer.json (python: JSON in, JSON out).
tok_with() {  # DIR PYTHON-EXPR-ON-j
  cp -r "$W/tok" "$1"
  python3 - "$1/tokenizer.json" "$2" <<'PY'
import json, sys
p, expr = sys.argv[1], sys.argv[2]
j = json.load(open(p))
exec(expr)
json.dump(j, open(p, "w"))
PY
}
tok_with "$W/t_neg" 'j["model"]["vocab"]["zz"] = -3'
case_ tokenizer_negative_id 't_neg/tokenizer.json: model.vocab token "zz" has id -3, outside the id range' "$W/o1.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/t_neg" --input "$W/in.jsonl" --output "$W/o1.jsonl"
tok_with "$W/t_big" 'j["model"]["vocab"]["zz"] = 2**40'
case_ tokenizer_id_2pow40 'model.vocab token "zz" has id 1099511627776' "$W/o2.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/t_big" --input "$W/in.jsonl" --output "$W/o2.jsonl"
for bad in -5 100000; do
  tok_with "$W/t_add$bad" "j['added_tokens'][0]['id'] = $bad"
  case_ "tokenizer_added_id_$bad" "t_add$bad/tokenizer.json: added_tokens: added token" "$W/o3.jsonl" -- \
    "$KESTREL" tokenize --tokenizer "$W/t_add$bad" --input "$W/in.jsonl" --output "$W/o3.jsonl"
done
python3 -c 'print("{\"model\": " + "[" * 100000 + "]" * 100000 + "}")' >"$W/deep.json"
mkdir -p "$W/t_deep" && cp "$W/deep.json" "$W/t_deep/tokenizer.json"
case_ tokenizer_deep_json 't_deep/tokenizer.json: JSON nested deeper than 256 levels' "$W/o4.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/t_deep" --input "$W/in.jsonl" --output "$W/o4.jsonl"

# Chat templates (tokenizer_config.json's chat_template) under the sandbox limits.
tmpl_with() {  # DIR TEMPLATE
  cp -r "$W/tok" "$1"
  python3 - "$1/tokenizer_config.json" "$2" <<'PY'
import json, sys
p = sys.argv[1]
j = json.load(open(p))
j["chat_template"] = sys.argv[2]
json.dump(j, open(p, "w"))
PY
}
printf '%s\n' '{"messages": [{"role": "user", "content": "hi"}]}' >"$W/chat.jsonl"
tmpl_with "$W/c_deep" "$(python3 -c 'print("{% if true %}" * 5000 + "x" + "{% endif %}" * 5000)')"
case_ template_nested_5000 'chat_template: chat template line 1, col' "$W/o5.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/c_deep" --input "$W/chat.jsonl" --output "$W/o5.jsonl" --chat
grep -qF 'nested deeper than 500 levels (the chat template limit)' "$W/stderr" || { echo "FAIL template_nested_5000: limit not named"; fails=$((fails + 1)); }
tmpl_with "$W/c_big" '{{ "x" * 1000000000 }}'
case_ template_huge_string 'exceeds the chat template limit of 16 MiB' "$W/o6.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/c_big" --input "$W/chat.jsonl" --output "$W/o6.jsonl" --chat
tmpl_with "$W/c_loop" '{% for a in range(100000) %}{% for b in range(100000) %}.{% endfor %}{% endfor %}'
case_ template_endless_loops 'loop iterations in one render (the chat template limit' "$W/o7.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/c_loop" --input "$W/chat.jsonl" --output "$W/o7.jsonl" --chat
grep -qF "c_loop: chat template" "$W/stderr" || { echo "FAIL template_endless_loops: the template's folder is not named"; fails=$((fails + 1)); }

# JSONL rows.
{ echo '{"text": "ok"}'; python3 -c 'print("{\"text\": " + "[" * 100000 + "]" * 100000 + "}")'; } >"$W/deep_row.jsonl"
case_ jsonl_row_nested_100000 'deep_row.jsonl:2: JSON nested deeper than 256 levels' "$W/o8.jsonl" -- \
  "$KESTREL" tokenize --tokenizer "$W/tok" --input "$W/deep_row.jsonl" --output "$W/o8.jsonl"

# YAML configs and override values.
printf 'trainer:\n  a: &a [*a]\n' >"$W/self.yaml"
case_ yaml_self_alias 'self.yaml:2: YAML nested deeper than 64 levels once aliases expand' "" -- \
  "$KESTREL" config show --config "$W/self.yaml"
python3 - "$W/laughs.yaml" <<'PY'
import sys
t = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
for p, q in zip("abcdefgh", "bcdefghi"):
    t += "%s: &%s [%s]\n" % (q, q, ", ".join(["*" + p] * 9))
open(sys.argv[1], "w").write(t)
PY
case_ yaml_billion_laughs 'YAML expands to more than 50000 nodes once aliases expand' "" -- \
  "$KESTREL" config show --config "$W/laughs.yaml"
grep -qF "laughs.yaml:" "$W/stderr" || { echo "FAIL yaml_billion_laughs: file not named"; fails=$((fails + 1)); }
case_ override_self_alias 'YAML nested deeper than 64 levels' "" -- \
  "$KESTREL" config show 'data.train_files=[&a [*a]]'

# Model files: a float tensor whose header says I32; a deep safetensors header and config.json.
cp -r "$W/m" "$W/m_i32"
python3 - "$W/m_i32/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
name = next(k for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32")
h[name]["dtype"] = "I32"  # same width: the offsets stay valid
t = json.dumps(h, separators=(",", ":")).encode()
t += b" " * (n - len(t)) if len(t) <= n else b""
assert len(t) == n, "header grew"
open(p, "wb").write(b[:8] + t + b[8 + n:])
PY
case_ safetensors_f32_as_i32 "is stored as I32 but is read as" "$W/o9.jsonl" -- \
  "$KESTREL" logprobs --model "$W/m_i32" --input "$W/ids.jsonl" --output "$W/o9.jsonl"
grep -qF "m_i32/model.safetensors: tensor '" "$W/stderr" || { echo "FAIL safetensors_f32_as_i32: file/tensor not named"; fails=$((fails + 1)); }
cp -r "$W/m" "$W/m_deepcfg" && cp "$W/deep.json" "$W/m_deepcfg/config.json"
case_ config_json_deep 'm_deepcfg/config.json: JSON nested deeper than 256 levels' "$W/o10.jsonl" -- \
  "$KESTREL" logprobs --model "$W/m_deepcfg" --input "$W/ids.jsonl" --output "$W/o10.jsonl"

# Flags.
case_ threads_65536 '--threads 65536 is out of range' "$W/o11.jsonl" -- \
  "$KESTREL" logprobs --model "$W/m" --input "$W/ids.jsonl" --output "$W/o11.jsonl" --threads 65536
case_ omp_num_threads_65536 'OMP_NUM_THREADS=65536 is out of range' "$W/o12.jsonl" -- \
  env OMP_NUM_THREADS=65536 "$KESTREL" logprobs --model "$W/m" --input "$W/ids.jsonl" --output "$W/o12.jsonl"
case_ train_omp_num_threads_65536 'kestrel train: OMP_NUM_THREADS=65536 is out of range' "$W/train_out" -- \
  env OMP_NUM_THREADS=65536 "$KESTREL" train trainer.default_local_dir="$W/train_out" trainer.total_training_steps=1
case_ sft_omp_num_threads_65536 'kestrel sft: OMP_NUM_THREADS=65536 is out of range' "$W/sft_out" -- \
  env OMP_NUM_THREADS=65536 "$KESTREL" sft trainer.default_local_dir="$W/sft_out"
case_ arith_num_train_1e10 'builtin arith: num_train = 10000000000 is out of range [0, 1000000]' "$W/arith/train.jsonl" -- \
  "$KESTREL" builtin arith --out "$W/arith" --num-train 10000000000

echo "bad_inputs_parsers: $((n - fails)) of $n cases ok"
[[ $fails -eq 0 ]]
