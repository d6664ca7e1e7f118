#!/usr/bin/env python3
"""Writes the value-model (PPO critic) goldens under tests/golden/critic/<case>/ (committed; tests never run Python).

How to run (from the repository root; CPU only, a few seconds):
    python tests/golden/critic/make_critic_golden.py

Needs torch, transformers (v5) and safetensors. Deterministic: fixed seeds, 1 CPU thread.

A critic is the policy's backbone with transformers' <Arch>ForTokenClassification head, num_labels=1
(what verl's FSDP critic builds with AutoModelForTokenClassification; verl sets classifier_dropout=0).
Per case folder:
  config.json, model.safetensors  as written by save_pretrained (f32)
  golden.safetensors              references from the model reloaded with from_pretrained from that folder
  meta.json                       seq_lens, seed, versions, description

golden.safetensors keys ([T] = packed rows, B sequences):
  input_ids  int64 [T]     packed sequences, tokens uniform in [0, V)
  cu_seqlens int64 [B+1]   sequence boundaries into the packed rows
  values     f32 [T]       score head output, each sequence run alone (batch 1, positions from 0), concatenated
  weights    f32 [T]       fixed coefficients c of the objective J = sum_t c_t * values_t
  objective  f32 [1]       J
  grad.<hf param name>     f32, d J / d param
"""
import json
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForTokenClassification, LlamaConfig, Qwen2Config

HERE = os.path.dirname(os.path.abspath(__file__))
INIT_STD = 0.2
BASE = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=96,
            max_position_embeddings=64, num_attention_heads=4, rms_norm_eps=1e-6,
            num_labels=1, classifier_dropout=0.0)

# name -> (config class, overrides, seq_lens, seed, description)
CASES = {
    "qwen2": (Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True),
              [7, 12, 1, 5], 2001,
              "Qwen2ForTokenClassification, num_labels 1, score with bias (transformers' default), "
              "tied-embedding config (the head is untied regardless), GQA 4/2"),
    "llama_nobias": (LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=False,
                                       token_classification_bias=False),
                     [9, 3, 14], 2002,
                     "LlamaForTokenClassification, num_labels 1, score without bias "
                     "(token_classification_bias false)"),
}


def randomize_(model, seed):
    """Norm weights around 1, everything else (score head included) N(0, INIT_STD^2), one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + 0.25 * r if "norm" in name else INIT_STD * r)


def packed_values(model, input_ids, cu):
    vals = []
    for b in range(len(cu) - 1):
        ids = input_ids[cu[b]:cu[b + 1]]
        out = model(input_ids=ids[None], use_cache=False)
        vals.append(out.logits[0, :, 0].float())  # [L]
    return torch.cat(vals)


def make_case(case):
    cls, over, seq_lens, seed, desc = CASES[case]
    out_dir = os.path.join(HERE, case)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    config = cls(**BASE, **over)
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(config, attn_implementation="eager", dtype=torch.float32)
    randomize_(model, seed)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))
    del model

    model = AutoModelForTokenClassification.from_pretrained(out_dir, dtype=torch.float32,
                                                            attn_implementation="eager")
    model.train()  # classifier_dropout 0: nothing random
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 7)
    input_ids = torch.randint(0, vocab, (sum(seq_lens),), generator=g, dtype=torch.int64)
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int64)
    weights = torch.randn(sum(seq_lens), generator=g, dtype=torch.float32)
    values = packed_values(model, input_ids, cu.tolist())
    objective = (weights * values).sum()
    objective.backward()
    golden = {"input_ids": input_ids, "cu_seqlens": cu, "values": values.detach().contiguous(),
              "weights": weights, "objective": objective.detach().reshape(1)}
    names = []
    for n, p in model.named_parameters():
        golden["grad." + n] = p.grad.detach().float().contiguous()
        names.append(n)
    save_file(golden, os.path.join(out_dir, "golden.safetensors"), metadata={"case": case})
    meta = {"case": case, "description": desc, "architecture": model.config.architectures[0],
            "dtype": "fp32", "seq_lens": seq_lens, "total_tokens": int(sum(seq_lens)), "seed": seed,
            "init_std": INIT_STD, "norm_init": "1 + 0.25 * N(0,1)", "attn_implementation": "eager",
            "params": names, "objective": float(objective.detach()), "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(f"{case:14s} T={sum(seq_lens):3d} J={float(objective):.5f} |values|max={float(values.abs().max()):.3f} "
          f"params={names[-2:]}")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    wanted = sys.argv[1:] or list(CASES)
    for c in wanted:
        if c not in CASES:
            sys.exit(f"unknown case {c}; known: {list(CASES)}")
        make_case(c)


if __name__ == "__main__":
    main()
