#!/usr/bin/env bash
# Issue 21's targets on the device machine's host CPU (an Intel Xeon with
# AVX-512 and AMX where the H200 was lent), pinned to two physical cores so
# that it runs as the 2-core machines of docs/benchmarks.md did: the small
# config's f32 training step against PyTorch eager and the rollout against
# HF generate, each pair back to back, on the CPU's own ISA and under the
# AVX2 setting (bench/run_targets.sh's commands); then the CPU op harness at
# every ISA level the CPU has (test_ops' Isa suites) and the GEMM-choice and
# packed-weight tests (test_backend_cpu). Uses the bundle's release
# benchmarks (scripts/device_bundle.sh) and the image's torch and
# transformers. Writes $OUT/cpu_targets.txt.
#   device tool: run(command="bash device_bundle/device_cpu_targets.sh", carry=["device_bundle"], timeout_s=450)
# PAIRS (default 2) training pairs per setting; STEP_LIMIT_S (default 120) per command.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
OUTF=${OUT:-.}/cpu_targets.txt
: > "$OUTF"
log() { echo "$@" | tee -a "$OUTF"; }
source "$B/device_env.sh"
log "== cpu targets $(date -u +%FT%TZ), bundle of commit $(cat "$B/commit" 2>/dev/null)"
lscpu | grep -E "^(Model name|CPU family|Model:|CPU\(s\)|Thread|Core|Socket)" >>"$OUTF"
grep -m1 -o -E "avx512f|amx_tile" /proc/cpuinfo | sort -u | paste -sd' ' | sed 's/^/flags seen: /' >>"$OUTF"
# Two CPUs on distinct physical cores: SMT siblings would share one core's FMA units.
CPUS=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do
         echo "${c##*cpu} $(cat "$c/topology/physical_package_id" 2>/dev/null)-$(cat "$c/topology/core_id" 2>/dev/null)"
       done | sort -n | awk '!seen[$2]++ {print $1}' | head -2 | paste -sd,)
log "== pinned to CPUs $CPUS (distinct cores); load $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=(taskset -c "$CPUS")
export OMP_NUM_THREADS=2
KESTREL_CACHE=$(mktemp -d)  # the GEMM choice and the packing verdict measured here, not carried
export KESTREL_CACHE
T0=$SECONDS
STEP_LIMIT_S=${STEP_LIMIT_S:-120}
fail=0
step() {  # name, command...: output to the file; a failing peer is noted, a failing Kestrel command fails the run
  local name=$1; shift
  log "== $name (at $((SECONDS - T0)) s)"
  timeout -k 5 "$STEP_LIMIT_S" "$@" >>"$OUTF" 2>&1 || { log "-- $name: exit $?"; [[ $name == kestrel* ]] && fail=1; }
}
R=$U/bin
S=(--config bench/configs/small.json --threads 2 --seq 512 --batch-tokens 2048 --steps 5)
RB=(--threads 2 --prompts 32 --n 8 --new 128 --only throughput)
A2K=(OPENBLAS_CORETYPE=Haswell KESTREL_ISA=avx2 DNNL_MAX_CPU_ISA=AVX2)
A2P=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 DNNL_MAX_CPU_ISA=AVX2)
MODEL=${TMPDIR:-/tmp}/rb_model
# The rollout benchmark's random model in HF format for the HF peer (saved, then one token generated).
"${PIN[@]}" "$R/release_bench_rollout_bench" --save-model "$MODEL" --threads 2 --prompts 1 --n 1 --new 1 --only throughput \
  >/dev/null 2>&1 || log "-- saving the rollout model failed"
for i in $(seq "${PAIRS:-2}"); do
  step "kestrel train, native ISA, pair $i" "${PIN[@]}" "$R/release_bench_train_step_bench" "${S[@]}"
  step "torch train, native ISA, pair $i" "${PIN[@]}" "${PY[@]}" bench/peers/torch_train_step.py "${S[@]}" --dtype fp32
  step "kestrel train, AVX2 setting, pair $i" env "${A2K[@]}" "${PIN[@]}" "$R/release_bench_train_step_bench" "${S[@]}"
  step "torch train, AVX2 setting, pair $i" env "${A2P[@]}" "${PIN[@]}" "${PY[@]}" bench/peers/torch_train_step.py "${S[@]}" --dtype fp32
done
step "kestrel rollout, native ISA" "${PIN[@]}" "$R/release_bench_rollout_bench" "${RB[@]}"
step "HF generate, native ISA" "${PIN[@]}" "${PY[@]}" bench/peers/hf_generate.py --model "$MODEL" "${RB[@]}"
step "kestrel rollout, AVX2 setting" env "${A2K[@]}" "${PIN[@]}" "$R/release_bench_rollout_bench" "${RB[@]}"
step "HF generate, AVX2 setting" env "${A2P[@]}" "${PIN[@]}" "${PY[@]}" bench/peers/hf_generate.py --model "$MODEL" "${RB[@]}"
step "kestrel op harness, every ISA level of this CPU" "$R/test_ops" --gtest_filter='Isa/*:IsaLevels.*:RopeLayoutsIsa.*' --gtest_brief=1
step "kestrel GEMM choice and packed weights" "$R/test_backend_cpu" --gtest_filter='*Gemm*:*Blas*:*Packed*:*Skinny*' --gtest_brief=1
log "== cpu targets: $([[ $fail == 0 ]] && echo ok || echo FAILED) after $((SECONDS - T0)) s"
exit $fail
