#!/usr/bin/env python3
"""PyTorch eager peer for Kestrel's training-step throughput (forward + backward + AdamW) on CPU.

Usage (from the repository root):
    python bench/peers/torch_train_step.py --config bench/configs/small.json --threads 2 \
        --seq 512 --batch-tokens 2048 --steps 5 --dtype fp32

Builds a random-weight model from an HF config.json (transformers' default init), feeds batch-tokens/seq
rows of seq random tokens each (every row one causal sequence, i.e. packed fixed-length rows, no padding),
next-token cross-entropy over all rows, backward, torch.optim.AdamW step. Attention is "sdpa" (PyTorch's
best CPU path). Warms up --warmup steps (default 2), then times --steps steps with a wall clock.

Prints one JSON line: {"config", "threads", "tokens_per_s", "step_s", "params", ...}; tokens_per_s counts
input tokens (rows * seq) per second of the median step (as Kestrel's bench reports), step_s is the mean seconds per timed step
(step_s_min / step_s_median also printed: other load on a shared machine inflates the mean; cpu_step_s is the
median process CPU seconds per step divided by --threads, which leaves out time the threads were descheduled).
--device cuda runs on GPU 0 (the stream synchronised at the end of each step); --amp runs fp32 parameters,
gradients and AdamW state with the forward and backward under torch.autocast(bfloat16), the mixed precision
Kestrel's bf16 (bf16 weights, f32 masters and moments) compares with; --compile wraps the model in torch.compile.
MoE configs (Qwen3-MoE, DeepSeek-V3) run transformers' default experts implementation unless
--experts-implementation names one ("eager" loops over experts with per-expert nn.functional.linear calls);
the JSON line says which ran ("experts").
"""
import argparse
import json
import os
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="HF config.json (e.g. bench/configs/small.json)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512, help="tokens per row")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="tokens per step; a multiple of --seq")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                    help="parameter and compute dtype (bf16: pure bf16 params, grads and AdamW state)")
    ap.add_argument("--adamw-impl", choices=["fused", "foreach", "for-loop"], default="fused",
                    help="torch.optim.AdamW implementation (fused is the fastest on CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--amp", action="store_true", help="fp32 params + torch.autocast(bfloat16) (overrides --dtype)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--experts-implementation", default=None,
                    help="MoE configs: transformers' experts_implementation (\"eager\": a loop over the hit experts, "
                         "\"grouped_mm\": torch's grouped GEMM, \"batched_mm\"); default: transformers' own choice")
    args = ap.parse_args()
    if args.batch_tokens % args.seq:
        ap.error(f"--batch-tokens {args.batch_tokens} is not a multiple of --seq {args.seq}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.utils.logging.set_verbosity_error()
    dtype = torch.float32 if args.dtype == "fp32" or args.amp else torch.bfloat16
    dev = torch.device(args.device)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 as IEEE f32, as Kestrel's cuBLAS path

    config = AutoConfig.from_pretrained(args.config)
    extra = {}
    if args.experts_implementation:
        extra["experts_implementation"] = args.experts_implementation
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype, **extra)
    # What ran (None for dense models; transformers resolves its default to "grouped_mm" where torch has it).
    experts_impl = getattr(model.config, "_experts_implementation", None) if hasattr(config, "num_experts_per_tok") else None
    model.to(dev)
    model.train()
    fwd = torch.compile(model) if args.compile else model
    params = sum(p.numel() for p in model.parameters())
    impl = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **impl[args.adamw_impl])

    rows = args.batch_tokens // args.seq
    g = torch.Generator().manual_seed(args.seed + 1)
    input_ids = torch.randint(0, config.vocab_size, (rows, args.seq), generator=g).to(dev)

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def step():
        opt.zero_grad(set_to_none=True)
        # labels=input_ids: transformers shifts internally and averages over rows*(seq-1) targets.
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.amp):
            loss = fwd(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
        opt.step()
        sync()
        return float(loss.detach())

    for _ in range(args.warmup):
        step()
    loss = None
    times = []  # per-step wall times: min/median are less sensitive to other load on a shared machine
    cpu_times = []  # process CPU seconds per step / threads: leaves out time descheduled (Kestrel's cpu_step_s)
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        times.append(time.perf_counter() - t0)
        cpu_times.append((time.process_time() - c0) / args.threads)
    dt = sum(times) / max(len(times), 1)
    median = sorted(times)[len(times) // 2]

    print(json.dumps({
        "config": os.path.basename(args.config), "threads": args.threads,
        # From the median step, as Kestrel's bench_train_step_bench reports it.
        "tokens_per_s": round(rows * args.seq / median, 2), "step_s": round(dt, 4), "params": params,
        "step_s_min": round(min(times), 4), "step_s_median": round(median, 4),
        "cpu_step_s": round(sorted(cpu_times)[len(cpu_times) // 2], 4),
        "seq": args.seq, "batch_tokens": rows * args.seq, "steps": args.steps,
        "dtype": "amp-bf16" if args.amp else args.dtype, "device": args.device, "compile": args.compile,
        "attn": "sdpa", "adamw": args.adamw_impl, "last_loss": loss,
        **({"experts": experts_impl} if experts_impl else {}),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }))


if __name__ == "__main__":
    main()
