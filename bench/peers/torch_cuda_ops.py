"""PyTorch peer of bench/cuda/ops_bench.cpp on the same GPU and shapes (Qwen2.5-0.5B):
F.linear and its backward, causal scaled_dot_product_attention over 4 sequences of 2048
(fwd and fwd+bwd minus fwd), a paged decode stand-in (64 sequences x 1024 context through
SDPA on contiguous K/V: what HF's decode attention reads), SiLU-gate product and RMSNorm.
One JSON line per measurement, as the Kestrel bench prints; median of --reps after warm-ups.
    python3 bench/peers/torch_cuda_ops.py [--reps N]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def median_ms(f, reps):
    f(); f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def report(op, dt, ms, unit, amount):
    scale = 1e12 if unit == "tflops" else 1e9
    print(json.dumps({"engine": "torch", "op": op, "dtype": dt, "ms": round(ms, 4),
                      unit: round(amount / (ms * 1e-3) / scale, 2)}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 as IEEE f32, as Kestrel's cuBLAS calls
    dev = "cuda"
    for name, dt in (("bf16", torch.bfloat16), ("f32", torch.float32)):
        T, din, dout = 8192, 896, 4864
        x = torch.randn(T, din, device=dev, dtype=dt, requires_grad=True)
        w = (0.05 * torch.randn(dout, din, device=dev, dtype=dt)).requires_grad_()
        report("linear_fwd", name, median_ms(lambda: F.linear(x, w), a.reps), "tflops", 2.0 * T * din * dout)
        y = F.linear(x, w)
        g = torch.randn_like(y)
        report("linear_bwd", name,
               median_ms(lambda: torch.autograd.grad(y, (x, w), g, retain_graph=True), a.reps), "tflops",
               4.0 * T * din * dout)
        H, Hkv, hd, S = 14, 2, 64, 2048
        q = torch.randn(4, H, S, hd, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(4, Hkv, S, hd, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(4, Hkv, S, hd, device=dev, dtype=dt, requires_grad=True)
        attn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        flops = 4.0 * 4 * (S * (S + 1) / 2) * H * hd
        fwd_ms = median_ms(attn, a.reps)
        report("attention_fwd", name, fwd_ms, "tflops", flops)
        o = attn()
        go = torch.randn_like(o)
        bwd_ms = median_ms(lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True), a.reps)
        report("attention_bwd", name, bwd_ms, "tflops", 2.5 * flops)
        B, ctx = 64, 1024
        qd = torch.randn(B, H, 1, hd, device=dev, dtype=dt)
        kd = torch.randn(B, Hkv, ctx, hd, device=dev, dtype=dt)
        vd = torch.randn(B, Hkv, ctx, hd, device=dev, dtype=dt)
        report("paged_decode_64x1024", name,
               median_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True), a.reps), "gbps",
               2.0 * B * ctx * Hkv * hd * (2 if dt == torch.bfloat16 else 4))
        gt = torch.randn(T, dout, device=dev, dtype=dt)
        ut = torch.randn(T, dout, device=dev, dtype=dt)
        report("swiglu_fwd", name, median_ms(lambda: F.silu(gt) * ut, a.reps), "gbps",
               3.0 * T * dout * (2 if dt == torch.bfloat16 else 4))
        xn = torch.randn(8192, din, device=dev, dtype=dt)
        wn = torch.randn(din, device=dev, dtype=dt)
        report("rmsnorm_fwd", name, median_ms(lambda: F.rms_norm(xn, (din,), wn, 1e-6), a.reps), "gbps",
               2.0 * 8192 * din * (2 if dt == torch.bfloat16 else 4))


if __name__ == "__main__":
    main()
