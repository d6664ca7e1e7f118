#!/usr/bin/env python3
"""Golden scores of verl's rule scorers, for tests/rl/reward_score_golden_test.cpp.

    python3 scripts/oracles/verl_reward_scores.py --verl-git-dir /path/to/verl/.git \
        [--commit HEAD] [--out tests/golden/verl_reward_scores.jsonl]

Imports verl's own scorer modules (verl/utils/reward_score/{__init__,gsm8k,
math_reward,math_dapo,search_r1_like_qa_em}.py and verl/utils/import_utils.py,
all standard-library only) from a verl checkout (a bare git dir is fine: the
files are extracted with `git show <commit>:<path>` into a temporary package),
runs them on a corpus of tricky responses, and writes one JSON line per case:

    {"fn": "default_compute_score", "data_source": ..., "solution_str": ...,
     "ground_truth": ..., "kwargs": {...}, "expected": 1.0 | {"score":..,"acc":..,"pred":..}}

The first line is {"meta": {"verl_commit": ..., ...}}. fn is default_compute_score
(dispatch by data_source, as verl's NaiveRewardManager calls it) or
gsm8k.compute_score / search_r1_like_qa_em.compute_score with non-default
kwargs (method, format_score, score). Nothing here needs a network or PyPI.
"""
import argparse
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import tempfile

FILES = [
    "verl/utils/import_utils.py",
    "verl/utils/reward_score/__init__.py",
    "verl/utils/reward_score/gsm8k.py",
    "verl/utils/reward_score/math_reward.py",
    "verl/utils/reward_score/math_dapo.py",
    "verl/utils/reward_score/search_r1_like_qa_em.py",
]


def extract(git_dir, commit, root):
    for rel in FILES:
        data = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{rel}"], check=True,
                              capture_output=True).stdout
        dst = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
    for pkg in ("verl", "verl/utils"):
        open(os.path.join(root, pkg, "__init__.py"), "a").close()


def pad(n, ch="x"):
    return ch * n


