#!/usr/bin/env python3
"""Peer of bench_rollout_bench: Hugging Face transformers `generate` on the
same "small" model (bench/configs/small.json) with the same thread count.

  1. throughput: P prompts x n samples (num_return_sequences), 128 random prompt
     tokens, 256 new tokens forced (min_new_tokens), temperature 1, no top-k/top-p;
     output tokens/s. HF pads and runs the whole batch in lock step.
  2. batch-1 decode tokens/s: (time for K new tokens - time for 1) / (K - 1).

Weights: `--model DIR` loads a folder Kestrel saved (bench_rollout_bench
--save-model DIR), otherwise a random LlamaForCausalLM of the same config
(throughput does not depend on the weight values).

--device cuda runs on GPU 0 in --dtype (bf16 or f32), the model built from
--config with AutoModelForCausalLM (any architecture transformers knows);
the throughput line is then also printed as JSON.

Usage (from the repository root):
  python3 bench/peers/hf_generate.py --threads 2 --prompts 4 --n 8 --new 256
The full 64 x 8 workload takes a long time under HF on 2 cores; use a reduced
--prompts and compare tokens/s (a rate), stating the reduction.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="")
    ap.add_argument("--config", default="bench/configs/small.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--only", default="", choices=["", "throughput", "decode"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=dtype)
    elif a.device == "cuda":
        from transformers import AutoConfig
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.config), dtype=dtype)
    else:
        with open(a.config) as f:
            cfg = json.load(f)
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.to(a.device)
    model.eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    print(f"# HF transformers {__import__('transformers').__version__}, torch {torch.__version__}, "
          f"{a.threads} threads, {sum(p.numel() for p in model.parameters())} params, {a.dtype}, {a.device}")

    def gen(batch, new, n):
        ids = torch.randint(0, vocab, (batch, a.prompt_len), generator=g).to(a.device)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                                 num_return_sequences=n, pad_token_id=0)
        if a.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        assert out.shape[1] == a.prompt_len + new, out.shape
        return dt

    if a.only in ("", "throughput"):
        if a.device == "cuda":
            gen(a.prompts, 8, a.n)  # warm-up: kernels loaded, allocator primed
        dt = gen(a.prompts, a.new, a.n)
        toks = a.prompts * a.n * a.new
        print(f"## throughput: {a.prompts} prompts x n={a.n}, {a.prompt_len} prompt + {a.new} new tokens")
        print(f"| output tokens | seconds | output tok/s |\n|---|---|---|\n| {toks} | {dt:.2f} | {toks / dt:.1f} |\n")
        if a.device == "cuda":
            print(json.dumps({"engine": "hf_generate", "device": "cuda", "dtype": a.dtype, "sequences": a.prompts * a.n,
                              "new_tokens": a.new, "output_tok_per_s": round(toks / dt, 1), "seconds": round(dt, 3)}))
    if a.only in ("", "decode"):
        gen(1, 2, 1)  # warm-up
        t1 = gen(1, 1, 1)
        tk = gen(1, a.new, 1)
        print(f"## batch-1 decode\n| measured tok/s |\n|---|\n| {(a.new - 1) / (tk - t1):.1f} |")


if __name__ == "__main__":
    main()
