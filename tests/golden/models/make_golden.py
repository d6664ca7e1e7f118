#!/usr/bin/env python3
"""Writes the tiny-model goldens under tests/golden/models/<case>/ (committed; tests never run Python).

How to run (from the repository root; CPU only, ~10 s):
    python tests/golden/models/make_golden.py            # all cases
    python tests/golden/models/make_golden.py qwen3 ...  # only the named cases

Needs torch, transformers (v5 layout: config.json holds "rope_parameters", not "rope_scaling") and
safetensors. Deterministic: fixed seeds, 1 CPU thread, deterministic algorithms; rerunning reproduces the
same bytes with the same torch/transformers versions (recorded in each meta.json).

Per case folder:
  config.json, model.safetensors  as written by save_pretrained (f32 weights, or bf16 for *_bf16 cases)
  golden.safetensors              keys below; every reference is computed from the model reloaded with
                                  from_pretrained from that folder, so it matches the saved bytes exactly
  meta.json                       seq_lens, dtype, optimizer settings, versions, seed, description

golden.safetensors keys ([T] = packed rows, B sequences, V vocab):
  input_ids  int64 [T]     packed sequences, tokens uniform in [0, V)
  cu_seqlens int64 [B+1]   sequence boundaries into the packed rows
  logits     f32 [T, V]    each sequence run alone (batch 1, no padding, positions from 0), concatenated
  logprobs   f32 [T]       row t: log p(input_ids[t+1] | tokens of its sequence up to t); 0 on a last row
  entropy    f32 [T]       entropy of the predicted distribution at every row
  loss       f32 [1]       sum of -logprobs over all (row, next token) pairs / their count (T - B)
  grad.<hf param name>     f32, d loss / d param (tied embeddings: only model.embed_tokens.weight)
  fp32 cases only:
  adamw_loss f32 [3]       loss before each of 3 AdamW steps (hyper-parameters: ADAMW below)
  adamw_final.<hf name>    f32, parameters after the 3 steps

bf16 cases: the whole model computes in bf16 (as loaded with dtype=bfloat16: weights bf16, RoPE inverse
frequencies stay f32 as transformers computes them); logits are upcast with .float() before log_softmax,
so logprobs/entropy/loss are f32 maths on bf16 logits; grads are the bf16 param grads converted to f32.
"""
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config,
                          Qwen3Config)

HERE = os.path.dirname(os.path.abspath(__file__))
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 3
INIT_STD = 0.2  # large enough that logits are far from flat (std ~1 at hidden 32)

# Shared tiny shape; cases override what they exercise.
BASE = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=96,
            max_position_embeddings=64, num_attention_heads=4, rms_norm_eps=1e-6)

# name -> (config class, config overrides, seq_lens, seed, description)
CASES = {
    "llama_tied": (
        LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=True),
        [7, 12, 1, 5], 1001,
        "LlamaForCausalLM, tied embeddings, GQA 4 q heads / 2 kv heads, default RoPE"),
    "llama3_untied_rope": (
        LlamaConfig, dict(num_key_value_heads=1, tie_word_embeddings=False, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}),
        [9, 40, 1, 6], 1002,
        "LlamaForCausalLM, untied lm_head, MQA (1 kv head), llama3 RoPE scaling, theta 5e5, a 40-token "
        "sequence to reach past original_max_position_embeddings"),
    "qwen2": (
        Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True),
        [7, 12, 1, 5], 1003,
        "Qwen2ForCausalLM, q/k/v biases (random), tied embeddings, GQA 4/2"),
    "qwen2_yarn": (
        Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=False,
                          rope_scaling={"type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 16}),
        [9, 40, 1, 6], 1004,
        "Qwen2ForCausalLM, untied, YaRN RoPE (factor 4, original 16; attention factor 0.1 ln 4 + 1)"),
    "qwen3": (
        Qwen3Config, dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=False),
        [7, 12, 1, 5], 1005,
        "Qwen3ForCausalLM, per-head q/k RMSNorm, head_dim 16 != hidden/heads (q_proj 32->64), MQA, untied"),
    "mistral": (
        MistralConfig, dict(num_key_value_heads=2, tie_word_embeddings=False, sliding_window=None),
        [7, 12, 1, 5], 1006,
        "MistralForCausalLM, untied, sliding_window null, GQA 4/2"),
}
BF16_OF = ["llama_tied", "qwen2", "qwen3", "mistral"]


def all_cases():
    cases = [(name, name, torch.float32) for name in CASES]
    cases += [(name + "_bf16", name, torch.bfloat16) for name in BF16_OF]
    return cases


