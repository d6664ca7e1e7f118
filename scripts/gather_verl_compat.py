#!/usr/bin/env python3
"""Gathers the launcher lines of verl's public example and recipe scripts into
tests/verl_compat/lines.jsonl, the corpus tests/verl_compat/verl_compat_test.cpp
runs through Kestrel's config layer (what `kestrel config show` does).

  scripts/gather_verl_compat.py --verl DIR --recipe DIR [--out FILE]

DIR is a verl (or verl-recipe) checkout or a bare git directory (read at HEAD).
For each examples/grpo_trainer/*.sh, examples/ppo_trainer/*.sh (verl) and
dapo/**/*.sh (recipe) the script:
  - joins continuation lines,
  - keeps the one-line variable assignments (`x=...`, `export X=...`; ones with
    a command substitution `$(...)` are dropped: they are not literal) and the
    launcher commands (`python3 -m verl.trainer.main_ppo`, `-m recipe...main_dapo`),
  - runs that in bash with no PATH, HOME='$HOME', PWD='$PWD' and an empty environment, so
    literal variables expand as the script defines them, ${X:-default} takes
    its default, and nothing the script would run is run,
  - records the arguments after the module name (the override list, with
    --config-path/--config-name), "$@" being empty.
Each output line is {"script": "<repo>:<path>", "launch": "<module>", "args": [...]};
the first line records the commits the lines came from.

It also writes tests/verl_compat/verl_keys.txt: every leaf key of verl's two
generated trees (verl/trainer/config/_generated_ppo_trainer.yaml, FSDP, and
_generated_ppo_megatron_trainer.yaml), one `<trees> <key>` a line (F, M or FM),
which tests/verl_compat/verl_compat_test.cpp checks Kestrel knows (needs PyYAML).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

LAUNCHER = re.compile(r"(?:^|\s)(?:python3?|torchrun)\b[^\n]*?\s-m\s+((?:verl\.trainer\.main_ppo)|(?:recipe\.[\w.]*main_dapo))\b")
ASSIGN = re.compile(r"^\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*=")


def git(dir_, *args):
    gd = dir_ if os.path.isfile(os.path.join(dir_, "HEAD")) and not os.path.isdir(os.path.join(dir_, ".git")) else None
    cmd = ["git", f"--git-dir={gd}"] if gd else ["git", "-C", dir_]
    return subprocess.run(cmd + list(args), check=True, capture_output=True, text=True).stdout


def list_scripts(dir_, prefixes):
    files = git(dir_, "ls-tree", "-r", "--name-only", "HEAD").split("\n")
    return sorted(f for f in files if f.endswith(".sh") and any(f.startswith(p) for p in prefixes))


def joined_lines(text):
    out, cur = [], ""
    for line in text.split("\n"):
        # `\  # note` ends the command in bash; the scripts mean a continuation.
        line = re.sub(r"\\\s+#.*$", lambda m: "\\", line)
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    if cur:
        out.append(cur)
    return out


def strip_comment(line):
    # Drops a trailing "# ..." outside quotes (assignments like `x=1 # note`).
    q = None
    for i, c in enumerate(line):
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def sanitized(text):
    """The bash program that prints each launcher's arguments on fd 3."""
    prog = ["__emit() { printf '%s\\0' \"$@\" >&3; printf '\\1\\0' >&3; }", "PWD='$PWD'"]
    n = 0
    array = None  # a multi-line array assignment `X=(` ... `)` being collected
    for line in joined_lines(text):
        s = strip_comment(line).strip()
        if array is not None:
            array.append(s)
            if s.endswith(")"):
                prog.append("\n".join(array))
                array = None
            continue
        if not s:
            continue
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=\(", s) and not s.endswith(")"):
            array = [s]
            continue
        m = LAUNCHER.search(s)
        if m:
            rest = s[m.end():]
            rest = re.sub(r"\s(?:2>&1|\|\s*tee\b.*|&\s*$|>\s*\S+)", " ", rest)
            prog.append("__emit " + rest)
            n += 1
        elif ASSIGN.match(s) and not re.search(r"\$\((?!\()", s) and not re.search(r"`", s):
            prog.append(s)
    return "\n".join(prog) + "\n", n


def launches(text):
    prog, n = sanitized(text)
    if n == 0:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "args")
        with open(out, "wb") as fd3:
            subprocess.run(["/bin/bash", "--noprofile", "--norc", "-c", prog + "\n", "gather"],
                           env={"HOME": "$HOME", "PATH": ""}, pass_fds=(fd3.fileno(),),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: os.dup2(fd3.fileno(), 3), check=False)
        raw = open(out, "rb").read().decode()
    records, cur = [], []
    for a in raw.split("\0"):
        if a == "\1":
            records.append([x for x in cur if x != ""])
            cur = []
        elif a != "" or cur:
            cur.append(a)
    return records


def leaf_keys(tree, prefix=""):
    out = []
    for k, v in tree.items():
        if k == "_target_":
            continue
        p = f"{prefix}.{k}" if prefix else k
        out += leaf_keys(v, p) if isinstance(v, dict) and v else [p]
    return out


def write_keys(verl, path):
    import yaml  # PyYAML

    trees = {}
    for tag, f in (("F", "_generated_ppo_trainer.yaml"), ("M", "_generated_ppo_megatron_trainer.yaml")):
        trees[tag] = set(leaf_keys(yaml.safe_load(git(verl, "show", f"HEAD:verl/trainer/config/{f}"))))
    with open(path, "w") as f:
        f.write(f"# verl {git(verl, 'rev-parse', 'HEAD').strip()}: leaf keys of the generated trees "
                "(F: _generated_ppo_trainer.yaml, M: _generated_ppo_megatron_trainer.yaml)\n")
        for k in sorted(trees["F"] | trees["M"]):
            f.write(("F" if k in trees["F"] else "") + ("M" if k in trees["M"] else "") + " " + k + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verl", required=True)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "verl_compat", "lines.jsonl"))
    a = ap.parse_args()
    sources = [("verl", a.verl, ["examples/grpo_trainer/", "examples/ppo_trainer/"]), ("verl-recipe", a.recipe, ["dapo/"])]
    header = {"sources": {}}
    rows = []
    for name, d, prefixes in sources:
        header["sources"][name] = git(d, "rev-parse", "HEAD").strip()
        for path in list_scripts(d, prefixes):
            text = git(d, "show", f"HEAD:{path}")
            mods = [m.group(1) for m in map(LAUNCHER.search, (strip_comment(l) for l in joined_lines(text))) if m]
            for mod, args in zip(mods, launches(text)):
                rows.append({"script": f"{name}:{path}", "launch": mod, "args": args})
    with open(a.out, "w") as f:
        f.write(json.dumps(header) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} launcher lines -> {a.out}", file=sys.stderr)
    write_keys(a.verl, os.path.join(os.path.dirname(a.out), "verl_keys.txt"))


if __name__ == "__main__":
    main()
