#!/usr/bin/env python3
"""Writes tests/golden/chat/golden.json: conversations rendered by transformers'
apply_chat_template(..., tokenize=False) with the templates in templates/.

Each template is set on a tiny PreTrainedTokenizerFast (a one-word WordLevel
vocabulary: rendering never touches the vocabulary), so the text comes from the
real apply_chat_template code path: message normalisation, reasoning-field
aliasing, special tokens as template variables, and transformers' jinja
environment. strftime_now() reads a fixed clock (FIXED_NOW) so goldens are stable.

Run from the repository root:  python3 tests/golden/chat/make_chat_golden.py
"""
import copy
import datetime as _dt
import json
import os

import transformers
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_NOW = (2024, 9, 17, 10, 30, 0)


class _FixedDateTime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(*FIXED_NOW)


chat_template_utils.datetime = _FixedDateTime  # strftime_now() calls datetime.now()

SPECIAL = {
    "qwen": dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    "llama": dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
}
TEMPLATES = {
    "qwen2_5": "qwen",
    "qwen3": "qwen",
    "qwen3_initial": "qwen",
    "llama3": "llama",
    "llama3_2": "llama",
    "llama3_3": "llama",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city — returns °C",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
]

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
A2 = {"role": "assistant", "content": "2 + 2 = 4."}

CONVERSATIONS = {
    "user_only": [U1],
    "system_user": [SYS, U1],
    "multi_turn": [SYS, U1, A1, U2],
    "assistant_last": [U1, A1, U2, A2],
    "unicode": [
        {"role": "system", "content": "  Réponds en français, s'il te plaît.\n"},
        {"role": "user", "content": "Ünïcödé: 日本語, emoji 🚀🔥, quotes \"double\" and 'single', back\\slash\ttab"},
        {"role": "assistant", "content": "  D'accord — voilà: ½ ≠ ⅓ ✓  "},
        {"role": "user", "content": "Merci !\n\n"},
    ],
    "null_fields": [{"role": "user", "content": "hi", "name": None}, {"role": "assistant", "content": "yo", "tool_calls": None}],
}

THINK = [
    {"role": "user", "content": "Solve 3*7."},
    {"role": "assistant", "content": "<think>\n3*7 is 21.\n</think>\n\n3*7 = 21."},
    {"role": "user", "content": "And 4*5?"},
    {"role": "assistant", "content": "<think>\nFour fives.\n</think>\n\n20"},
]
THINK_OPEN = THINK[:3]
REASONING_FIELD = [
    {"role": "user", "content": "Why is the sky blue?"},
    {"role": "assistant", "content": "Rayleigh scattering.", "reasoning_content": "Short wavelengths scatter more."},
]