def randomize_(model, seed):
    """Overwrites every parameter in named_parameters order from one seeded generator.

    Norm weights (input/post-attention/final/q/k norms) are drawn around 1 so a wrong norm shows up;
    everything else (matrices, embeddings, biases) is N(0, INIT_STD^2).
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.25 * r)
            else:
                p.copy_(INIT_STD * r)


def packed_forward(model, input_ids, cu):
    """Per-sequence forward (batch 1, no mask), returns f32 logits/logprobs/entropy and the mean loss."""
    logits_l, lp_l, ent_l = [], [], []
    total = None
    n_targets = 0
    for b in range(len(cu) - 1):
        ids = input_ids[cu[b]:cu[b + 1]]
        out = model(input_ids=ids[None], use_cache=False)
        lg = out.logits[0].float()  # [L, V]; bf16 models: upcast before log_softmax
        logp = torch.log_softmax(lg, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)
        lp = torch.zeros(ids.shape[0], dtype=torch.float32)
        if ids.shape[0] > 1:
            tgt = logp[:-1].gather(-1, ids[1:, None])[:, 0]  # [L-1]
            lp = torch.cat([tgt, torch.zeros(1)])
            s = -tgt.sum()
            total = s if total is None else total + s
            n_targets += ids.shape[0] - 1
        logits_l.append(lg)
        lp_l.append(lp)
        ent_l.append(ent)
    loss = total / n_targets
    return torch.cat(logits_l), torch.cat(lp_l), torch.cat(ent_l), loss


def load(folder, dtype):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")


def make_case(case, base, dtype):
    cls, over, seq_lens, seed, desc = CASES[base]
    out_dir = os.path.join(HERE, case)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)

    config = cls(**BASE, **over)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_(model, seed)
    model.to(dtype)  # bf16 cases: round the f32 draw (same seed as the f32 case) to bf16
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))
    del model

    # Reference computations use the model exactly as transformers loads the saved folder.
    model = load(out_dir, dtype)
    model.train()  # no dropout in these configs; train() only so that nothing eval-specific applies
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 7)
    input_ids = torch.randint(0, vocab, (sum(seq_lens),), generator=g, dtype=torch.int64)
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int64)

    names = [n for n, _ in model.named_parameters()]
    logits, logprobs, entropy, loss = packed_forward(model, input_ids, cu.tolist())
    loss.backward()
    loss = loss.detach()
    golden = {
        "input_ids": input_ids, "cu_seqlens": cu,
        "logits": logits.detach().contiguous(), "logprobs": logprobs.detach().contiguous(),
        "entropy": entropy.detach().contiguous(), "loss": loss.detach().reshape(1),
    }
    for n, p in model.named_parameters():
        golden["grad." + n] = p.grad.detach().float().contiguous()

    if dtype == torch.float32:
        model = load(out_dir, dtype)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), **ADAMW)
        losses = []
        for _ in range(ADAMW_STEPS):
            opt.zero_grad(set_to_none=True)
            l = packed_forward(model, input_ids, cu.tolist())[3]
            l.backward()
            losses.append(float(l.detach()))
            opt.step()
        golden["adamw_loss"] = torch.tensor(losses, dtype=torch.float32)
        for n, p in model.named_parameters():
            golden["adamw_final." + n] = p.detach().float().contiguous()

    save_file(golden, os.path.join(out_dir, "golden.safetensors"), metadata={"case": case})
    meta = {
        "case": case, "description": desc + (" (bf16 weights and compute)" if dtype != torch.float32 else ""),
        "architecture": model.config.architectures[0], "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "seq_lens": seq_lens, "total_tokens": int(sum(seq_lens)), "seed": seed, "init_std": INIT_STD,
        "norm_init": "1 + 0.25 * N(0,1)", "attn_implementation": "eager",
        "params": names,
        "optimizer": ({"name": "torch.optim.AdamW", "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]),
                       "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"], "steps": ADAMW_STEPS}
                      if dtype == torch.float32 else None),
        "loss": float(loss), "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    assert math.isfinite(float(loss))
    print(f"{case:22s} T={sum(seq_lens):3d} loss={float(loss):.5f} "
          f"|logits|max={float(logits.detach().abs().max()):.3f} params={sum(p.numel() for p in model.parameters())}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    wanted = set(sys.argv[1:])
    cases = all_cases()
    unknown = wanted - {c for c, _, _ in cases}
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; known: {[c for c, _, _ in cases]}")
    for case, base, dtype in cases:
        if not wanted or case in wanted:
            make_case(case, base, dtype)


if __name__ == "__main__":
    main()
