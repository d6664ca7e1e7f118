#!/usr/bin/env bash
# The device check of the CUDA backend, run on a machine with a GPU from the
# bundle scripts/device_bundle.sh made here (the device image has the CUDA
# runtime and cuBLAS but no Debian packages and no network). Writes every
# result to one file, $OUT/device_check.txt (or ./device_check.txt), and exits
# non-zero when a check fails. The checks take about 25 s on an H200 (with
# the GRPO comparison), the benchmarks about 7 minutes more
# (DEVICE_CHECK_BENCH=0 leaves them out).
#
#   device tool: run(command="bash device_bundle/device_check.sh", carry=["device_bundle"], timeout_s=600)
#
# Run on an H200 in five calls on 2026-12-04 (docs/benchmarks.md, "CUDA
# backend on an H200", with each call's settings): every check passed in
# each; every benchmark below has run.
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
#     shapes (bench/peers/torch_cuda_ops.py), one JSON line each;
#   - issue 18's item-7 benchmarks, each beside its peer in the same run
#     (DEVICE_CHECK_BENCH=0 skips them): the bf16 training step of a
#     Qwen2.5-0.5B- and a 1.5B-shaped model (bench_train_step_bench --device
#     cuda) against PyTorch eager and torch.compile under bf16 autocast
#     (bench/peers/torch_train_step.py), as tokens/s and MFU; decode of 64
#     sequences (bench_rollout_bench --device cuda), eager and CUDA graphs,
#     against HF generate on the same GPU and against the HBM roofline.
#   KESTREL_OP_PROFILE=1 runs of the 0.5B step and the decode print each op's
#   share of the time (ops/op_profile.h).
# BENCHES="train05 torch05 ..." picks benchmarks by key (below);
# TRAIN_STEPS / TRAIN_WARMUP (5 / 2), DECODE_NEW (256), DECODE_THREADS (8), COMPILE_LIMIT_S (110) and
# TORCH_OPS=0 (skip PyTorch's kernel timings) and GRPO=0 (skip the GRPO comparison) shorten a run.
# Every step runs under its own time limit (STEP_LIMIT_S, default 240 s), and
# the benchmarks stop being started once DEADLINE_S (default 480 s) has passed,
# so the script ends inside one device call and its file always comes back.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
OUTF=${OUT:-.}/device_check.txt
: > "$OUTF"
log() { echo "$@" | tee -a "$OUTF"; }
log "== device_check $(date -u +%FT%TZ), bundle of commit $(cat "$B/commit" 2>/dev/null)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUTF"
source "$B/device_env.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
if ! nvidia-smi >/dev/null 2>&1; then
  log "== device_check: no GPU visible (nvidia-smi failed): nothing was checked"
  exit 2
