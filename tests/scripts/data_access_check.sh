#!/usr/bin/env bash
# The device seam check (scripts/check_data_access.sh) passes on the tree, and
# catches what it must on a scratch tree: a new file touching tensor data, a
# file whose count grew, while unrelated get/set/memcpy calls pass.
# usage: bash tests/scripts/data_access_check.sh [<kestrel-binary> <build-dir>]
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
CHECK="$SRC/scripts/check_data_access.sh"

echo "== the source tree"
bash "$CHECK" "$SRC"

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/scripts" "$T/src/model" "$T/src/ops" "$T/src/chat"
expect() {  # expect <pass|fail> <what>
  local want=$1 what=$2 out rc=0
  out=$(bash "$CHECK" "$T" 2>&1) || rc=$?
  if [[ "$want" == pass && $rc -ne 0 ]] || [[ "$want" == fail && $rc -eq 0 ]]; then
    echo "data_access_check: expected the check to $want on $what; it said:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "ok: $want on $what"
}

# Not tensor data: smart pointers, string-keyed dictionaries, cli flags, host scalars.
cat > "$T/src/model/clean.cpp" <<'CPP'
#include "core/tensor.h"
void f(Tensor& t, Args& args, Dict& d, std::unique_ptr<int>& p, double x) {
  int* q = p.get();
  d.set("key", 1);
  auto s = args.get("dtype");
  auto u = args.get(f.name);
  int64_t bits; std::memcpy(&bits, &x, 8);
  t.copy_from(t);  // raw() in a comment does not count
  std::vector<float> v = t.to_float_vector();
}
CPP
cat > "$T/src/ops/kernel.cpp" <<'CPP'
float* p = t.data<float>();  // ops may touch data
CPP
cat > "$T/src/chat/dict.cpp" <<'CPP'
void g(Value& d) { d.set(k, v); auto* x = a.get(0, "default"); }  // a file that never names the tensor class
CPP
: > "$T/scripts/data_access_baseline.txt"
expect pass "code that does not touch tensor data"

cat > "$T/src/model/touch.cpp" <<'CPP'
#include "core/tensor.h"
void h(Tensor& t, Tensor& u) {
  float* p = t.data<float>();
  std::memcpy(u.raw(), p, 4);
  float x = t.get(3);
  u.set(0, x);
  void* b = t.storage()->data();
}
CPP
expect fail "a new file touching data (not in the baseline)"
out=$(bash "$CHECK" "$T" 2>&1 || true)
grep -q 'src/model/touch.cpp has 5 lines' <<< "$out" || {
  echo "data_access_check: expected 5 flagged lines in touch.cpp:" >&2; echo "$out" >&2; exit 1; }
echo "ok: counts every pattern once per line"

echo "5 src/model/touch.cpp" > "$T/scripts/data_access_baseline.txt"
expect pass "a file at its baseline count"
echo "  float y = t.get(4);" >> "$T/src/model/touch.cpp"
expect fail "a file whose count grew"
echo "9 src/model/touch.cpp" > "$T/scripts/data_access_baseline.txt"
expect pass "a file below its baseline count"
bash "$CHECK" --update "$T" >/dev/null
grep -qx '6 src/model/touch.cpp' "$T/scripts/data_access_baseline.txt" || {
  echo "data_access_check: --update did not lower the baseline to 6" >&2; exit 1; }
echo "ok: --update lowers the baseline"
echo "data_access_check: passed"
