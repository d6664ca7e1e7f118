#!/usr/bin/env python3
"""Writes the Parquet fixtures of Kestrel's reader tests (committed; `make
test` needs no Python). Run from the repo root: python3 tests/data/parquet/make_fixtures.py

gsm8k.jsonl        10 rows in verl's gsm8k layout (examples/data_preprocess/gsm8k.py):
                   data_source, prompt [{role, content}], ability, reward_model
                   {style, ground_truth}, extra_info {split, index, answer, question}
gsm8k_*.parquet    the same rows, each in one writer configuration (VARIANTS), row
                   groups of 4 rows (4 + 4 + 2) and small pages (several per chunk)
types.parquet      every type the reader builds, with nulls, empty and null lists,
                   nested lists, a map, a struct, BYTE_STREAM_SPLIT, page CRCs
types.expected.jsonl  pyarrow's rows of types.parquet (maps as JSON objects)
sft_messages.parquet / .jsonl  multi-turn SFT rows: messages [{role, content}]
unsupported_*.parquet  what the reader refuses: binary and timestamp columns, LZ4 pages
manifest.json      per file: codec, data page version, encodings pyarrow reports
"""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."

PROBLEMS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10"),
    ("Betty has 5 apples and buys 7 more. How many apples does she have?", "5 + 7 = <<5+7=12>>12\n#### 12"),
    ("A pen costs 3 dollars. How much do 4 pens cost?", "3 * 4 = <<3*4=12>>12\n#### 12"),
    ("Tom had 20 marbles and gave away 8. How many are left?", "20 - 8 = <<20-8=12>>12\n#### 12"),
    ("A train travels 60 km each hour. How far does it go in 3 hours?", "60 * 3 = <<60*3=180>>180\n#### 180"),
    ("Sara baked 24 cookies and shared them equally among 6 friends. How many did each get?",
     "24 / 6 = <<24/6=4>>4\n#### 4"),
    ("Caf\u00e9 au lait costs \u20ac2 and a croissant \u20ac3. What do both cost?", "2 + 3 = <<2+3=5>>5\n#### 5"),
    ("Jan is 9 years old. Her brother is twice her age. How old is he?", "9 * 2 = <<9*2=18>>18\n#### 18"),
    ("There are 15 birds on a tree and 6 fly away. How many remain?", "15 - 6 = <<15-6=9>>9\n#### 9"),
]


def gsm8k_rows():
    rows = []
    for idx, (q, a) in enumerate(PROBLEMS):
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": q + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": a.split("#### ")[1]},
            "extra_info": {"split": "train", "index": idx, "answer": a, "question": q},
        })
    return rows


STRING_COLS = ["data_source", "prompt.list.element.role", "prompt.list.element.content", "ability",
               "reward_model.style", "reward_model.ground_truth", "extra_info.split", "extra_info.answer",
               "extra_info.question"]

# name -> pq.write_table options (row_group_size and data_page_size added below)
VARIANTS = {
    "snappy": dict(),  # pyarrow's defaults: snappy, dictionary pages, data page v1
    "zstd_v2": dict(compression="zstd", data_page_version="2.0", write_page_index=True),
    "gzip_plain": dict(compression="gzip", use_dictionary=False),
    "none_v2": dict(compression="none", data_page_version="2.0"),
    "delta": dict(compression="snappy", data_page_version="2.0", use_dictionary=False,
                  column_encoding={**{c: "DELTA_BYTE_ARRAY" for c in STRING_COLS[:5]},
                                   **{c: "DELTA_LENGTH_BYTE_ARRAY" for c in STRING_COLS[5:]},
                                   "extra_info.index": "DELTA_BINARY_PACKED"}),
}


