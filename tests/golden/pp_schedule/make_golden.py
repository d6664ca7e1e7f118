#!/usr/bin/env python3
"""Writes schedules.json: the reference oracle's pipeline op orders and numbers.

The oracle is the discrete-event simulation of Megatron's 1F1B and interleaved
1F1B in the shared reference (reference/tools/pp_schedule_sim.py). Its
simulate() builds each rank's op list and runs it; this script captures that
list from simulate()'s frame (sys.setprofile, nothing re-implemented), runs it
with chunk costs 1 (forward) and 2 (backward), i.e. tf = v, tb = 2v per stage,
so every time is an integer slot, and takes the peak in-flight count from the
oracle's peak_inflight() (times v: chunk activations).

tests/train/pipeline_schedule_test.cpp compares Kestrel's schedules with it op
for op and its stats exactly. Regenerate (Python only writes the golden):

  python3 tests/golden/pp_schedule/make_golden.py [--oracle PATH/pp_schedule_sim.py]
"""
import argparse
import contextlib
import hashlib
import importlib.util
import io
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]


def find_oracle(arg):
    cands = [pathlib.Path(arg)] if arg else [
        REPO.parent / "shared/reference/tools/pp_schedule_sim.py",
        REPO.parent.parent / "shared/reference/tools/pp_schedule_sim.py",
    ]
    for c in cands:
        if c.is_file():
            return c
    sys.exit("pp_schedule_sim.py not found at " + ", ".join(map(str, cands)) + "; pass --oracle PATH")


def load(path):
    spec = importlib.util.spec_from_file_location("pp_schedule_sim", path)
    mod = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()):  # the oracle prints its own table on import
        spec.loader.exec_module(mod)
    return mod


def run(sim, p, m, v, n):
    """simulate() with integer chunk costs; returns (makespan, per-rank op lists)."""
    seen = {}

    def prof(frame, event, arg):
        if event == "return" and frame.f_code is sim.simulate.__code__:
            seen["ops"] = {r: list(s) for r, s in frame.f_locals["ops"].items()}
    sys.setprofile(prof)
    try:
        makespan, _, bubble_total = sim.simulate(p, m, v, tf=float(v), tb=2.0 * v, N=n)
    finally:
        sys.setprofile(None)
    assert makespan == int(makespan), (p, m, v, makespan)
    ops = [" ".join(f"{k}{mb}.{c}" for k, mb, c in seen["ops"][r]) for r in range(p)]
    return int(makespan), ops, bubble_total


def cases():
    out = []
    for p in (2, 4, 8):
        for m in (1, 2, 3, 4, 5, 8, 16):
            out.append((p, m, 1, 0))
            for v in (2, 4):
                n = p  # Megatron's default group; only where its interleaved check passes
                if n <= m and (m % n == 0 or m % n >= p):
                    out.append((p, m, v, 0))
    # Explicit micro-batch groups (Megatron's docstring example PP2 N3 M5, remainders >= p) and larger runs.
    out += [(2, 5, 2, 3), (2, 5, 4, 3), (4, 9, 2, 5), (4, 10, 2, 5), (4, 12, 2, 6), (4, 32, 2, 8),
            (4, 16, 4, 0), (8, 32, 2, 0), (8, 32, 4, 0)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--oracle")
    ap.add_argument("--out", default=str(HERE / "schedules.json"))
    args = ap.parse_args()
    path = find_oracle(args.oracle)
    sim = load(path)
    rows = []
    for p, m, v, n in cases():
        makespan, ops, bubble_total = run(sim, p, m, v, n or None)
        busy = 3 * m * v  # every rank: m*v chunk forwards (1) and backwards (2)
        peak = [round(x * v) for x in sim.peak_inflight(p, m, v, n or None)]
        rows.append({"p": p, "m": m, "v": v, "group": n, "makespan": makespan,
                     "idle": [makespan - busy] * p, "peak_in_flight": peak,
                     "bubble": round(bubble_total, 12), "ops": ops})
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    with open(args.out, "w") as f:
        f.write('{"oracle": "reference/tools/pp_schedule_sim.py", "oracle_sha256": "%s",\n' % sha)
        f.write(' "costs": "chunk forward 1 slot, chunk backward 2 slots (tf = v, tb = 2v)",\n "cases": [\n')
        f.write(",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in rows))
        f.write("\n]}\n")
    print(f"wrote {len(rows)} cases to {args.out}")


if __name__ == "__main__":
    main()