QWEN_TOOL_CHAT = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Zürich and 1.5 + 2?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1.5, "b": 2, "exact": True, "note": None}}},
        ],
    },
    {"role": "tool", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
    {"role": "tool", "content": "3.5"},
    {"role": "assistant", "content": "It is 21.5 °C and clear; 1.5 + 2 = 3.5."},
    {"role": "user", "content": "Thanks"},
]
QWEN_TOOL_NO_CONTENT = [
    {"role": "user", "content": "Add 1e-7 and 1e20."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1e-07, "b": 1e20}}}],
    },
    {"role": "tool", "content": {"result": 1e20, "ok": True, "why": None}},
]
QWEN_TOOL_EMPTY_CONTENT = copy.deepcopy(QWEN_TOOL_NO_CONTENT)
QWEN_TOOL_EMPTY_CONTENT[1]["content"] = ""
QWEN_TOOL_STRING_ARGS = [
    {"role": "user", "content": "Add 1 and 2"},
    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
    {"role": "tool", "content": "<tool_response>3</tool_response>"},
]
LLAMA_TOOL_CHAT = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "  Weather in Zürich?  "},
    {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}],
    },
    {"role": "tool", "content": {"temp": 21.5, "sky": "clear", "alerts": []}},
    {"role": "ipython", "content": "plain text result"},
    {"role": "assistant", "content": "It is 21.5 °C."},
]
LLAMA_TWO_CALLS = [
    U1,
    {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                                          {"function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
]


def cases():
    out = []
    for tname, family in TEMPLATES.items():
        for cname, conv in CONVERSATIONS.items():
            for agp in (False, True):
                out.append((f"{tname}/{cname}/agp={int(agp)}", tname, conv, agp, {}))
        if tname.startswith("qwen3"):
            for conv_name, conv in (("think", THINK), ("think_open", THINK_OPEN), ("reasoning_field", REASONING_FIELD)):
                for agp in (False, True):
                    for thinking in (None, True, False):
                        extra = {} if thinking is None else {"enable_thinking": thinking}
                        out.append((f"{tname}/{conv_name}/agp={int(agp)}/thinking={thinking}", tname, conv, agp, extra))
        if family == "qwen":
            for conv_name, conv in (("tool_chat", QWEN_TOOL_CHAT), ("tool_no_content", QWEN_TOOL_NO_CONTENT),
                                    ("tool_empty_content", QWEN_TOOL_EMPTY_CONTENT), ("tool_string_args", QWEN_TOOL_STRING_ARGS)):
                for agp in (False, True):
                    out.append((f"{tname}/{conv_name}/agp={int(agp)}", tname, conv, agp, {"tools": TOOLS}))
            out.append((f"{tname}/tools_user_only", tname, [U1], True, {"tools": TOOLS[:1]}))
            out.append((f"{tname}/tools_system", tname, [SYS, U1], True, {"tools": TOOLS}))
        if tname in ("llama3_2", "llama3_3"):
            for agp in (False, True):
                out.append((f"{tname}/tool_chat/agp={int(agp)}", tname, LLAMA_TOOL_CHAT, agp, {"tools": TOOLS}))
            out.append((f"{tname}/tool_chat/system_tools", tname, LLAMA_TOOL_CHAT, True,
                        {"tools": TOOLS, "tools_in_user_message": False}))
            out.append((f"{tname}/date_string", tname, [SYS, U1], True, {"date_string": "01 Jan 2030"}))
            out.append((f"{tname}/two_tool_calls", tname, LLAMA_TWO_CALLS, False, {}))
            out.append((f"{tname}/tools_no_user", tname, [SYS], False, {"tools": TOOLS}))
        if tname == "llama3_3":
            out.append((f"{tname}/builtin_tools", tname, LLAMA_TOOL_CHAT[:2], True,
                        {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}))
            out.append((f"{tname}/builtin_tool_call", tname, [
                U1, {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "kestrel"}}}]},
            ], False, {"builtin_tools": ["brave_search"]}))
    return out


def tiny_tokenizer(template, family):
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), **SPECIAL[family])
    tok.chat_template = template
    return tok


def main():
    templates = {}
    for name in TEMPLATES:
        with open(os.path.join(HERE, "templates", name + ".jinja"), encoding="utf-8", newline="") as f:
            templates[name] = f.read()
    golden = {
        "generator": f"transformers {transformers.__version__} apply_chat_template(tokenize=False)",
        "now": list(FIXED_NOW),
        "special_tokens": SPECIAL,
        "template_family": TEMPLATES,
        "cases": [],
    }
    for name, tname, conv, agp, extra in cases():
        tok = tiny_tokenizer(templates[tname], TEMPLATES[tname])
        case = {"name": name, "template": tname, "messages": conv, "add_generation_prompt": agp, "extra": extra}
        try:
            case["expected"] = tok.apply_chat_template(copy.deepcopy(conv), tokenize=False,
                                                       add_generation_prompt=agp, **copy.deepcopy(extra))
        except Exception as e:  # the C++ renderer must fail on the same inputs
            case["error"] = f"{type(e).__name__}: {e}"
        golden["cases"].append(case)
    path = os.path.join(HERE, "golden.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in golden["cases"])
    print(f"wrote {path}: {len(golden['cases'])} cases ({n_err} expected errors)")


if __name__ == "__main__":
    main()
