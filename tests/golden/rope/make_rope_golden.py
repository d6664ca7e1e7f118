#!/usr/bin/env python3
"""Writes tests/golden/rope/rope_golden.json: HF transformers' RoPE inv_freq,
attention scaling and cos/sin (LlamaRotaryEmbedding, float32) for each
rope_scaling type Kestrel supports. tests/ops/rope_test.cpp checks
kestrel::ops::rope_inv_freq and make_rope_table against it.

Run from the repository root: python3 tests/golden/rope/make_rope_golden.py
"""
import json
import os

import numpy as np
import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

# name, head_dim, max_position_embeddings, rope_parameters (HF keys)
CASES = [
    ("default_d64", 64, 4096, {"rope_type": "default", "rope_theta": 10000.0}),
    ("default_d128_theta5e5", 128, 8192, {"rope_type": "default", "rope_theta": 500000.0}),
    ("default_d24_theta1e6", 24, 4096, {"rope_type": "default", "rope_theta": 1000000.0}),
    ("linear_f4", 64, 16384, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("llama3_8b", 128, 131072, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}),
    ("llama3_small", 64, 32768, {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 32.0,
                                 "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                                 "original_max_position_embeddings": 1024}),
    ("yarn_qwen", 128, 131072, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                "original_max_position_embeddings": 32768}),
    ("yarn_betas_d64", 64, 16384, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                   "beta_fast": 16.0, "beta_slow": 2.0,
                                   "original_max_position_embeddings": 2048}),
    ("yarn_attention_factor", 64, 16384, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "attention_factor": 0.8, "original_max_position_embeddings": 4096}),
    ("yarn_mscale", 64, 163840, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                "mscale": 1.0, "mscale_all_dim": 0.707,
                                "original_max_position_embeddings": 4096}),
    ("yarn_no_truncate", 64, 131072, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                     "truncate": False, "original_max_position_embeddings": 4096}),
]
POSITIONS = [0, 1, 7, 1000, 4095]


def kestrel_config(head_dim, rp):
    """The same parameters in Kestrel's RopeConfig field names."""
    out = {"head_dim": head_dim, "theta": rp["rope_theta"], "scaling_type": rp["rope_type"]}
    keys = {"factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
            "original_max_position_embeddings": "original_max_position", "beta_fast": "beta_fast",
            "beta_slow": "beta_slow", "attention_factor": "attention_factor", "mscale": "mscale",
            "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}
    for k, v in keys.items():
        if k in rp:
            out[v] = rp[k]
    return out


def f32(values):
    """Shortest decimal that round-trips each float32 (keeps the file small)."""
    return [float(str(np.float32(v))) for v in values]


def main():
    cases = []
    for name, head_dim, max_pos, rp in CASES:
        cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                          max_position_embeddings=max_pos, rope_parameters=dict(rp))
        rot = LlamaRotaryEmbedding(cfg)
        inv_freq = rot.inv_freq.to(torch.float32)
        x = torch.zeros(1, len(POSITIONS), head_dim, dtype=torch.float32)
        pos = torch.tensor([POSITIONS], dtype=torch.int64)
        cos, sin = rot(x, pos)
        half = head_dim // 2
        # HF's cos/sin repeat the half ([freqs, freqs]); Kestrel stores one half.
        assert torch.equal(cos[0, :, :half], cos[0, :, half:])
        cases.append({
            "name": name,
            "config": kestrel_config(head_dim, rp),
            "inv_freq": f32(inv_freq.tolist()),
            "attention_scaling": float(rot.attention_scaling),
            "positions": POSITIONS,
            "cos": [f32(row) for row in cos[0, :, :half].tolist()],
            "sin": [f32(row) for row in sin[0, :, :half].tolist()],
        })
    out = {"generator": "tests/golden/rope/make_rope_golden.py", "transformers_version": transformers.__version__,
           "torch_version": torch.__version__, "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rope_golden.json")
    with open(path, "w") as f:
        # One case per line: small, and diffs stay readable.
        head = {k: v for k, v in out.items() if k != "cases"}
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
