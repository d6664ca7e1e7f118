#!/usr/bin/env bash
# Every op's kernel table (ops/dispatch.h: `Kernels<...> k{.cpu = ...}`) names a
# CUDA kernel too (KS_CUDA_KERNEL), so an op added later without one fails here
# instead of on a GPU machine with "not supported yet: CUDA kernel for ops::...".
# Tables may span two lines (the initializer on the next line).
# usage: bash tests/scripts/cuda_kernel_tables.sh [<kestrel-binary> <build-dir>]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
# The tables of the tree at $1 without a CUDA entry, one per line.
tables_without_cuda() (cd "$1" && for f in src/ops/*.cpp src/ops/*.h; do
  [[ $f == src/ops/dispatch.h ]] && continue
  # Join each table's declaration with its next line, then keep the ones without a CUDA entry.
  awk -v f="$f" '/Kernels<.*>/ { line = $0; if ($0 !~ /\{/ || $0 !~ /\}/) { getline nxt; line = line nxt }
                 if (line ~ /\.cpu = / && line !~ /KS_CUDA_KERNEL/) print f ": " line }' "$f"
done)
missing=$(tables_without_cuda "$SRC")
# The check has teeth: a scratch copy with one CUDA entry removed must be caught.
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/src" && cp -r "$SRC/src/ops" "$T/src/"
sed -i 's/ KS_CUDA_KERNEL(cuda::add)//' "$T/src/ops/linear.cpp"
tables_without_cuda "$T" | grep -q "kAdd" || { echo "cuda_kernel_tables: a table without its CUDA entry went unnoticed" >&2; exit 1; }
tables=$(cd "$SRC" && grep -h "Kernels<" src/ops/*.cpp src/ops/*.h | grep -vc "^//\|dispatch\|kernel_for\|decltype(auto)" || true)
if [[ -n $missing ]]; then
  echo "cuda_kernel_tables: these op tables have no CUDA kernel (add KS_CUDA_KERNEL(cuda::...)):" >&2
  echo "$missing" >&2
  exit 1
fi
echo "cuda_kernel_tables: every op table ($tables declarations) names a CUDA kernel"
