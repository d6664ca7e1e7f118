#!/usr/bin/env python3
"""TRL GRPOTrainer peer for Kestrel's GRPO step time and reward curve, on CPU (fp32, no vLLM).

Usage (from the repository root; `pip install trl` if it is missing):
    python3 bench/peers/trl_grpo.py --model MODEL_DIR --tokenizer TOKENIZER_DIR --data train.jsonl \
        --lr 1e-6 --num-generations 4 --batch-size 2 --max-completion-length 64 --temperature 1.0 \
        --beta 0.001 --steps 5 --threads 2

MODEL_DIR: an HF model folder (config.json + safetensors), e.g. Kestrel's exported checkpoint.
TOKENIZER_DIR: an HF tokenizer folder; without a chat template a ChatML one is used (and said so).
--data: verl-schema JSONL rows: {"data_source": "arith", "prompt": [{"role": "user", "content": ...}],
"reward_model": {"ground_truth": "42"}, ...}; a plain-string prompt is taken as one user message.

Reward: Kestrel's arith rule (rl/reward_rules.cpp arith_score): the integer after the last "####"
(spaces skipped, optional '-') must equal the ground truth string: 1.0, else 0.0.

Mapping of Kestrel's (verl's) GRPO settings onto TRL:
  batch-size prompts x num-generations responses per step, one optimizer step per generation batch
  (generation_batch_size = per_device_train_batch_size * gradient_accumulation_steps, num_iterations=1,
  i.e. ppo_epochs=1 and ppo_mini_batch_size = the whole batch); --micro-batch completions per
  forward/backward (gradient accumulation over the rest);
  loss_type "dapo" = verl loss_agg_mode token-mean; scale_rewards "group" = norm_adv_by_std_in_grpo;
  beta = actor.kl_loss_coef with TRL's k3 estimator = verl low_var_kl (beta 0: no reference model);
  epsilon = clip_ratio; max_grad_norm = clip_grad; AdamW with --weight-decay, constant lr.

Prints one JSON line per step {"step", "seconds", "reward_mean"} (seconds: wall time of the whole
step: generation, reference/old log-probs, reward, backward, optimizer) and then a summary
{"seconds_per_step" (mean over steps after the first, or the one step), "reward_first", "reward_last", ...}.
"""
import argparse
import json
import re
import os
import sys
import time

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def arith_score(text, truth):
    """Kestrel's arith rule, character for character."""
    p = text.rfind("####")
    if p < 0:
        return 0.0
    i = p + 4
    while i < len(text) and text[i] == " ":
        i += 1
    j = i
    if j < len(text) and text[j] == "-":
        j += 1
    digits = j
    while j < len(text) and text[j].isascii() and text[j].isdigit():
        j += 1
    if j == digits:
        return 0.0
    return 1.0 if text[i:j] == truth else 0.0


def completion_text(c):
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in c if isinstance(m, dict))
    return str(c)


EQUATION = re.compile(r"(\d+) *([-+*]) *(\d+) *= *(-?\d+)")
STEP_CREDIT = 0.0  # --arith-step-credit


def arith_step_credit_score(text, truth, credit):
    """Kestrel's reward_model.arith_step_credit (rl/reward_rules.cpp arith_step_credit_score)."""
    if arith_score(text, truth) == 1.0:
        return 1.0
    total = right = 0
    for a, op, b, c in EQUATION.findall(text):
        if len(a) > 9 or len(b) > 9 or len(c) > 18:
            continue
        a, b, c = int(a), int(b), int(c)
        want = a + b if op == "+" else a - b if op == "-" else a * b
        total += 1
        right += want == c
    return 0.0 if total == 0 else credit * right / total


def arith_reward(prompts, completions, ground_truth, **kwargs):
    if STEP_CREDIT > 0:
        return [arith_step_credit_score(completion_text(c), str(t), STEP_CREDIT)
                for c, t in zip(completions, ground_truth)]
    return [arith_score(completion_text(c), str(t)) for c, t in zip(completions, ground_truth)]


