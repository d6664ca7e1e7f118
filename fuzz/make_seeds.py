#!/usr/bin/env python3
"""Writes the committed seed corpora of fuzz/corpus/<target>/ (small files).

Seeds are valid inputs of each parser (so the fuzzer starts from deep paths)
plus the bad inputs of issue 20, which stay as regression seeds: each must be
refused without a crash. Rerun after changing it: python3 fuzz/make_seeds.py
"""
import json, os, struct, shutil, glob

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(C, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def copy(target, name, src):
    with open(os.path.join(ROOT, src), "rb") as f:
        put(target, name, f.read())


# --- tokenizer.json --------------------------------------------------------
def bytelevel_tok(vocab_extra=None, added=None):
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + ["Ġ", "Ċ"]
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [["Ġ", "t"], ["h", "e"], ["Ġt", "he"], ["1", "2"]]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if vocab_extra:
        vocab.update(vocab_extra)
    n = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added if added is not None else [
            {"id": n, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True},
            {"id": n + 1, "content": "<|im_start|>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}| ?\\p{L}+| ?[^\\s\\p{L}\\p{N}]+|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                                                   {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [n], "tokens": ["<|endoftext|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges}}


def bytefb_tok():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for w in ["▁", "a", "b", "▁a", "ab"]:
        vocab[w] = len(vocab)
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 0, "content": "<unk>", "special": True, "normalized": False},
                             {"id": 1, "content": "<s>", "special": True, "normalized": False}],
            "normalizer": None, "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext", "invert": False},
            "post_processor": {"type": "RobertaProcessing", "cls": ["<s>", 1], "sep": ["</s>", 2]},
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                          {"type": "ByteFallback"}, {"type": "Fuse"},
                                                          {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                      "vocab": vocab, "merges": ["▁ a", "a b"]}}


put("tokenizer_load", "bytelevel.json", json.dumps(bytelevel_tok()))
put("tokenizer_load", "bytefb.json", json.dumps(bytefb_tok()))
# issue 20: a negative id wrote out of bounds; 2^40 aliased token 0; added ids -5 / 100000 were emitted.
put("tokenizer_load", "bad_negative_id.json", json.dumps(bytelevel_tok({"zz": -3})))
put("tokenizer_load", "bad_id_2pow40.json", json.dumps(bytelevel_tok({"zz": 2 ** 40})))
for bad in (-5, 100000):
    put("tokenizer_load", "bad_added_id_%d.json" % bad, json.dumps(bytelevel_tok(added=[
        {"id": bad, "content": "<x>", "special": True, "normalized": False}])))
put("tokenizer_load", "deep.json", '{"model":' + "[" * 5000 + "]" * 5000 + "}")

# --- tokenizer encode (first byte picks the tokenizer) ------------------------
for i, text in enumerate(["Hello world 12345", "<|im_start|>user\nhi<|im_end|>\n", "  héllo\t🙂 ÿ\xff",
                          "<|begin_of_text|>x = 3 * 4", "a b ab  \n\n"]):
    put("tokenizer_encode", "t%d" % i, bytes([i | (0x80 if i % 2 else 0)]) + text.encode("utf-8", "surrogateescape"))

# --- safetensors ------------------------------------------------------------
def st(header, data):
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "f32.safetensors", st({"__metadata__": {"format": "pt"},
                                          "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                                          "b": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]},
                                          "h": {"dtype": "F16", "shape": [2], "data_offsets": [20, 24]}},
                                         struct.pack("<4f", 1, -2, 3.5, 0) + b"\x80\x3f\x00\xc0" + b"\x00\x3c\x00\xc0"))
put("safetensors", "ints.safetensors", st({"i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
                                           "u": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}},
                                          struct.pack("<q", 7) + b"\x01\x02\x03"))
# issue 20: a float tensor whose header says I32 was converted as integers.
put("safetensors", "bad_i32_weight.safetensors", st({"w": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}},
                                                    struct.pack("<2f", 0.5, -0.25)))
put("safetensors", "bad_overlap.safetensors", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                  "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8))
put("safetensors", "empty_tensor.safetensors", st({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]}}, b""))

# --- safetensors index ------------------------------------------------------
put("safetensors_index", "ok.json", json.dumps({"metadata": {"total_size": 12},
                                                "weight_map": {"w": "a.safetensors", "v": "b.safetensors"}}))
put("safetensors_index", "missing_tensor.json", json.dumps({"weight_map": {"x": "a.safetensors"}}))
put("safetensors_index", "not_st.json", json.dumps({"weight_map": {"w": "c.bin"}}))
put("safetensors_index", "path.json", json.dumps({"weight_map": {"w": "../a.safetensors"}}))

# --- config.json ------------------------------------------------------------
for src in sorted(glob.glob(os.path.join(ROOT, "tests/golden/models/*/config.json")))[:6]:
    copy("model_config", os.path.basename(os.path.dirname(src)) + ".json", os.path.relpath(src, ROOT))

# --- parquet ----------------------------------------------------------------
for name in ["sft_messages.parquet", "unsupported_lz4.parquet", "unsupported_binary.parquet",
             "unsupported_timestamp.parquet", "gsm8k_none_v2.parquet", "gsm8k_delta.parquet", "types_v1_snappy.parquet"]:
    copy("parquet", name, "tests/data/parquet/" + name)