fi
fail=0
T0=$SECONDS
STEP_LIMIT_S=${STEP_LIMIT_S:-240}
DEADLINE_S=${DEADLINE_S:-480}
run() {  # name, command...
  local name=$1; shift
  log "== $name (at $((SECONDS - T0)) s)"
  if timeout -k 5 "$STEP_LIMIT_S" "$@" >>"$OUTF" 2>&1; then log "-- $name: ok"; else log "-- $name: FAILED (exit $?)"; fail=1; fi
}
# A benchmark: its output to the file; a failing peer is noted, not a failed check.
# BENCHES="key ..." runs only the benchmarks with those keys (the first word of each call below).
bench() {  # key, name, limit_s, command...
  local key=$1 name=$2 limit=$3; shift 3
  if [[ -n ${BENCHES:-} && " $BENCHES " != *" $key "* ]]; then return; fi
  if (( SECONDS - T0 > DEADLINE_S )); then log "== bench $name: skipped (past DEADLINE_S=$DEADLINE_S)"; return; fi
  log "== bench $name (at $((SECONDS - T0)) s)"
  timeout -k 5 "$limit" "$@" >>"$OUTF" 2>&1 || log "-- bench $name: exit $?"
}
# NCCL: a multi-process device run dlopens libnccl.so.2 (PyTorch's wheel has it
# under nvidia/nccl/lib, on LD_LIBRARY_PATH above); a single process never loads it.
NCCL_SO=""
for d in ${LD_LIBRARY_PATH//:/ }; do [[ -f $d/libnccl.so.2 ]] && { NCCL_SO=$d/libnccl.so.2; break; }; done
log "== NCCL for multi-process device runs: ${NCCL_SO:-libnccl.so.2 not found on LD_LIBRARY_PATH}"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if command -v mpirun >/dev/null && [[ -x $U/bin/nccl_tests && -n $NCCL_SO ]] && (( NGPU >= 2 )); then
  run "NCCL transport, 2 ranks (tests/nccl)" bash "$B/nccl_run.sh" "$U/bin/nccl_tests" 2
else
  log "== NCCL 2-rank check: skipped (needs mpirun, an MPI build's nccl_tests in the bundle, NCCL and 2 GPUs, since NCCL refuses two ranks on one GPU; here: $NGPU GPU(s), mpirun $(command -v mpirun >/dev/null && echo found || echo absent))"
fi
run "test_cuda (runtime)" "$U/bin/test_cuda"
run "backend consistency (device vs CPU)" "$U/bin/test_ops" --gtest_filter='*BackendConsistency*'
run "op tests on every device" "$U/bin/test_ops" \
  --gtest_filter='*Norm*:*Rmsnorm*:*Swiglu*:*Activation*:*Embedding*:*Copy*:*Rope*:*Optim*:*Adamw*:*SumSquares*:*Scale*:*Linear*:*Loss*:*Vocab*'
run "models, training and rollout on the device (test_on_device)" "$U/bin/test_on_device"
# The GRPO comparison sources compare_runs.sh from the repository's tests/scripts/lib (carried with the tree).
if [[ ${GRPO:-1} != 0 ]]; then
  run "GRPO with trainer.device=cuda against the CPU" bash "$B/grpo_on_device.sh" "$U/bin/kestrel"
else
  log "== GRPO with trainer.device=cuda against the CPU: skipped (GRPO=0)"
fi
log "== kernel timings: Kestrel, then PyTorch (same shapes)"
"$U/bin/bench_cuda_ops" --reps 10 >>"$OUTF" 2>&1 || { log "-- bench_cuda_ops: FAILED"; fail=1; }
if [[ ${TORCH_OPS:-1} != 0 ]]; then
  "${PY[@]}" "$B/torch_cuda_ops.py" --reps 10 >>"$OUTF" 2>&1 || log "-- torch_cuda_ops.py: FAILED (the peer; not a Kestrel failure)"
fi
if [[ ${DEVICE_CHECK_BENCH:-1} != 0 ]]; then
  export PYTHONUNBUFFERED=1
  # The rollout samples on the host: it gets the machine's cores, as a verl rollout worker has them.
  DECODE_THREADS=${DECODE_THREADS:-8}
  # 8 host threads: the random initialisation runs on the host (the 1.5B model's outlived a 90 s limit at 2).
  TRAIN=(--device cuda --dtype bf16 --seq 1024 --batch-tokens 16384 --warmup "${TRAIN_WARMUP:-2}" --steps "${TRAIN_STEPS:-5}"
         --threads 8)
  R=(--device cuda --dtype bf16 --config bench/configs/qwen2.5-0.5b.json --prompts 64 --n 1 --new "${DECODE_NEW:-256}"
     --only throughput --threads "$DECODE_THREADS")
  C05=bench/configs/qwen2.5-0.5b.json C15=bench/configs/qwen2.5-1.5b.json
  # Ordered so that what was never measured comes first (a deadline may cut the tail).
  bench train15 "train step 1.5b kestrel" 90 "$U/bin/bench_train_step_bench" --config $C15 "${TRAIN[@]}" --peak-tflops 790
  bench torch15 "train step 1.5b torch eager" 90 "${PY[@]}" bench/peers/torch_train_step.py --config $C15 "${TRAIN[@]}" --amp
  bench train05 "train step 0.5b kestrel" 90 "$U/bin/bench_train_step_bench" --config $C05 "${TRAIN[@]}" --peak-tflops 790
  bench torch05 "train step 0.5b torch eager" 90 "${PY[@]}" bench/peers/torch_train_step.py --config $C05 "${TRAIN[@]}" --amp
  bench compile05 "train step 0.5b torch.compile" "${COMPILE_LIMIT_S:-110}" "${PY[@]}" bench/peers/torch_train_step.py --config $C05 \
    "${TRAIN[@]}" --amp --compile
  # Where the step's time goes: each op's kernels timed with the queue drained around it (ops/op_profile.h).
  bench profile05 "train step 0.5b kestrel, op profile" 90 env KESTREL_OP_PROFILE=1 "$U/bin/bench_train_step_bench" --config $C05 \
    "${TRAIN[@]}" --steps 2 --peak-tflops 790
  # The tensor-core attention forward (the default for bf16) against the CUDA-core tiled kernels.
  bench tiled05 "train step 0.5b kestrel, KESTREL_CUDA_ATTENTION=tiled" 90 env KESTREL_CUDA_ATTENTION=tiled \
    "$U/bin/bench_train_step_bench" --config $C05 "${TRAIN[@]}" --peak-tflops 790
  # The backward's GEMMs as three bf16 GEMMs of the split gradient (the default) against the widened f32 GEMM.
  bench exact05 "train step 0.5b kestrel, KESTREL_CUDA_EXACT_F32_GEMM=1" 90 env KESTREL_CUDA_EXACT_F32_GEMM=1 \
    "$U/bin/bench_train_step_bench" --config $C05 "${TRAIN[@]}" --peak-tflops 790
  bench decode "decode 64 seqs kestrel eager" 90 "$U/bin/bench_rollout_bench" "${R[@]}" --eager 1
  bench graphs "decode 64 seqs kestrel cudagraph" 90 "$U/bin/bench_rollout_bench" "${R[@]}" --eager 0
  bench hf "decode 64 seqs HF generate" 90 "${PY[@]}" bench/peers/hf_generate.py --device cuda --dtype bf16 \
    --config $C05 --prompts 64 --n 1 --new "${DECODE_NEW:-256}" --only throughput
  bench profiledecode "decode 64 seqs kestrel eager, op profile" 90 env KESTREL_OP_PROFILE=1 "$U/bin/bench_rollout_bench" "${R[@]}" --eager 1
  bench compile15 "train step 1.5b torch.compile" "${COMPILE_LIMIT_S:-110}" "${PY[@]}" bench/peers/torch_train_step.py --config $C15 \
    "${TRAIN[@]}" --amp --compile
fi
grep -E "^\[  (PASSED|FAILED|SKIPPED) \]" "$OUTF" | sort | uniq -c | tee -a /dev/stderr >/dev/null
log "== device_check: $([[ $fail == 0 ]] && echo ok || echo FAILED) after $((SECONDS - T0)) s"
exit $fail