def load_rows(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            prompt = r.get("prompt")
            if isinstance(prompt, str):
                prompt = [{"role": "user", "content": prompt}]
            if not isinstance(prompt, list):
                sys.exit(f"{path}:{n}: 'prompt' must be a chat-message list or a string")
            gt = (r.get("reward_model") or {}).get("ground_truth")
            if gt is None:
                sys.exit(f"{path}:{n}: no reward_model.ground_truth")
            ds = r.get("data_source", "arith")
            if ds not in ("arith", "kestrel/arith"):
                print(f"{path}:{n}: data_source '{ds}' scored with the arith rule anyway", file=sys.stderr)
            rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
                         "ground_truth": str(gt)})
    if not rows:
        sys.exit(f"{path}: no rows")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--tokenizer", help="HF tokenizer folder (default: --model)")
    ap.add_argument("--data", required=True, help="verl-schema JSONL (arith rows)")
    ap.add_argument("--lr", type=float, default=1e-6, help="actor.optim.lr")
    ap.add_argument("--num-generations", type=int, default=4, help="rollout.n (group size)")
    ap.add_argument("--batch-size", type=int, default=2, help="prompts per step (data.train_batch_size)")
    ap.add_argument("--micro-batch", type=int, default=0,
                    help="completions per forward/backward (default: the whole batch)")
    ap.add_argument("--max-completion-length", type=int, default=64, help="data.max_response_length")
    ap.add_argument("--max-prompt-length", type=int, default=512, help="data.max_prompt_length (left-truncated)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--beta", type=float, default=0.001, help="actor.kl_loss_coef (0: no reference model)")
    ap.add_argument("--clip-ratio", type=float, default=0.2)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--arith-step-credit", type=float, default=0.0,
                    help="reward_model.arith_step_credit (0: exact match only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--output-dir", default="/tmp/trl_grpo_peer", help="TRL's output_dir (nothing is saved)")
    args = ap.parse_args()
    global STEP_CREDIT
    STEP_CREDIT = args.arith_step_credit

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    try:
        import trl
    except ImportError:
        sys.exit("trl is not installed: pip install trl")
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    if not tok.chat_template:
        print("trl_grpo: the tokenizer has no chat template; using ChatML", file=sys.stderr)
        tok.chat_template = CHATML
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    except TypeError:  # transformers < 4.56
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)

    completions = args.batch_size * args.num_generations
    micro = args.micro_batch or completions
    if completions % micro:
        sys.exit(f"--micro-batch {micro} must divide batch-size * num-generations = {completions}")
    accum = completions // micro
    cfg_kwargs = dict(
        output_dir=args.output_dir, use_cpu=True, bf16=False, fp16=False, use_vllm=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=args.weight_decay,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=args.clip_grad,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accum, steps_per_generation=accum,
        num_generations=args.num_generations, num_iterations=1, max_completion_length=args.max_completion_length,
        temperature=args.temperature, top_p=args.top_p, top_k=0, beta=args.beta, epsilon=args.clip_ratio,
        loss_type="dapo", scale_rewards="group", max_steps=args.steps, logging_steps=1, save_strategy="no",
        report_to="none", seed=args.seed, dataloader_num_workers=0, disable_tqdm=True,
    )
    import dataclasses
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    if "max_prompt_length" in fields:
        cfg_kwargs["max_prompt_length"] = args.max_prompt_length
    config = GRPOConfig(**{k: v for k, v in cfg_kwargs.items() if k in fields})

    rows = load_rows(args.data)
    dataset = Dataset.from_list(rows)

    per_step = []  # [{"step", "seconds", "reward_mean"}]

    class Timer(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.last = None

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.last = time.perf_counter() - self.t0

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs and self.last is not None:
                rec = {"step": state.global_step, "seconds": round(self.last, 4), "reward_mean": logs["reward"]}
                per_step.append(rec)
                print(json.dumps(rec), flush=True)
                self.last = None

    trainer = GRPOTrainer(model=model, reward_funcs=[arith_reward], args=config, train_dataset=dataset,
                          processing_class=tok, callbacks=[Timer()])
    # Keep stdout to our JSON lines: the Trainer's own log printers write Python dicts there.
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    t_start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t_start

    timed = per_step[1:] if len(per_step) > 1 else per_step
    summary = {
        "peer": "trl", "trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": args.threads, "steps": len(per_step),
        "prompts_per_step": args.batch_size, "num_generations": args.num_generations,
        "max_completion_length": args.max_completion_length,
        "seconds_per_step": round(sum(r["seconds"] for r in timed) / max(len(timed), 1), 4),
        "seconds_total": round(total, 3),
        "reward_first": per_step[0]["reward_mean"] if per_step else None,
        "reward_last": per_step[-1]["reward_mean"] if per_step else None,
    }
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
