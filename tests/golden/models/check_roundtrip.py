#!/usr/bin/env python3
"""Checks that a model folder (e.g. one saved by Kestrel) loads in transformers and reproduces a golden.

Usage (from the repository root):
    python tests/golden/models/check_roundtrip.py DIR [--golden G] [--tol X]

DIR     folder with config.json + *.safetensors (single file or sharded with an index), loadable by
        transformers' AutoModelForCausalLM.from_pretrained.
G       a golden.safetensors file or a folder holding one (default: DIR/golden.safetensors).
        Its input_ids / cu_seqlens are run through the loaded model one sequence at a time (batch 1,
        positions from 0, eager attention), in the dtype stored in DIR's weights.
--tol   exit status 1 when max |logits - golden logits| exceeds it (default: only print).

Prints the max |logits| difference, and the max |param - golden adamw_final.param| when DIR holds
trained fp32 weights (compares to the golden's adamw_final.* when present, to spot an optimizer round trip).
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

    model = AutoModelForCausalLM.from_pretrained(args.dir, dtype="auto", attn_implementation="eager")
    model.eval()
    dtype = next(model.parameters()).dtype
    ids, cu = golden["input_ids"], golden["cu_seqlens"].tolist()
    with torch.no_grad():
        logits = torch.cat([model(input_ids=ids[cu[b]:cu[b + 1]][None], use_cache=False).logits[0].float()
                            for b in range(len(cu) - 1)])
    ref = golden["logits"]
    if logits.shape != ref.shape:
        sys.exit(f"logits shape {tuple(logits.shape)} != golden {tuple(ref.shape)}: wrong vocab or golden")
    diff = float((logits - ref).abs().max())
    print(f"dir={args.dir} dtype={dtype} golden={gpath}")
    print(f"max_abs_logits_diff={diff:.6g} (max |golden logits| {float(ref.abs().max()):.4g})")

    final = {k[len("adamw_final."):]: v for k, v in golden.items() if k.startswith("adamw_final.")}
    if final:
        params = dict(model.named_parameters())
        missing = [n for n in final if n not in params]
        if not missing:
            d = max(float((params[n].detach().float() - v).abs().max()) for n, v in final.items())
            print(f"max_abs_param_diff_vs_adamw_final={d:.6g} (near 0 only if DIR holds the weights after the "
                  f"golden's 3 AdamW steps)")
    if args.tol is not None and not diff <= args.tol:
        print(f"FAIL: {diff} > tol {args.tol}")
        sys.exit(1)


if __name__ == "__main__":
    main()
