# Sourced by tests/scripts/*.sh. same_numbers A B REL: every line of JSONL file
# A holds the same count of numbers as the same line of B (keys removed), and
# they agree within REL x that line's largest |value| (so a line of log-probs
# is compared at its own scale). Prints the offending lines; returns non-zero.
same_numbers() {
  local a=$1 b=$2 rel=$3
  [[ -s "$b" ]] || { echo "$b is empty"; return 1; }
  [[ $(wc -l <"$a") -eq $(wc -l <"$b") ]] || { echo "line counts differ: $a vs $b"; return 1; }
  _nums() { sed -E 's/"[a-z_]+"//g' "$1" | tr -c '0-9eE.+\n-' ' '; }
  paste -d '|' <(_nums "$a") <(_nums "$b") | awk -F'|' -v rel="$rel" '
    { na = split($1, x, " "); nb = split($2, y, " ");
      if (na != nb) { printf "line %d: %d vs %d numbers\n", NR, na, nb; bad = 1; next }
      scale = 1e-30; err = 0;
      for (i = 1; i <= na; i++) { v = x[i] + 0; if (v < 0) v = -v; if (v > scale) scale = v;
                                  d = x[i] - y[i]; if (d < 0) d = -d; if (d > err) err = d }
      if (err > rel * scale) { printf "line %d: max error %g, scale %g\n", NR, err, scale; bad = 1 } }
    END { exit bad }'
}
