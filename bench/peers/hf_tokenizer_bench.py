#!/usr/bin/env python3
"""HF tokenizers encode_batch throughput on the same documents as bench/tokenizer_bench.cpp.

    python3 bench/peers/hf_tokenizer_bench.py [names...]      (default: gpt2 qwen2 llama3)

Each thread count runs in a child process with RAYON_NUM_THREADS set before tokenizers is imported
(rayon reads it once). Best of 3 passes, as in the C++ bench; MB/cpu-s divides by the process CPU
time, which load from other processes on a shared machine does not inflate.
"""
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden", "tokenizer")


def make_docs(corpus, target_bytes=10_000_000, doc_bytes=2048):
    parts = corpus.split("\n")
    lines = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    docs, cur, cur_bytes, total, i = [], [], 0, 0, 0
    while total < target_bytes:
        line = lines[i]
        n = len(line.encode("utf-8"))
        cur.append(line)
        cur_bytes += n
        total += n
        if cur_bytes >= doc_bytes:
            docs.append("".join(cur))
            cur, cur_bytes = [], 0
        i = (i + 1) % len(lines)
    if cur:
        docs.append("".join(cur))
    return docs


def child(name, threads):
    from tokenizers import Tokenizer
    with open(os.path.join(ROOT, "corpus.txt"), encoding="utf-8", newline="") as f:
        docs = make_docs(f.read())
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tok = Tokenizer.from_file(os.path.join(ROOT, name, "tokenizer.json"))
    best, best_cpu, ntok = 1e30, 1e30, 0
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()  # process_time counts rayon's threads too
        out = tok.encode_batch(docs, add_special_tokens=False)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)
        ntok = sum(len(e.ids) for e in out)
    print(f"{name:<8} {threads:>8} {nbytes / 1e6 / best:>10.2f} {nbytes / 1e6 / best_cpu:>12.2f} {ntok:>12}", flush=True)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    names = sys.argv[1:] or ["gpt2", "qwen2", "llama3"]
    print(f"{'name':<8} {'threads':>8} {'MB/s':>10} {'MB/cpu-s':>12} {'tokens':>12}")
    for name in names:
        for threads in (1, 2):
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
            subprocess.run([sys.executable, __file__, "--child", name, str(threads)], env=env, check=True)


if __name__ == "__main__":
    main()
