#!/usr/bin/env bash
# The device check of the CUDA backend, run on a machine with a GPU from the
# bundle scripts/device_bundle.sh made here (the device image has the CUDA
# runtime and cuBLAS but no Debian packages and no network). Writes every
# result to one file, $OUT/device_check.txt (or ./device_check.txt), and exits
# non-zero when a check fails. Takes about a minute.
#
#   device tool: run(command="bash device_bundle/device_check.sh", carry=["device_bundle"], timeout_s=300)
#
# What it runs today (see docs/features.md, "CUDA backend"):
#   - test_cuda: the device runtime (allocator, copies, fills);
#   - test_ops' backend-consistency harness: every op with a CUDA kernel on the
#     device against the CPU, f32 and bf16 (the optimizer bit for bit);
#   - the op tests that loop over available devices, for the ops with CUDA kernels;
#   - test_on_device: the transformers parity goldens with the model on the GPU
#     (dense, MoE, MLA), three AdamW steps against the CPU's, a checkpoint from
#     the GPU resumed on the CPU, the rollout's tokens and log-probs against the CPU's;
#   - a GRPO run with trainer.device=cuda against the same run on the CPU, and
#     one with the swap optimizer against the plain device run (bit for bit)
#     (tests/cuda_emu/grpo_on_device.sh with the bundle's kestrel); offload and
#     the swap optimizer's device peak are test_on_device's;
#   - the kernel timings (bench/cuda/ops_bench.cpp) beside PyTorch's on the same
#     shapes (bench/peers/torch_cuda_ops.py), one JSON line each.
# Not yet: CUDA-graph decode, parameter/gradient offload, the training-step
# and decode benchmarks against PyTorch / HF generate (not built).
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
OUTF=${OUT:-.}/device_check.txt
: > "$OUTF"
log() { echo "$@" | tee -a "$OUTF"; }
log "== device_check $(date -u +%FT%TZ), bundle of commit $(cat "$B/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUTF"
# OpenBLAS where the CPU backend looks for it (a fixed Debian path); the other libraries by LD_LIBRARY_PATH.
OB=/usr/lib/x86_64-linux-gnu/openblas-openmp
if [[ ! -f $OB/libopenblas.so.0 ]]; then mkdir -p "$OB" && xz -dc "$B/lib/libopenblas.so.0.xz" > "$OB/libopenblas.so.0"; fi
[[ -f $B/lib/libicudata.so.72 ]] || xz -dc "$B/lib/libicudata.so.72.xz" > "$B/lib/libicudata.so.72"
# The tests read the goldens of the carried source tree (the repository root the device tool runs in).
export KESTREL_SOURCE_DIR=${KESTREL_SOURCE_DIR:-$(pwd)}
CUDA_LIBS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${CUDA_LIBS}:${LD_LIBRARY_PATH:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
if ! nvidia-smi >/dev/null 2>&1; then
  log "== device_check: no GPU visible (nvidia-smi failed): nothing was checked"
  exit 2
fi
fail=0
run() {  # name, command...
  local name=$1; shift
  log "== $name"
  if "$@" >>"$OUTF" 2>&1; then log "-- $name: ok"; else log "-- $name: FAILED"; fail=1; fi
}
# NCCL: a multi-process device run dlopens libnccl.so.2 (PyTorch's wheel has it
# under nvidia/nccl/lib, on LD_LIBRARY_PATH above); a single process never loads it.
NCCL_SO=""
for d in ${LD_LIBRARY_PATH//:/ }; do [[ -f $d/libnccl.so.2 ]] && { NCCL_SO=$d/libnccl.so.2; break; }; done
log "== NCCL for multi-process device runs: ${NCCL_SO:-libnccl.so.2 not found on LD_LIBRARY_PATH}"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if command -v mpirun >/dev/null && [[ -x $B/bin/nccl_tests && -n $NCCL_SO ]] && (( NGPU >= 2 )); then
  run "NCCL transport, 2 ranks (tests/nccl)" bash "$B/nccl_run.sh" "$B/bin/nccl_tests" 2
else
  log "== NCCL 2-rank check: skipped (needs mpirun, an MPI build's nccl_tests in the bundle, NCCL and 2 GPUs, since NCCL refuses two ranks on one GPU; here: $NGPU GPU(s), mpirun $(command -v mpirun >/dev/null && echo found || echo absent))"
fi
run "test_cuda (runtime)" "$B/bin/test_cuda"
run "backend consistency (device vs CPU)" "$B/bin/test_ops" --gtest_filter='*BackendConsistency*'
run "op tests on every device" "$B/bin/test_ops" \
  --gtest_filter='*Norm*:*Rmsnorm*:*Swiglu*:*Activation*:*Embedding*:*Copy*:*Rope*:*Optim*:*Adamw*:*SumSquares*:*Scale*:*Linear*:*Loss*:*Vocab*'
run "models, training and rollout on the device (test_on_device)" "$B/bin/test_on_device"
# The GRPO comparison sources compare_runs.sh from the repository's tests/scripts/lib (carried with the tree).
run "GRPO with trainer.device=cuda against the CPU" bash "$B/grpo_on_device.sh" "$B/bin/kestrel"
log "== kernel timings: Kestrel, then PyTorch (same shapes)"
"$B/bin/bench_cuda_ops" --reps 10 >>"$OUTF" 2>&1 || { log "-- bench_cuda_ops: FAILED"; fail=1; }
python3 "$B/torch_cuda_ops.py" --reps 10 >>"$OUTF" 2>&1 || log "-- torch_cuda_ops.py: FAILED (the peer; not a Kestrel failure)"
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]" "$OUTF" | sort | uniq -c | tee -a /dev/stderr >/dev/null
log "== device_check: $([[ $fail == 0 ]] && echo ok || echo FAILED)"
exit $fail
