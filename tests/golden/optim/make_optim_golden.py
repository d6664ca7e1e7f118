#!/usr/bin/env python3
"""Writes adamw_golden.json: torch.optim.AdamW on a few f32 parameters for 5
steps with given gradients, for tests/optim/adamw_test.cpp.

Run from the repository root:  python3 tests/golden/optim/make_optim_golden.py
Inputs are generated from a fixed seed and stored in the JSON next to the
outputs, so the C++ test needs nothing but the file. One parameter group has
weight decay, one has none (as norms/biases); the learning rate changes per
step as a schedule would.
"""
import json
import os

import torch

STEPS = 5
LRS = [1e-2, 2e-2, 5e-3, 1e-2, 3e-2]
BETAS = (0.9, 0.95)
EPS = 1e-8
WD = 0.1


def main():
    g = torch.Generator().manual_seed(1234)
    shapes = {"w": (3, 4), "b": (5,), "n": (7,)}
    decay = {"w": True, "b": False, "n": True}
    init = {k: torch.randn(s, generator=g, dtype=torch.float32) for k, s in shapes.items()}
    # Grads of mixed scale, including tiny values where eps matters.
    grads = {k: [torch.randn(s, generator=g, dtype=torch.float32) * (10.0 ** (i % 3 - 1)) for i in range(STEPS)]
             for k, s in shapes.items()}
    grads["n"][2][0] = 0.0
    grads["n"][3][1] = 1e-9

    params = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
    groups = [{"params": [params[k] for k in shapes if decay[k]], "weight_decay": WD},
              {"params": [params[k] for k in shapes if not decay[k]], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LRS[0], betas=BETAS, eps=EPS, foreach=False)
    after = {k: [] for k in shapes}
    for step in range(STEPS):
        for grp in opt.param_groups:
            grp["lr"] = LRS[step]
        for k, p in params.items():
            p.grad = grads[k][step].clone()
        opt.step()
        for k, p in params.items():
            after[k].append(p.detach().flatten().tolist())
    state = {k: {"exp_avg": opt.state[params[k]]["exp_avg"].flatten().tolist(),
                 "exp_avg_sq": opt.state[params[k]]["exp_avg_sq"].flatten().tolist()} for k in shapes}

    out = {
        "generator": "tests/golden/optim/make_optim_golden.py",
        "torch_version": torch.__version__,
        "betas": list(BETAS), "eps": EPS, "weight_decay": WD, "lrs": LRS,
        "params": [{"name": k, "shape": list(shapes[k]), "decay": decay[k],
                    "init": init[k].flatten().tolist(),
                    "grads": [gr.flatten().tolist() for gr in grads[k]],
                    "after_step": after[k],
                    "final_exp_avg": state[k]["exp_avg"],
                    "final_exp_avg_sq": state[k]["exp_avg_sq"]} for k in shapes],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adamw_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