def corpus():
    """(fn, data_source, solution_str, ground_truth, kwargs) tuples."""
    C = []
    D = "default_compute_score"

    # ---- openai/gsm8k: strict "#### <number>" in the last 300 characters.
    g = "openai/gsm8k"
    for s, gt in [
        ("#### 42", "42"), ("The answer is #### 1,234", "1234"), ("#### $42", "42"), ("#### -5", "-5"),
        ("#### 3.50", "3.5"), ("#### 42.", "42"), ("#### 42\n#### 43", "43"), ("#### 42\n#### 43", "42"),
        ("####42", "42"), ("##### 7", "7"), ("#### - 5", "-5"), ("#### --5", "-5"), ("#### -,5", "-5"),
        ("#### 1,2,3", "123"), ("#### .5", ".5"), ("#### 5 dollars", "5"), ("", "0"), ("no answer here", "3"),
        ("#### 42", "42.0"), ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"), ("#### 0042", "42"),
        ("#### ４２", "42"), ("#### 42\u00a0", "42"),
        # 300-character clip: the whole string fits at 300, the '#' is cut at 301.
        ("#### 42" + pad(293), "42"), ("#### 42" + pad(294), "42"), ("a#### 42" + pad(293), "42"),
        (pad(293) + "#### 123", "123"), (pad(5000) + "#### 9", "9"), ("#### 9" + pad(5000), "9"),
        # characters, not bytes: 207 characters but 407 bytes.
        ("#### 42" + pad(200, "é"), "42"), ("#### 42" + pad(294, "é"), "42"), ("#### 42" + pad(293, "日"), "42"),
        (pad(400, "é") + "#### 8", "8"), ("#### 7 😀", "7"),
    ]:
        C.append((D, g, s, gt, {}))
    for s, gt, kw in [
        ("The answer is 1,234.", "1234", {"method": "flexible"}),
        ("The answer is 1,234", "1,234", {"method": "flexible"}),
        ("so 5 . ", "5", {"method": "flexible"}), (".", ".", {"method": "flexible"}),
        ("a . b .", ".", {"method": "flexible"}), ("x -3 y", "-3", {"method": "flexible"}),
        ("it is 12 then 15", "15", {"method": "flexible"}), ("no digits", "0", {"method": "flexible"}),
        ("$1,000", "1,000", {"method": "flexible"}), ("-", "-", {"method": "flexible"}),
        ("1" + pad(299) + "2", "2", {"method": "flexible"}),
        ("#### 41", "42", {"format_score": 0.1}), ("nothing", "42", {"format_score": 0.1}),
        ("#### 42", "42", {"format_score": 0.1, "score": 2.0}), ("answer 41", "42", {"method": "flexible", "format_score": 0.25}),
    ]:
        C.append(("gsm8k.compute_score", g, s, gt, kw))

    # ---- MATH (math_reward.py, Hendrycks strip_string).
    for src in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        C.append((D, src, "so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", {}))
    m = "lighteval/MATH"
    for s, gt in [
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12"), ("\\boxed{\\tfrac{3}{4}}", "3/4"), ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{1/2}", "\\frac{1}{2}"), ("\\boxed{01/2}", "\\frac{1}{2}"), ("\\boxed{-1/2}", "-\\frac{1}{2}"),
        ("\\boxed{-1/2}", "\\frac{-1}{2}"), ("\\boxed{+3/4}", "\\frac34"), ("\\boxed{1/2/3}", "1/2/3"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"), ("\\boxed{\\sqrt2}", "\\sqrt{2}"),
        ("\\boxed 5", "5"), ("\\boxed 5$ and more", "5"), ("$\\boxed 12$.", "12"), ("\\fbox{5}", "5"),
        ("$\\boxed{10\\%}$", "10"), ("\\boxed{5 \\text{ cm}}", "5"), ("\\boxed{5\\text{ cm}\\text{ m}}", "5"),
        ("\\boxed{x = 5}", "5"), ("\\boxed{xyz = 5}", "5"), ("\\boxed{90^\\circ}", "90"), ("\\boxed{90^{\\circ}}", "90"),
        ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"), ("\\boxed{.5}", "\\frac12"), ("\\boxed{\\frac}", "\\frac"),
        ("\\boxed{\\frac}", "5"), ("\\boxed{\\sqrt}", "\\sqrt"), ("\\boxed{5", "5"), ("no box", "5"), ("", "5"),
        ("\\boxed{\\$5}", "5"), ("\\boxed{5}.", "5"), ("\\boxed{5.}", "5"), ("\\boxed{1}\\boxed{2}", "2"),
        ("\\boxed{1}\\boxed{2}", "1"), ("\\boxed{a}\\boxed b", "b"), ("\\boxed {5}", "5"), ("\\boxed{π}", "\\pi"),
        ("\\boxed{é}", "é"), ("\\boxed{k=}", ""), ("\\boxed{k=}", "5"), ("\\boxed{1,000}", "1000"),
        ("\\boxed{\\frac1{72}}", "\\frac{1}{72}"), ("\\boxed{3/4 }", "\\frac{3}{4}"), ("\\boxed{ 1/2}", "\\frac12"),
        ("\\boxed{\\frac{a}b}", "\\frac{a}{b}"), ("\\boxed{\\frac a b}", "\\frac{a}{b}"), ("\\boxed{2\\\\3}", "2\\3"),
        ("\\boxed{\\!5}", "5"), ("\\boxed{5\n}", "5"), ("\\boxed{{5}}", "5"), ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("The answer is $\\boxed{\\text{(A)}}$", "\\text{(A)}"), ("\\boxed{x^2+2x+1}", "x^2 + 2x + 1"),
        ("\\boxed5", "5"), ("\\boxed{1 0}", "10"), ("\\boxed{0.50}", "\\frac{1}{2}"), (" \\boxed{.5 + .5}", "0.5+0.5"),
        ("\\boxed{\\frac12}" + pad(4000), "\\frac{1}{2}"), (pad(4000) + "\\boxed{7}", "7"),
        ("\\boxed{\\sqrt{x}\\sqrt3}", "\\sqrt{x}\\sqrt{3}"), ("\\boxed{a=b=c}", "c"), ("\\boxed{10\\\\%}", "10"),
    ]:
        C.append((D, m, s, gt, {}))

    # ---- math_dapo (Minerva "Answer:" normalisation) and what routes to it.
    for src in ("math_dapo", "math", "math_dapo_reasoning", "aime24", "aime2025", "aime_2024"):
        C.append((D, src, "Answer: 42", "42", {}))
    d = "math_dapo"
    for s, gt in [
        ("answer: 42", "42"), ("ANSWER : 1,234", "1234"), ("Answer: $\\boxed{42}$", "42"), ("Answer: 42.", "42"),
        ("Answer: 5 dollars", "5"), ("Answer: an apple", "apple"), ("Answer: x = 5", "5"),
        ("Answer: \\frac12", "\\frac{1}{2}"), ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}"), ("Answer:\n\n42", "42"),
        ("Answer:   ", ""), ("Answer:   ", "42"), ("Answer:\n", "42"), ("Answer: \n\n", "42"), ("Answer: \t\n", ""),
        ("The answer is 42", "42"), ("Answer: 1\nAnswer: 2", "2"), ("Answer: 1\nAnswer: 2", "1"),
        ("Answer: -3", "-3"), ("Answer: 42\n" + pad(289, " "), "42"), ("Answer: 42\n" + pad(290, " "), "42"),
        ("Answer: 42\n" + pad(200, "é"), "42"), ("Answer: 42\n" + pad(289, "é"), "42"), ("Anſwer: 42", "42"),
        ("Answer:\u00a042", "42"), ("Answer: \\text{5}", "5"), ("Answer: 10^\\circ", "10"),
        ("Answer: 3 \\text{ and } 4", "3,4"), ("Answer: $5$ and $6$", "5"), ("Answer: \\boxed{\\frac{1}{2}}}", "\\frac{1}{2}"),
        ("Answer: frac", "frac"), ("Answer: \\fracab", "\\frac{a}{b}"), ("Answer: \\sqrt2", "\\sqrt{2}"),
        ("Answer: \\sqrt{2}", "\\sqrt2"), ("", "42"), ("Answer: [INVALID]", "[INVALID]"), ("Answer: 1,000,000", "1000000"),
        ("Answer: 1,000.5", "1000.5"), ("Answer: 12 inches", "12"), ("Answer: 5\\%", "5"), ("Answer: \\$5", "5"),
        ("Answer: \\textbf{7}", "7"), ("Answer: \\overline{AB}", "AB"), ("Answer: 7 \\mbox{ cm}", "7"),
        ("Answer: (1, 2)", "(1,2)"), ("Answer: \\text{(A)}", "A"), ("Answer: $\\text{(B)}$", "(B)"),
        ("Answer: 0.5", "\\frac{1}{2}"), ("Answer: 1/2", "\\frac{1}{2}"), ("Answer: ١٢", "١٢"), ("Answer: ١,٢", "١٢"),
        ("Answer: ４,２", "４２"), ("Answer: 2,²", "2²"), ("Answer:42 ", "42"), ("Final Answer: 17", "17"),
        ("answer:  a 9", "9"), ("Answer: 4\u2003", "4"), ("Answer: 5 units\n\nSo Answer: 6", "6"),
        ("Answer: $x$", "x"), ("Answer: \\text{\\text{a}}", "a"), ("Answer: \\text{a", "a"),
        ("Answer: the fracab", "fracab"), ("Answer: $1$ + $2$ = 3", "3"), ("Answer: 9 square feet", "9"),
        ("Answer: 1." + "\n", "1"), (pad(1000) + "\nAnswer: 33", "33"),
    ]:
        C.append((D, d, s, gt, {}))
    C.append((D, d, "Answer: 5", "\\boxed{5}", {}))
    C.append((D, d, "Answer: 5", "$5$", {}))
    C.append((D, d, "Answer: 5", "5\n6", {}))
    C.append((D, d, "Answer: 5", "a$5$b\n$6$", {}))

    # ---- searchR1 QA exact match (ground truth {"target": [...]}).
    q = "searchR1_nq"
    for src in ("searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"):
        C.append((D, src, "<answer>Paris</answer>", {"target": ["Paris"]}, {}))
    for s, gt in [
        ("<answer> the Paris! </answer>", {"target": ["paris"]}), ("<answer>a</answer><answer>Paris</answer>", {"target": ["Paris"]}),
        ("Paris", {"target": ["Paris"]}), ("<answer>Paris</answer>" * 11, {"target": ["Paris"]}),
        ("<answer>Paris</answer>" * 10, {"target": ["Paris"]}), ("<answer>Paris</answer>" + "</answer>" * 10, {"target": ["Paris"]}),
        ("<answer>NYC</answer>", {"target": ["New York City", "NYC"]}), ("<answer>\nParis\n</answer>", {"target": ["Paris"]}),
        ("<answer>Zürich</answer>", {"target": ["ZÜRICH"]}), ("<answer>ÉCLAIR</answer>", {"target": ["éclair"]}),
        ("<answer>An apple</answer>", {"target": ["apple"]}), ("<answer>theatre</answer>", {"target": ["atre"]}),
        ("<answer>theatre</answer>", {"target": ["theatre"]}), ("<answer>éthe x</answer>", {"target": ["éthe x"]}),
        ("<answer>éthe x</answer>", {"target": ["é x"]}), ("<answer></answer>", {"target": [""]}),
        ("<answer>Paris</answer>", {"target": "Paris"}), ("<answer>London</answer>", {"target": ["Paris"]}),
        ("<answer>U.S.A.</answer>", {"target": ["USA"]}), ("<answer>¿Qué?</answer>", {"target": ["qué"]}),
        ("<answer>Straße</answer>", {"target": ["STRASSE"]}), ("<answer>ΣΟΦΊΑ</answer>", {"target": ["σοφία"]}),
        ("<answer>Москва</answer>", {"target": ["МОСКВА"]}), ("<answer>a  b\tc</answer>", {"target": ["a b c"]}),
        ("<answer>Paris", {"target": ["Paris"]}), ("<answer>x</answer> <answer> the  end </answer>", {"target": ["end"]}),
        ("<answer>the</answer>", {"target": [""]}), ("<answer>Barack_Obama</answer>", {"target": ["barackobama"]}),
        ("<answer>İstanbul</answer>", {"target": ["istanbul"]}),
    ]:
        C.append((D, q, s, gt, {}))
    for s, gt, kw in [
        ("<answer>London</answer>", {"target": ["Paris"]}, {"format_score": 0.2}),
        ("none", {"target": ["Paris"]}, {"format_score": 0.2}),
        ("<answer>Paris</answer>" * 11, {"target": ["Paris"]}, {"score": 2.0}),
    ]:
        C.append(("search_r1_like_qa_em.compute_score", q, s, gt, kw))
    C.extend(fuzz_corpus())
    return C


