#!/usr/bin/env bash
# CI smoke of the libFuzzer targets (fuzz/, docs/reliability.md): builds the
# `fuzz` preset (clang, ASan + UBSan, only the libraries the targets link) and
# runs each target for FUZZ_SMOKE_SECONDS (default 4) over its committed seed
# corpus, so a broken harness, a seed that crashes again (the regression
# seeds of issue 20 included) or a sanitizer report fails the test. New inputs
# go to a scratch folder, never into fuzz/corpus. Long runs: make fuzz.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${FUZZ_SMOKE_SECONDS:-4}
command -v clang++ >/dev/null || { echo "fuzz_smoke: clang++ not found; run scripts/install_deps.sh (clang, libclang-rt-14-dev)" >&2; exit 1; }
t0=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build build/fuzz -j "${FUZZ_JOBS:-2}" --target fuzz_targets >/dev/null
t1=$(date +%s)
echo "fuzz_smoke: built the fuzz targets in $((t1 - t0)) s"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail=0
for c in fuzz/corpus/*/; do
  name=$(basename "$c")
  bin=build/fuzz/fuzz/fuzz_$name
  [[ -x $bin ]] || { echo "fuzz_smoke: $bin missing (fuzz/CMakeLists.txt lists every corpus folder's target)" >&2; fail=1; continue; }
  mkdir -p "$scratch/$name"
  # -timeout: one input may not take longer (a hang is a finding);
  # -rss_limit_mb: the memory bounds of issue 20 (billion laughs, "x" * 10^9) hold.
  if ! TMPDIR=$scratch "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$scratch/$name-" "$scratch/$name" "$c" >"$scratch/$name.log" 2>&1; then
    echo "fuzz_smoke: $name FAILED; the log's end:" >&2
    tail -40 "$scratch/$name.log" >&2
    ls "$scratch"/"$name"-* 2>/dev/null | sed 's/^/  crashing input: /' >&2 || true
    fail=1
    continue
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$name.log" | grep -o '[0-9]*$' || echo '?')
  echo "fuzz_smoke: $name ok ($execs runs in ${SECS} s)"
done
echo "fuzz_smoke: total $(( $(date +%s) - t0 )) s"
exit $fail
