#!/usr/bin/env python3
"""Serve a verl-style Python reward function over Kestrel's JSON-lines reward protocol.

    python3 scripts/reward_adapter.py --path my_reward.py --name compute_score [--kwargs '{"k": 1}'] [--check] [--batch]

The function is verl's custom_reward_function:

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict

called with keyword arguments (as verl's NaiveRewardManager does), plus the
--kwargs JSON object (custom_reward_function.reward_kwargs).

With --batch (reward_model.reward_manager=batch) it is verl's batch function

    def compute_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list

called once per batch: Kestrel sends a line {"batch": B} before the B request
lines, and the list's items (floats or dicts) are answered in order. An
exception, or a result that is not a list of B items, fails all B answers.

Protocol: one request per stdin line
    {"id": 3, "data_source": ..., "solution_str": ..., "ground_truth": ..., "extra_info": ...}
one answer per stdout line, in order:
    {"id": 3, "score": 1.0, <other keys of a dict result>}
An exception or a non-numeric / non-finite result is answered with
{"id": 3, "score": null, "error": "..."} (Kestrel scores it 0 and counts it as
garbage) and the traceback goes to stderr; the adapter keeps serving.

Anything the reward code prints (print(), C extensions writing to fd 1) goes
to stderr, so it cannot corrupt the protocol stream. --check loads the file,
checks the function and its signature, and exits 0 (or 1 with the reason).
"""
import argparse
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback


def load_function(path, name):
    if not os.path.isfile(path):
        raise RuntimeError(f"custom_reward_function.path: no such file: {path}")
    spec = importlib.util.spec_from_file_location("custom_reward_module", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_reward_module"] = module
    # The user's folder first on sys.path, so helper modules beside it import.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise RuntimeError(
            f"{path} defines no '{name}' (custom_reward_function.name); callables in it: {', '.join(defined) or 'none'}")
    fn = getattr(module, name)
    if not callable(fn):
        raise RuntimeError(f"{path}: '{name}' is not callable")
    return fn


def check_signature(fn, name, kwargs, batch=False):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins etc.: nothing to check
    args = ("data_sources", "solution_strs", "ground_truths", "extra_infos") if batch else (
        "data_source", "solution_str", "ground_truth", "extra_info")
    try:
        sig.bind(**{a: None for a in args}, **kwargs)
    except TypeError as e:
        raise RuntimeError(
            f"'{name}{sig}' cannot be called as {name}({', '.join(a + '=...' for a in args)}"
            f"{', ' + ', '.join(k + '=...' for k in kwargs) if kwargs else ''}): {e}")


def error_line(req_id, e):
    print(f"reward_adapter: request id {req_id}: {type(e).__name__}: {e}", file=sys.stderr)
    if not isinstance(e, ValueError):
        traceback.print_exc(file=sys.stderr)
    return json.dumps({"id": req_id, "score": None, "error": f"{type(e).__name__}: {e}"}, default=repr)


def answer_line(req_id, result):
    return json.dumps(to_answer(req_id, result), ensure_ascii=False, allow_nan=False, default=repr)


def serve_batch(fn, kwargs, n, lines, proto):
    """One call of the batch function for the n request lines that follow a {"batch": n} header."""
    reqs = []
    for _ in range(n):
        raw = next(lines, None)
        if raw is None:
            return False
        try:
            reqs.append(json.loads(raw))
        except Exception:  # noqa: BLE001 - answered below as a failed batch
            reqs.append({})
    ids = [r.get("id") for r in reqs]
    try:
        results = fn(data_sources=[r.get("data_source") for r in reqs],
                     solution_strs=[r.get("solution_str") for r in reqs],
                     ground_truths=[r.get("ground_truth") for r in reqs],
                     extra_infos=[r.get("extra_info") for r in reqs], **kwargs)
        results = list(results)
        if len(results) != n:
            raise ValueError(f"the batch function returned {len(results)} results for {n} requests")
    except Exception as e:  # noqa: BLE001
        out = [error_line(i, e) for i in ids]
    else:
        out = []
        for i, res in zip(ids, results):
            try:
                out.append(answer_line(i, res))
            except Exception as e:  # noqa: BLE001
                out.append(error_line(i, e))
    proto.write("\n".join(out) + "\n")
    proto.flush()
    return True


def to_answer(req_id, result):
    """The answer object for one result, or raises ValueError saying what is wrong."""
    extra = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"the returned dict has no 'score' key (keys: {sorted(result)})")
        extra = {k: v for k, v in result.items() if k not in ("score", "id")}
        result = result["score"]
    if hasattr(result, "item"):  # numpy / torch scalars
        result = result.item()
    if isinstance(result, bool):
        result = float(result)
    if not isinstance(result, (int, float)):
        raise ValueError(f"the score is a {type(result).__name__}, not a number: {result!r}")
    score = float(result)
    if not math.isfinite(score):
        raise ValueError(f"the score is not finite: {score}")
    answer = {"id": req_id, "score": score}
    answer.update(extra)
    return answer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path", required=True, help="Python file defining the reward function")
    ap.add_argument("--name", default="compute_score", help="function name in --path")
    ap.add_argument("--kwargs", default="{}", help="JSON object of extra keyword arguments")
    ap.add_argument("--check", action="store_true", help="load and check the function, then exit")
    ap.add_argument("--batch", action="store_true", help="call a batch function once per {\"batch\": B} group")
    args = ap.parse_args()

    # Keep the protocol on a private copy of stdout; fd 1 becomes stderr so
    # prints in the reward code (Python or C) land in the log.
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    try:
        kwargs = json.loads(args.kwargs)
        if not isinstance(kwargs, dict):
            raise RuntimeError(f"--kwargs must be a JSON object, got {args.kwargs}")
        fn = load_function(args.path, args.name)
        check_signature(fn, args.name, kwargs, batch=args.batch)
    except Exception as e:  # noqa: BLE001 - report anything the user's module raises
        traceback.print_exc(file=sys.stderr)
        print(f"reward_adapter: {e}", file=sys.stderr)
        return 1
    if args.check:
        return 0

    lines = (raw for raw in sys.stdin.buffer if raw.strip())
    for raw in lines:
        if args.batch:
            try:
                header = json.loads(raw)
                n = int(header["batch"])
            except Exception as e:  # noqa: BLE001
                print(f"reward_adapter: --batch expects a {{\"batch\": B}} line, got {raw[:80]!r}: {e}", file=sys.stderr)
                return 1
            if not serve_batch(fn, kwargs, n, lines, proto):
                return 0
            continue
        req_id = None
        try:
            req = json.loads(raw)
            req_id = req.get("id")
            result = fn(data_source=req.get("data_source"), solution_str=req.get("solution_str"),
                        ground_truth=req.get("ground_truth"), extra_info=req.get("extra_info"), **kwargs)
            line = answer_line(req_id, result)
        except Exception as e:  # noqa: BLE001
            line = error_line(req_id, e)
        proto.write(line + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