# Pieces random responses are made of: the scorers' syntax, numbers, spaces
# and non-ASCII text, so the fuzz cases reach their corner cases together.
PIECES = ["Answer", "answer", "ANSWER", ":", " ", "  ", "\n", "\t", "\u00a0", "####", "#### ", "-", ",", ".", "$",
          "\\$", "0", "1", "2", "12", "3.5", "1,000", "\\boxed{", "\\boxed ", "\\fbox{", "{", "}", "\\frac",
          "\\dfrac", "\\sqrt", "\\text{", "\\text{ ", "\\left(", "\\right)", "^\\circ", "\\%", "=", "/",
          "x", "k", "an ", "a ", "the", "The", "dollars", "units", "é", "日", "Σ", "İ", "😀", "<answer>", "</answer>",
          "Paris", "paris!", "_", "'", "\\!", "\\\\", "(", ")", "frac", "sqrt"]
TRUTHS = ["0", "1", "2", "12", "-1", "1000", "1,000", "3.5", "\\frac{1}{2}", "\\frac12", "x", "k", "(1,2)", "",
          "\\sqrt{2}", "Paris", "é"]


def fuzz_corpus(n_per_family=120, seed=1234):
    rng = random.Random(seed)
    C = []

    def text(max_pieces):
        return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, max_pieces)))

    for _ in range(n_per_family):
        # Long enough, sometimes, to cross the 300-character clips.
        long_pad = "x" * rng.choice([0, 0, 0, 250, 290, 295, 299, 300])
        s = rng.choice([text(12), long_pad + text(8), text(8) + long_pad])
        C.append(("default_compute_score", "openai/gsm8k", s, rng.choice(TRUTHS), {}))
        C.append(("gsm8k.compute_score", "openai/gsm8k", s, rng.choice(TRUTHS), {"method": "flexible"}))
        C.append(("default_compute_score", "lighteval/MATH", text(14), rng.choice(TRUTHS), {}))
        C.append(("default_compute_score", "math_dapo", rng.choice([text(14), long_pad + text(8)]),
                  rng.choice(TRUTHS + [text(4)]), {}))
        targets = [rng.choice(TRUTHS + [text(3)]) for _ in range(rng.randint(1, 3))]
        C.append(("default_compute_score", "searchR1_nq", text(14), {"target": targets}, {}))
    return C


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verl-git-dir", required=True, help="git dir of a verl clone (bare is fine)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--out", default="tests/golden/verl_reward_scores.jsonl")
    args = ap.parse_args()
    commit = subprocess.run(["git", "--git-dir", args.verl_git_dir, "rev-parse", args.commit], check=True,
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as root:
        extract(args.verl_git_dir, commit, root)
        sys.path.insert(0, root)
        from verl.utils.reward_score import default_compute_score, gsm8k, search_r1_like_qa_em  # noqa: E402

        fns = {
            "default_compute_score": lambda src, s, gt, kw: default_compute_score(src, s, gt, **kw),
            "gsm8k.compute_score": lambda src, s, gt, kw: gsm8k.compute_score(s, gt, **kw),
            "search_r1_like_qa_em.compute_score": lambda src, s, gt, kw: search_r1_like_qa_em.compute_score(s, gt, **kw),
        }
        random.seed(0)
        lines = [json.dumps({"meta": {"verl_commit": commit, "source": "github.com/volcengine/verl",
                                      "files": FILES, "python": sys.version.split()[0],
                                      "generator": "scripts/oracles/verl_reward_scores.py"}})]
        for fn, src, s, gt, kw in corpus():
            with contextlib.redirect_stdout(io.StringIO()):  # math_reward and searchR1 print
                res = fns[fn](src, s, gt, kw)
            if isinstance(res, dict):
                expected = {k: (bool(v) if isinstance(v, bool) else v) for k, v in res.items()}
            else:
                expected = float(res)
            lines.append(json.dumps({"fn": fn, "data_source": src, "solution_str": s, "ground_truth": gt,
                                     "kwargs": kw, "expected": expected}, ensure_ascii=False))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines) - 1} cases to {args.out} (verl {commit})")


if __name__ == "__main__":
    main()
