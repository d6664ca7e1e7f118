#!/usr/bin/env bash
# make fuzz FUZZ_SECONDS=N [FUZZ_TARGETS="a b"]: builds the fuzz preset and runs
# each libFuzzer target for N seconds, one after another, over its committed
# seeds (fuzz/corpus/<target>, read only) and a growing corpus of its own
# (build/fuzz/corpus/<target>). Crashes, leaks, timeouts (> 10 s per input)
# and out-of-memory (> 2 GB) land in build/fuzz/artifacts/. Prints one line a
# target (seconds, runs, corpus size, crashes) for docs/reliability.md.
set -uo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-600}
shift || true
TARGETS=("$@")
if [[ ${#TARGETS[@]} -eq 0 ]]; then
  for c in fuzz/corpus/*/; do TARGETS+=("$(basename "$c")"); done
fi
cmake --preset fuzz >/dev/null && cmake --build build/fuzz -j "${JOBS:-2}" --target fuzz_targets || exit 1
mkdir -p build/fuzz/artifacts build/fuzz/tmp
status=0
for t in "${TARGETS[@]}"; do
  mkdir -p "build/fuzz/corpus/$t"
  log=build/fuzz/artifacts/$t.log
  TMPDIR=$PWD/build/fuzz/tmp build/fuzz/fuzz/fuzz_$t -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$t-" "build/fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  crashes=$(ls build/fuzz/artifacts/"$t"-* 2>/dev/null | wc -l)
  echo "fuzz $t: ${SECS} s, ${execs:-?} runs, corpus $(ls "build/fuzz/corpus/$t" | wc -l) files, rc $rc, artifacts $crashes"
  [[ $rc -eq 0 ]] || { status=1; tail -30 "$log"; }
done
exit $status
