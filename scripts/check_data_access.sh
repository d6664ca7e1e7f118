#!/usr/bin/env bash
# The device seam check: tensor data is read and written through host pointers
# only in src/ops/ and src/backend/ (the kernels), src/io/ (the file readers
# and writers), src/comm/ (the transports, which hand tensor buffers to MPI and
# later NCCL) and core/tensor.{h,cpp} itself. Everything else moves data with
# ops (ops/copy.h, ops/optim_ops.h, ...) and Tensor's device-aware copies
# (copy_from, clone, to, zero_, fill_, from_host, to_host, to_float_vector), so
# a CUDA backend adds kernels and nothing else.
#
# Flagged patterns (a source line counts once however many it matches):
#   1. data<T>(                 Tensor::data<T>()
#   2. raw()                    Tensor::raw()
#   3. storage()->data()        the Storage's bytes
#   4. .get(<one argument>)     Tensor::get(i)    } only in files that name
#   5. .set(<two arguments>)    Tensor::set(i, v) } `Tensor`, and not on
#      a receiver named `args` (cli flag lookups), nor with a string-literal
#      argument (config and template dictionaries), nor get() without
#      arguments (smart pointers).
# memcpy/memset/memmove on tensor memory need a pointer from 1-3, so they are
# caught where the pointer is taken; memcpy of host scalars or vectors is not
# tensor data and is not flagged.
#
# Files outside the allowed folders that still touch data are listed in
# scripts/data_access_baseline.txt ("<count> <file>"), which may only shrink:
# the check fails when a file not in it touches data or a file's count grows,
# and prints the remaining total. When a count drops, lower it (or run with
# --update, which rewrites the baseline and refuses to raise any count).
#
# usage: scripts/check_data_access.sh [--update] [source-root]
set -euo pipefail
UPDATE=0
if [[ "${1:-}" == "--update" ]]; then UPDATE=1; shift; fi
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
BASELINE="$ROOT/scripts/data_access_baseline.txt"
cd "$ROOT"

# The flagged lines of one file, as "<line number>: <text>".
flagged_lines() {
  local elem=0
  if grep -q '\bTensor\b' "$1"; then elem=1; fi
  awk -v elem="$elem" '
    {
      line = $0
      sub(/\/\/.*/, "", line)  # comments do not count
      hit = line ~ /(^|[^A-Za-z0-9_])data<[^>]*>[ \t]*\(/ || line ~ /(^|[^A-Za-z0-9_])raw\(\)/ ||
            line ~ /storage\(\)[ \t]*->[ \t]*data\(\)/
      if (!hit && elem) {
        t = line
        gsub(/(^|[^A-Za-z0-9_])args\.(get|set)\(/, " ", t)
        hit = t ~ /\.get\([ \t]*[^") \t][^,"]*\)/ || t ~ /\.set\([ \t]*[^"), \t][^,"]*,[^,"]*\)/
      }
      if (hit) print FNR ": " $0
    }' "$1"
}

# <count> <file> for every scanned file with at least one flagged line.
scan() {
  local f n
  while IFS= read -r f; do
    case "$f" in
      src/ops/*|src/backend/*|src/io/*|src/comm/*|src/core/tensor.h|src/core/tensor.cpp) continue ;;
    esac
    n=$(flagged_lines "$f" | grep -c . || true)
    if [[ "$n" -gt 0 ]]; then echo "$n $f"; fi
  done < <(find src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cc' \) | LC_ALL=C sort)
}

current=$(scan)
declare -A base=()
if [[ -f "$BASELINE" ]]; then
  while read -r n f; do
    [[ -z "${n:-}" || "$n" == \#* ]] && continue
    base["$f"]=$n
  done < "$BASELINE"
fi

fail=0 total=0 shrunk=0
while read -r n f; do
  [[ -z "${n:-}" ]] && continue
  total=$((total + n))
  b=${base["$f"]:-0}
  if [[ "$n" -gt "$b" ]]; then
    if [[ "$b" -eq 0 ]]; then
      echo "check_data_access: $f has $n lines that touch tensor data through host pointers and is not in the baseline;" \
           "use ops (ops/copy.h, ops/optim_ops.h) or Tensor's copy methods instead" >&2
    else
      echo "check_data_access: $f: $n lines touch tensor data, the baseline allows $b; the count may only shrink" >&2
    fi
    flagged_lines "$f" | sed "s|^|  $f:|" >&2
    fail=1
  elif [[ "$n" -lt "$b" ]]; then
    shrunk=1
  fi
done <<< "$current"
for f in "${!base[@]}"; do
  if ! grep -q " $f\$" <<< "$current"; then shrunk=1; fi
done

if [[ "$UPDATE" -eq 1 ]]; then
  if [[ "$fail" -ne 0 && -f "$BASELINE" ]]; then
    echo "check_data_access: --update refuses to raise the baseline" >&2
    exit 1
  fi
  {
    echo "# Host-pointer tensor data access outside src/ops, src/backend, src/io, src/comm:"
    echo "# <lines> <file>. May only shrink (scripts/check_data_access.sh)."
    echo "$current"
  } > "$BASELINE"
  echo "check_data_access: baseline rewritten, $total lines left"
  exit 0
fi
if [[ "$fail" -ne 0 ]]; then
  echo "check_data_access: FAILED ($total lines outside the device seam)" >&2
  exit 1
fi
if [[ "$shrunk" -ne 0 ]]; then
  echo "check_data_access: some files touch less data than the baseline says; lower it (scripts/check_data_access.sh --update)"
fi
echo "check_data_access: passed, $total lines outside the device seam left in $(grep -c . <<< "$current" || true) files"