# --- YAML configs -----------------------------------------------------------
copy("yaml_config", "sft_arith.yaml", "configs/sft_arith.yaml")
put("yaml_config", "small.yaml", """defaults:
  - ppo_trainer
  - _self_
data:
  train_batch_size: 8
  train_files: [a.jsonl, b.jsonl]
actor_rollout_ref:
  actor:
    optim: {lr: 1e-6, betas: [0.9, 0.999]}
  rollout:
    n: 4
    temperature: ${oc.select:data.temperature,1.0}
trainer:
  total_epochs: 1
  logger: ['console']
""")
put("yaml_config", "anchors.yaml", "common: &c {lr: 1.0e-6}\nactor_rollout_ref:\n  actor:\n    optim: *c\n")
# issue 20: a self-referencing alias overflowed the stack; billion laughs reached 6 GB.
put("yaml_config", "bad_self_alias.yaml", "a: &a [*a]\n")
laughs = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
for i, (p, q) in enumerate(zip("abcdefgh", "bcdefghi")):
    laughs += "%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n" % ((q, q) + (p,) * 9)
put("yaml_config", "bad_billion_laughs.yaml", laughs)
put("yaml_config", "deep.yaml", "a: " + "[" * 3000 + "]" * 3000 + "\n")

# --- overrides (one argument a line) -----------------------------------------
put("overrides", "basic", "data.train_batch_size=16\nactor_rollout_ref.rollout.n=8\n+actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel=True\n")
put("overrides", "lists", "data.train_files='[a.parquet,b.parquet]'\ntrainer.logger=[console,tensorboard]\n~trainer.val_before_train\n")
put("overrides", "interp", "actor_rollout_ref.rollout.temperature=${oc.select:data.x,0.7}\n++trainer.project_name=p\n--config-name=ppo_trainer\n")
put("overrides", "bad_alias", "data.train_files=[&a [*a]]\n")
put("overrides", "flow", "actor_rollout_ref.model.override_config={attention_dropout: 0.0, a: {b: [1, 2]}}\n")

# --- JSONL datasets ----------------------------------------------------------
with open(os.path.join(ROOT, "tests/data/parquet/gsm8k.jsonl")) as f:
    put("jsonl_dataset", "gsm8k_rl.jsonl", "".join(f.readlines()[:3]))
copy("jsonl_dataset", "sft_messages.jsonl", "tests/data/parquet/sft_messages.jsonl")
put("jsonl_dataset", "sft_prompt.jsonl", json.dumps({"prompt": "2+2?", "response": "4", "data_source": "arith",
                                                     "reward_model": {"ground_truth": "4"}}) + "\n\n{bad\n")
# issue 20: a row nested 100,000 deep crashed while its error was formatted.
put("jsonl_dataset", "bad_deep_row.jsonl", '{"prompt": ' + "[" * 3000 + "]" * 3000 + "}\n")

# --- chat templates ----------------------------------------------------------
for src in sorted(glob.glob(os.path.join(ROOT, "tests/golden/chat/templates/*.jinja"))):
    copy("chat_template", os.path.basename(src), os.path.relpath(src, ROOT))
put("chat_template", "features.jinja", """{%- set ns = namespace(n=0, s='') -%}
{%- for m in messages if m.role != 'tool' -%}
{%- set ns.n = ns.n + 1 -%}{{ loop.index ~ ':' ~ m.role|upper }} {{ m.content|trim|tojson(indent=2) }}
{%- if m.tool_calls is defined %}{% for t in m.tool_calls %}{{ t.function.name }}({{ t.function.arguments|tojson }}){% endfor %}{% endif %}
{% endfor -%}
{{ ns.n * 2 ** 3 // 3 % 5 }} {{ [1, 2, 3][::-1] }} {{ {'a': 1}.items()|list }} {{ range(3)|join(',') }}
{{ 'abc'.replace('b', 'x').split('x') }} {{ (messages|length > 1) and not false }} {{ none is none }}
{%- if add_generation_prompt %}<|im_start|>assistant{% endif %}""")
# issue 20: nested 5000 deep; a 1 GB string; nested loops that never end.
put("chat_template", "bad_deep.jinja", "{% if true %}" * 600 + "{% endif %}" * 600)
put("chat_template", "bad_huge_string.jinja", '{{ "x" * 1000000000 }}')
# (nested loops that never end: tests/chat/limits_test.cpp, as the 100,000 iterations take seconds under ASan)
# (a loop that grows a list each iteration, quadratic, is tests/chat/limits_test.cpp: seconds under ASan)
put("chat_template", "bad_cycle.jinja", "{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}")
put("chat_template", "bad_intmath.jinja", "{{ 9223372036854775807 + 1 }}{{ 2 ** 1000000000000 }}{{ -9223372036854775807 - 1 // -1 }}")
put("chat_template", "with_messages.jinja", "{{ messages[0].content }}\0" + json.dumps([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]))

# --- reward replies ----------------------------------------------------------
for i, line in enumerate(["0.5", '{"score": 1, "id": 17, "acc": true, "pred": "4"}', '{"score": NaN}', "Infinity",
                          '{"score": null, "error": "Traceback ..."}', '{"id": 16, "score": 1}', "true", '{"id": "x"}',
                          '{"score": 1, "id": 18}', "[" * 3000 + "]" * 3000, " 1e309 "]):
    put("reward_reply", "r%02d" % i, line)
print("seeds written under", C)
