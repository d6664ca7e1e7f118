# Comparing two `kestrel train` runs, shared by the tests/scripts that check a
# parallel layout against one process. The caller defines KESTREL (the
# binary), W (its scratch folder), KEYS (the metrics to compare) and
# fail <message>.
#   same_metrics <run-a> <run-b> <what> [first-line]: every KEYS metric of every metrics.jsonl line (from
#     first-line on) within 1e-4 relative (of 0.01 for values below it: a KL near 0); both runs the same
#     number of lines, a key present in both or neither.
#   same_logprobs <model-a> <model-b> <what>: `kestrel logprobs` of two HF folders on two fixed sequences
#     within 1e-4 of each line's scale.

metric_at() {  # metric_at <run-dir> <line> <key>
  sed -n "${2}p" "$1/metrics.jsonl" | tr ',{}' '\n\n\n' | grep "\"$3\":" | sed -E 's/.*: *//' || true
}

same_metrics() {
  local n first=${4:-1}
  n=$(wc -l <"$1/metrics.jsonl")
  [[ $n == $(wc -l <"$2/metrics.jsonl") ]] || fail "$3: $n vs $(wc -l <"$2/metrics.jsonl") metric lines"
  for ((line = first; line <= n; line++)); do
    for k in $KEYS; do
      local a b
      a=$(metric_at "$1" "$line" "$k"); b=$(metric_at "$2" "$line" "$k")
      [[ -z "$a" && -z "$b" ]] && continue
      [[ -n "$a" && -n "$b" ]] || fail "$3: line $line $k: '$a' vs '$b'"
      awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; t = b < 0 ? -b : b;
        if (t > s) s = t; if (s < 1e-2) s = 1e-2; exit !(d <= 1e-4 * s) }' || fail "$3: line $line $k: $a vs $b"
    done
  done
}

compare_nums() { sed -E 's/"[a-z_]+"//g' "$1" | tr -c '0-9eE.+\n-' ' '; }

same_logprobs() {
  [[ -f "$W/ids.jsonl" ]] || printf '%s\n' '{"input_ids": [1, 5, 9, 33, 70, 2, 95, 200, 311, 17]}' \
    '{"input_ids": [4, 4, 4, 80, 12, 0, 61, 17, 90, 3, 3, 8, 44, 500]}' >"$W/ids.jsonl"
  "$KESTREL" logprobs --model "$1" --input "$W/ids.jsonl" --output "$W/a.jsonl" >"$W/log.txt" 2>&1 || fail "$3: logprobs $1"
  "$KESTREL" logprobs --model "$2" --input "$W/ids.jsonl" --output "$W/b.jsonl" >"$W/log.txt" 2>&1 || fail "$3: logprobs $2"
  paste -d '|' <(compare_nums "$W/a.jsonl") <(compare_nums "$W/b.jsonl") | awk -F'|' -v what="$3" '
    { na = split($1, a, " "); nb = split($2, b, " ");
      if (na != nb) { printf "%s: line %d: %d vs %d numbers\n", what, NR, na, nb; bad = 1; next }
      scale = 1e-30; err = 0;
      for (i = 1; i <= na; i++) { v = a[i] + 0; if (v < 0) v = -v; if (v > scale) scale = v;
                                  d = a[i] - b[i]; if (d < 0) d = -d; if (d > err) err = d }
      if (err > 1e-4 * scale) { printf "%s: line %d: max error %g, scale %g\n", what, NR, err, scale; bad = 1 } }
    END { exit bad }' || fail "$3: the saved weights differ"
}
