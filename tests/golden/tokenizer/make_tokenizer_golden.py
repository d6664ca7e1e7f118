#!/usr/bin/env python3
"""Writes the tokenizer goldens that tests/tokenizer/*_test.cpp compare against.

Nothing can be downloaded, so the tokenizers are trained here with the HF `tokenizers` library on the
committed corpus.txt, each with exactly the normalizer / pre-tokenizer / post-processor / decoder
configuration of a real model family:
  gpt2    ByteLevel(use_regex) pre-tokenizer, merges written in the old "a b" string form
  qwen2   NFC + Split(Qwen2 regex) + ByteLevel(use_regex=false), <|endoftext|> <|im_start|> <|im_end|>
          (+ non-special <tool_call> tokens as in Qwen2.5)
  llama3  Split(Llama-3 regex) + ByteLevel, ignore_merges, <|begin_of_text|> BOS via TemplateProcessing
  bytefb  no ByteLevel: char-level BPE with byte_fallback, <0xXX> tokens, fuse_unk, a pre-tokenizer
          Sequence of Split behaviors that only the ICU fallback handles, Sequence[NFC] normalizer,
          added tokens with lstrip/rstrip/single_word/normalized flags, ByteFallback+Fuse decoder
For each: <name>/tokenizer.json, <name>/tokenizer_config.json and <name>/golden.json holding the ids
of every corpus line (add_special_tokens=True), of the whole corpus as one string (False), of a few
texts with special tokens (both settings), and HF's decode() where it differs from the input.
Every id list is cross-checked against transformers' PreTrainedTokenizerFast.

Run from anywhere: python3 tests/golden/tokenizer/make_tokenizer_golden.py
"""
import json
import os
import unicodedata

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
LLAMA3_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
VOCAB = 3000


def corpus_lines(text):
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def train(tok, lines, specials=()):
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    return tok


def build_gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    train(tok, lines)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]  # the pre-0.20 string form
    return j, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


def build_qwen2(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    train(tok, lines)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    j = json.loads(tok.to_str())
    j["model"]["continuing_subword_prefix"] = ""  # as in Qwen2's file: empty strings, not null
    j["model"]["end_of_word_suffix"] = ""
    return j, {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def build_llama3(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    train(tok, lines)
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    # Whole words that are in the vocab but that the merges would not build: only ignore_merges
    # emits them as one id, so they test that flag.
    vocab = j["model"]["vocab"]
    for w in ("ĠAntidisestablishmentarianism", "Ġpneumonoultramicroscopic", "Ġhahahahahahahahahahaha"):
        vocab[w] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(j))
    # added after the model vocab, as in the real file (ids >= 128000 there)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    j = json.loads(tok.to_str())
    return j, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def build_bytefb(lines):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"[.,;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[()\[\]{}]+"), behavior="contiguous", invert=True),
        pre_tokenizers.Split("--", behavior="removed"),
        pre_tokenizers.Split(Regex(r"(?i:qu)"), behavior="merged_with_next", invert=True)])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False, special_tokens=["<unk>"], limit_alphabet=150)
    tok.train_from_iterator(lines, trainer)
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        if b in (0xF0, 0xE2):  # 4-byte emoji and many symbols then have no fallback: <unk>, fused
            continue
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("[SEP]", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello world", single_word=True, normalized=True, special=False),
                    AddedToken("\u2126hm", normalized=True, special=False),
                    AddedToken("[CLS]", single_word=True, lstrip=True, rstrip=True, special=False, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                                       ("[SEP]", tok.token_to_id("[SEP]"))])
    return json.loads(tok.to_str()), {"bos_token": "[CLS]", "eos_token": "[SEP]"}


SPECIAL_TEXTS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello! What's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|endoftext|> <|endoftext|>\n",
    "<|im_sta <|im_end <|im_end|x <tool_call>{\"name\": \"f\"}</tool_call>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "<|reserved_special_token_0|>x<|end_of_text|>",
    "a <mask>  b   <mask>c [SEP]   d [SEP]\n[SEP]",
    "hello world! say hello worlds or xhello world, hello world",
    "\u2126hm and \u03a9hm and O\u0308hm [CLS] x[CLS]y  [CLS]  z",
    "",
    " ",
    "\n\n",
]


def check_against_transformers(dirpath, texts, golden_lines):
    from transformers import PreTrainedTokenizerFast
    t = PreTrainedTokenizerFast(tokenizer_file=os.path.join(dirpath, "tokenizer.json"))
    for text, want in zip(texts, golden_lines):
        got = t(text, add_special_tokens=True)["input_ids"]
        if got != want:
            raise SystemExit(f"transformers disagrees with tokenizers on {text!r} in {dirpath}")


def write(name, j, cfg, lines, corpus):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    cfg = dict(cfg, tokenizer_class="PreTrainedTokenizerFast", model_max_length=131072)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    g = {"vocab_size": max(tok.get_vocab(with_added_tokens=True).values()) + 1, "lines": [], "decoded_lines": {}}
    for i, line in enumerate(lines):
        ids = tok.encode(line, add_special_tokens=True).ids
        g["lines"].append(ids)
        dec = tok.decode(ids, skip_special_tokens=True)
        if dec != line:
            g["decoded_lines"][str(i)] = dec
    g["whole"] = tok.encode(corpus, add_special_tokens=False).ids
    g["special_texts"] = []
    for text in SPECIAL_TEXTS:
        for add in (True, False):
            ids = tok.encode(text, add_special_tokens=add).ids
            g["special_texts"].append({"text": text, "add_special_tokens": add, "ids": ids,
                                       "decoded": tok.decode(ids, skip_special_tokens=False),
                                       "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(g, f, ensure_ascii=False, separators=(",", ":"))
    check_against_transformers(d, lines, g["lines"])
    n_ids = sum(len(x) for x in g["lines"])
    print(f"{name}: vocab {g['vocab_size']}, {n_ids} ids over {len(lines)} lines, "
          f"{len(g['decoded_lines'])} lines whose decode differs from the input")
    return tok


def main():
    with open(os.path.join(HERE, "corpus.txt"), encoding="utf-8", newline="") as f:
        corpus = f.read()
    lines = corpus_lines(corpus)
    for name, build in (("gpt2", build_gpt2), ("qwen2", build_qwen2), ("llama3", build_llama3),
                        ("bytefb", build_bytefb)):
        j, cfg = build(lines)
        tok = write(name, j, cfg, lines, corpus)
        if name == "llama3":  # how many lines ignore_merges changes (must be > 0 to test the flag)
            j2 = json.loads(tok.to_str())
            j2["model"]["ignore_merges"] = False
            t2 = Tokenizer.from_str(json.dumps(j2))
            n = sum(t2.encode(l).ids != tok.encode(l).ids for l in lines)
            print(f"  llama3: ignore_merges changes {n} lines")
    # NFC sanity: the qwen2 tokenizer must see NFD and NFC accents alike
    assert unicodedata.normalize("NFC", "e\u0301") == "\u00e9"
    total = 0
    for root, _, files in os.walk(HERE):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print(f"golden folder: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