def types_table():
    n = 9
    def nth_null(vals, every):
        return [None if i % every == every - 1 else v for i, v in enumerate(vals)]
    cols = {
        "b": pa.array(nth_null([i % 2 == 0 for i in range(n)], 4), pa.bool_()),
        "i8": pa.array(nth_null([-128 + i for i in range(n)], 3), pa.int8()),
        "i16": pa.array([-32768 + 1000 * i for i in range(n)], pa.int16()),
        "i32": pa.array(nth_null([-(2 ** 31) + i * 12345 for i in range(n)], 5), pa.int32()),
        "i64": pa.array([-(2 ** 63), 2 ** 63 - 1] + [i * 10 ** 12 for i in range(n - 2)], pa.int64()),
        "u8": pa.array([255 - i for i in range(n)], pa.uint8()),
        "u32": pa.array([2 ** 32 - 1 - i for i in range(n)], pa.uint32()),
        "u64": pa.array([2 ** 64 - 1 - i for i in range(n)], pa.uint64()),
        "f32": pa.array(nth_null([0.1 * i - 0.35 for i in range(n)], 4), pa.float32()),
        "f64": pa.array([1e300, -2.5e-300] + [i / 7 for i in range(n - 2)], pa.float64()),
        "s": pa.array(nth_null(["", "a", "\u00fcber", "\U0001F600 emoji", "x" * 300, "dup", "dup", "dup", "z"], 4)),
        "nothing": pa.array([None] * n, pa.null()),
        "li": pa.array([[1, 2], [], None, [None, 4], [5], [6, 7, 8], [], [9], None], pa.list_(pa.int64())),
        "lli": pa.array([[[1], [2, 3]], [], None, [[], None, [4]], [[5]], [[6]], [None], [[7, 8]], [[9]]],
                        pa.list_(pa.list_(pa.int32()))),
        "ls": pa.array([["a"], ["b", None], None, [], ["c", "d", "e"], ["f"], ["g"], ["h"], ["i"]],
                       pa.list_(pa.string())),
        "m": pa.array([[("k", 1)], [], None, [("a", None), ("b", 2)], [("c", 3)], [("d", 4)], [("e", 5)],
                       [("f", 6)], [("g", 7)]], pa.map_(pa.string(), pa.int64())),
        "st": pa.array([{"x": 1, "y": "one"}, None, {"x": None, "y": "three"}, {"x": 4, "y": None},
                        {"x": 5, "y": "five"}, {"x": 6, "y": "six"}, None, {"x": 8, "y": "eight"},
                        {"x": 9, "y": "nine"}], pa.struct([("x", pa.int32()), ("y", pa.string())])),
        "lst": pa.array([[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}], [None], None,
                         [], [{"role": "user", "content": "4"}], [{"role": None, "content": "5"}],
                         [{"role": "user", "content": "6"}], [{"role": "user", "content": "7"}],
                         [{"role": "user", "content": "8"}]],
                        pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        "bss_f": pa.array([1.5 * i for i in range(n)], pa.float32()),
        "bss_d": pa.array(nth_null([-0.25 * i for i in range(n)], 2), pa.float64()),
    }
    return pa.table(cols)


def expected_rows(table):
    rows = table.to_pylist()
    for r in rows:  # maps come back as lists of (key, value); the reader gives JSON objects
        if r["m"] is not None:
            r["m"] = {k: v for k, v in r["m"]}
    return rows


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def describe(path):
    md = pq.ParquetFile(path).metadata
    encs = set()
    codecs = set()
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            cc = md.row_group(g).column(c)
            encs.update(cc.encodings)
            codecs.add(cc.compression)
    return {"rows": md.num_rows, "row_groups": md.num_row_groups, "codecs": sorted(codecs),
            "encodings": sorted(encs)}


def main():
    manifest = {}
    rows = gsm8k_rows()
    write_jsonl(os.path.join(HERE, "gsm8k.jsonl"), rows)
    table = pa.Table.from_pylist(rows)
    for name, opts in VARIANTS.items():
        path = os.path.join(HERE, f"gsm8k_{name}.parquet")
        pq.write_table(table, path, row_group_size=4, data_page_size=256, **opts)
        assert pq.read_table(path).to_pylist() == rows
        manifest[os.path.basename(path)] = describe(path)

    sft = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
           for q, a in PROBLEMS[:6]]
    write_jsonl(os.path.join(HERE, "sft_messages.jsonl"), sft)
    path = os.path.join(HERE, "sft_messages.parquet")
    pq.write_table(pa.Table.from_pylist(sft), path, row_group_size=4)
    manifest["sft_messages.parquet"] = describe(path)

    for name, col, opts in [("binary", pa.array([b"\x00\xff"] * 2, pa.binary()), {}),
                            ("timestamp", pa.array([0, 1], pa.timestamp("ms")), {}),
                            ("lz4", pa.array(["a", "b"]), {"compression": "lz4"})]:
        path = os.path.join(HERE, f"unsupported_{name}.parquet")
        pq.write_table(pa.table({"data_source": ["x", "y"], "extra": col}), path, **opts)
        manifest[os.path.basename(path)] = describe(path)

    t = types_table()
    path = os.path.join(HERE, "types.parquet")
    pq.write_table(t, path, row_group_size=4, data_page_size=64, data_page_version="2.0", compression="zstd",
                   write_page_checksum=True, column_encoding={"bss_f": "BYTE_STREAM_SPLIT", "bss_d": "BYTE_STREAM_SPLIT"},
                   use_dictionary=["s", "ls", "i32", "u64"])
    write_jsonl(os.path.join(HERE, "types.expected.jsonl"), expected_rows(pq.read_table(path)))
    manifest["types.parquet"] = describe(path)
    path = os.path.join(HERE, "types_v1_snappy.parquet")
    pq.write_table(t, path, row_group_size=5, data_page_size=64, write_page_checksum=True)
    assert expected_rows(pq.read_table(path)) == expected_rows(t)
    manifest["types_v1_snappy.parquet"] = describe(path)
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump({"pyarrow": pa.__version__, "files": manifest}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
