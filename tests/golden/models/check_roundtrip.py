#!/usr/bin/env python3
"""Checks that a model folder (e.g. one saved by Kestrel) loads in transformers and reproduces a golden.

Usage (from the repository root):
    python tests/golden/models/check_roundtrip.py DIR [--golden G] [--tol X]

DIR     folder with config.json + *.safetensors (single file or sharded with an index), loadable by
        transformers' AutoModelForCausalLM.from_pretrained.
G       a golden.safetensors file or a folder holding one (default: DIR/golden.safetensors).
        Its input_ids / cu_seqlens are run through the loaded model one sequence at a time (batch 1,
        positions from 0, eager attention and eager experts), in the dtype stored in DIR's weights.
--tol   exit status 1 when max |logits - golden logits| exceeds it, or (MoE goldens of make_moe_golden.py)
        when a token's chosen experts differ from the golden's routing.<layer> (default: only print).

Prints the max |logits| difference, for MoE goldens the number of tokens routed differently, and the max
|param - golden adamw_final.param| when DIR holds trained fp32 weights (compares to the golden's adamw_final.*
when present, to spot an optimizer round trip; stacked experts are compared under their per-expert saved names).
"""
import argparse
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--golden", default=None)
    ap.add_argument("--tol", type=float, default=None)
    args = ap.parse_args()

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)

    gpath = args.golden or args.dir
    if os.path.isdir(gpath):
        gpath = os.path.join(gpath, "golden.safetensors")
    if not os.path.isfile(gpath):
        sys.exit(f"{gpath}: no golden.safetensors; pass --golden FILE_OR_DIR")
    golden = load_file(gpath)
    for k in ("input_ids", "cu_seqlens", "logits"):
        if k not in golden:
            sys.exit(f"{gpath}: missing key '{k}' (expected a file written by make_golden.py)")

    model = AutoModelForCausalLM.from_pretrained(args.dir, dtype="auto", attn_implementation="eager",
                                                 experts_implementation="eager")
    model.eval()
    dtype = model.get_input_embeddings().weight.dtype  # DeepSeek routers stay f32 in a bf16 model
    ids, cu = golden["input_ids"], golden["cu_seqlens"].tolist()
    chosen = {}  # MoE layer -> per-sequence top-k indices, from hooks on the routers (mlp.gate)
    hooks = []
    for l, layer in enumerate(model.model.layers):
        if hasattr(layer.mlp, "experts"):
            chosen[l] = []
            hooks.append(layer.mlp.gate.register_forward_hook(lambda _m, _i, out, l=l: chosen[l].append(out[2])))
    with torch.no_grad():
        logits = torch.cat([model(input_ids=ids[cu[b]:cu[b + 1]][None], use_cache=False).logits[0].float()
                            for b in range(len(cu) - 1)])
    for h in hooks:
        h.remove()
    ref = golden["logits"]
    if logits.shape != ref.shape:
        sys.exit(f"logits shape {tuple(logits.shape)} != golden {tuple(ref.shape)}: wrong vocab or golden")
    diff = float((logits - ref).abs().max())
    print(f"dir={args.dir} dtype={dtype} golden={gpath}")
    print(f"max_abs_logits_diff={diff:.6g} (max |golden logits| {float(ref.abs().max()):.4g})")

    misrouted = 0
    for l, calls in chosen.items():
        key = f"routing.{l}"
        if key not in golden:
            sys.exit(f"{gpath}: no '{key}' for MoE layer {l} (expected a file written by make_moe_golden.py)")
        got = torch.cat(calls).sort(-1).values.to(torch.int32)
        misrouted += int((got != golden[key]).any(-1).sum())
    if chosen:
        print(f"tokens_routed_differently={misrouted} (over {len(chosen)} MoE layers)")

    final = {k[len("adamw_final."):]: v for k, v in golden.items() if k.startswith("adamw_final.")}
    if final:
        params = saved_names(model)
        missing = [n for n in final if n not in params]
        if not missing:
            d = max(float((params[n].float() - v).abs().max()) for n, v in final.items())
            print(f"max_abs_param_diff_vs_adamw_final={d:.6g} (near 0 only if DIR holds the weights after the "
                  f"golden's 3 AdamW steps)")
    if args.tol is not None and not (diff <= args.tol and misrouted == 0):
        print(f"FAIL: max logits diff {diff} (tol {args.tol}), {misrouted} tokens routed differently")
        sys.exit(1)


def saved_names(model):
    """{name save_pretrained writes: tensor}: HF's stacked experts (gate_up_proj [E, 2I, D], down_proj [E, D, I])
    split per expert, plus the DeepSeek-V3 correction-bias buffers."""
    out = {}
    for name, p in model.named_parameters():
        p = p.detach()
        if name.endswith(".experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], p.shape[1] // 2
            for e in range(p.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = p[e, :inter]
                out[f"{base}{e}.up_proj.weight"] = p[e, inter:]
        elif name.endswith(".experts.down_proj"):
            for e in range(p.shape[0]):
                out[f"{name[: -len('down_proj')]}{e}.down_proj.weight"] = p[e]
        else:
            out[name] = p
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            out[name] = b
    return out


if __name__ == "__main__":
    main()
