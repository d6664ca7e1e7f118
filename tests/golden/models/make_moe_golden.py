#!/usr/bin/env python3
"""Writes the tiny MoE/MLA goldens under tests/golden/models/<case>/ (committed; tests never run Python).

How to run (from the repository root; CPU only, ~30 s):
    python tests/golden/models/make_moe_golden.py                  # all cases
    python tests/golden/models/make_moe_golden.py deepseek_v3 ...  # only the named cases

Same conventions as make_golden.py (read its header first): fixed seeds, 1 CPU thread, deterministic
algorithms, the packed sequences run one at a time (batch 1, positions from 0), every reference computed
from the model reloaded with from_pretrained (attn_implementation="eager", experts_implementation="eager").
Weights: matrices, embeddings, biases N(0, 0.2^2); norm weights 1 + 0.25 N(0,1); the DeepSeek-V3
gate.e_score_correction_bias buffer N(0, 0.1^2) so that it changes the routing. Needs torch, transformers 5.x
and safetensors. Each run prints the routing facts the cases are meant to exercise (experts used, tokens
whose choice the group limit or the correction bias changed) and fails when one is missing.

Per case folder: config.json, model.safetensors (save_pretrained: per-expert tensors
model.layers.<l>.mlp.experts.<e>.{gate,up,down}_proj.weight, not HF's stacked gate_up_proj/down_proj),
golden.safetensors, meta.json (versions, seeds, description, shapes, the loss coefficients).

golden.safetensors keys ([T] packed rows, B sequences, V vocab, k experts per token; <name> = every tensor
of model.safetensors, by its saved name; <l> = a decoder layer index, for every MoE layer):
  input_ids, cu_seqlens, logits, logprobs, entropy, loss   as make_golden.py
  grad.<name>          f32, d loss / d tensor (stacked-expert gradients split per expert; zeros for buffers
                       such as e_score_correction_bias)
  routing.<l>          i32 [T, k] the experts the router chose for each token, sorted ascending
  routing_w.<l>        f32 [T, k] their weights (after normalisation and routed_scaling_factor), same order
  aux.<l>              f32 [1] Megatron's switch load-balancing loss over all T tokens (coefficient 1):
                       E/(k T^2) sum_e c_e sum_t p_te, p = softmax(router logits) (sigmoid routers:
                       sigmoid(logits) / (row sum + 1e-20)), c_e = tokens whose plain top-k of p holds e
  seq_aux.<l>          f32 [1] the mean over the B sequences of the same quantity computed per sequence
  z.<l>                f32 [1] router z-loss mean_t logsumexp(logits_t)^2 (coefficient 1)
  total                f32 [1] loss + AUX_COEFF * sum_l aux_l (Qwen) or sum_l seq_aux_l (DeepSeek)
                       + Z_COEFF * sum_l z_l
  gradtotal.<name>     f32, d total / d tensor (autograd through the HF model and the router logits)
  fp32 cases only:
  adamw_loss f32 [3], adamw_final.<name>   3 AdamW steps on `loss` (ADAMW of make_golden.py); buffers unchanged
  adamw_step1.<name>                       the parameters after the first step: a normalised softmax router has
                                           an exactly-zero gradient into unchosen experts' logits that autograd
                                           leaves as rounding noise, which AdamW turns into +-lr steps, so from
                                           step 2 on another implementation may route a token differently

bf16 cases: the f32 draw rounded to bf16 and run in bf16 as transformers loads it (the DeepSeek routers'
gate.weight and e_score_correction_bias are kept f32 by _keep_in_fp32_modules_strict, so their logits are f32
from bf16 hidden states; the correction bias is saved f32, as in the DeepSeek-V3 Hub checkpoint; gate.weight
is saved bf16). Router logits are upcast with .float() before the aux/z losses.
"""
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config, Qwen2MoeConfig,
                          Qwen3MoeConfig)

HERE = os.path.dirname(os.path.abspath(__file__))
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ADAMW_STEPS = 3
INIT_STD = 0.2
BIAS_STD = 0.1  # e_score_correction_bias
AUX_COEFF = 0.01
Z_COEFF = 0.001
IMPL = dict(attn_implementation="eager", experts_implementation="eager")

BASE = dict(hidden_size=32, num_hidden_layers=3, vocab_size=96, max_position_embeddings=64, num_attention_heads=4,
            rms_norm_eps=1e-6, moe_intermediate_size=16, num_experts_per_tok=2)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, num_key_value_heads=4,
           n_routed_experts=8, first_k_dense_replace=1, intermediate_size=64)

# name -> (config class, overrides, seq_lens, seed, aux kind in `total`, description)
CASES = {
    "qwen2_moe": (
        Qwen2MoeConfig, dict(num_key_value_heads=2, tie_word_embeddings=True, num_experts=8, norm_topk_prob=False,
                             shared_expert_intermediate_size=32, mlp_only_layers=[1], intermediate_size=64,
                             qkv_bias=True),
        [7, 12, 1, 5], 2005, "aux",
        "Qwen2MoeForCausalLM, 8 experts top-2 (softmax, norm_topk_prob false), shared expert (width 32) scaled by "
        "sigmoid(shared_expert_gate), mlp_only_layers [1] (dense layer 1, intermediate 64), q/k/v biases, "
        "GQA 4/2, tied embeddings"),
    "qwen3_moe": (
        Qwen3MoeConfig, dict(num_key_value_heads=2, head_dim=16, tie_word_embeddings=False, num_experts=8,
                             norm_topk_prob=True, intermediate_size=64),
        [7, 12, 1, 5], 2002, "aux",
        "Qwen3MoeForCausalLM, 8 experts top-2 (softmax, norm_topk_prob true) in all 3 layers, per-head q/k RMSNorm, "
        "head_dim 16 != hidden/heads, GQA 4/2, untied"),
    "deepseek_v3": (
        DeepseekV3Config, dict(**MLA, q_lora_rank=24, n_shared_experts=1, n_group=4, topk_group=2,
                               routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
                               tie_word_embeddings=False,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                "original_max_position_embeddings": 16, "mscale": 1.0,
                                                "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}),
        [9, 40, 1, 6], 2013, "seq_aux",
        "DeepseekV3ForCausalLM, MLA (q_lora 24, kv_lora 16, nope 8, rope 8 interleaved, v 12), layer 0 dense, "
        "8 experts top-2, sigmoid scores + random e_score_correction_bias, noaux_tc groups (4 groups, top 2 by sum "
        "of top-2), norm_topk_prob, routed_scaling_factor 2.5, 1 shared expert, YaRN (factor 4, original 16, "
        "mscale 1, mscale_all_dim 1: softmax scale (16^-0.5) * (0.1 ln 4 + 1)^2), a 40-token sequence, untied"),
    "deepseek_v2": (
        DeepseekV2Config, dict(**MLA, q_lora_rank=None, n_shared_experts=2, topk_method="group_limited_greedy",
                               n_group=4, topk_group=2, num_experts_per_tok=3, routed_scaling_factor=1.5,
                               tie_word_embeddings=True),
        [7, 12, 1, 5], 2004, "seq_aux",
        "DeepseekV2ForCausalLM, MLA without query compression (q_proj), kv_lora 16, nope 8, rope 8 (complex/"
        "interleaved pairs), v 12, layer 0 dense, 8 experts top-3 (top-2 could never be cut by a max-score group "
        "limit), softmax scores, group_limited_greedy (4 groups, top 2 by max), routed_scaling_factor 1.5, "
        "2 shared experts (width 32), default RoPE, tied embeddings"),
}
BF16_OF = list(CASES)


def all_cases():
    return [(n, n, torch.float32) for n in CASES] + [(n + "_bf16", n, torch.bfloat16) for n in BF16_OF]


def is_deepseek(model):
    return model.config.model_type.startswith("deepseek")


def moe_layers(model):
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


def randomize_(model, seed):
    """Parameters in named_parameters order from one generator (norms ~1, the rest N(0, INIT_STD^2)), then the
    correction-bias buffers N(0, BIAS_STD^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            p.copy_(1.0 + 0.25 * r if "norm" in name else INIT_STD * r)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(BIAS_STD * torch.randn(b.shape, generator=g, dtype=torch.float32))


def saved_tensors(model, of):
    """{saved name: of(param)} for every tensor save_pretrained writes: stacked experts split per expert
    (gate_up_proj [E, 2I, D] -> gate_proj = rows [0, I), up_proj = rows [I, 2I); down_proj [E, D, I]), and the
    persistent buffers (of(None, buffer))."""
    out = {}
    for name, p in model.named_parameters():
        t = of(p, None)
        if name.endswith(".experts.gate_up_proj"):
            base, inter = name[: -len("gate_up_proj")], p.shape[1] // 2
            for e in range(p.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:].contiguous()
        elif name.endswith(".experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(p.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t.contiguous()
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            out[name] = of(None, b).contiguous()
    return out


class RouterTap:
    """Forward hooks on every MoE layer's router (mlp.gate): keeps its logits (in the autograd graph), top-k
    weights and indices for each call, i.e. one entry per sequence."""

    def __init__(self, model):
        self.layers = moe_layers(model)
        self.calls = {l: [] for l in self.layers}
        self.handles = [model.model.layers[l].mlp.gate.register_forward_hook(self._hook(l)) for l in self.layers]

    def _hook(self, layer):
        def fn(_module, _inputs, out):
            logits, weights, idx = out
            self.calls[layer].append((logits, weights, idx))
        return fn

    def clear(self):
        for l in self.layers:
            self.calls[l].clear()

    def remove(self):
        for h in self.handles:
            h.remove()


def packed_forward(model, input_ids, cu):
    """Per-sequence forward (batch 1, no mask): f32 logits/logprobs/entropy and the mean loss (make_golden's)."""
    logits_l, lp_l, ent_l = [], [], []
    total, n_targets = None, 0
    for b in range(len(cu) - 1):
        ids = input_ids[cu[b]:cu[b + 1]]
        lg = model(input_ids=ids[None], use_cache=False).logits[0].float()
        logp = torch.log_softmax(lg, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)
        lp = torch.zeros(ids.shape[0], dtype=torch.float32)
        if ids.shape[0] > 1:
            tgt = logp[:-1].gather(-1, ids[1:, None])[:, 0]
            lp = torch.cat([tgt, torch.zeros(1)])
            s = -tgt.sum()
            total = s if total is None else total + s
            n_targets += ids.shape[0] - 1
        logits_l.append(lg)
        lp_l.append(lp)
        ent_l.append(ent)
    return torch.cat(logits_l), torch.cat(lp_l), torch.cat(ent_l), total / n_targets


def aux_probs(logits, sigmoid):
    """Megatron's compute_routing_scores_for_aux_loss: the scores the load-balancing loss sees (f32)."""
    logits = logits.float()
    if sigmoid:
        s = torch.sigmoid(logits)
        return s / (s.sum(-1, keepdim=True) + 1e-20)
    return torch.softmax(logits, dim=-1)


def switch_aux(logits, top_k, sigmoid):
    """E/(k T^2) sum_e c_e sum_t p_te over the rows of logits [T, E]; c_e from the plain top-k of p (a constant)."""
    p = aux_probs(logits, sigmoid)
    T, E = p.shape
    with torch.no_grad():
        c = torch.zeros(E).scatter_add_(0, torch.topk(p, top_k, dim=-1).indices.reshape(-1), torch.ones(T * top_k))
    return (c * p.sum(0)).sum() * (E / (top_k * T * T))


def check_no_ties(scores, k, what):
    """The k-th and (k+1)-th largest of every row must differ, or the top-k (and so the golden) is ambiguous."""
    top = torch.topk(scores.detach().float(), min(k + 1, scores.shape[-1]), dim=-1).values
    if k < scores.shape[-1] and bool((top[:, k - 1] == top[:, k]).any()):
        sys.exit(f"{what}: a tie at the top-{k} boundary makes the routing ambiguous; change the case's seed")


# The smallest gap at a top-k boundary the AdamW steps may leave. Kestrel and torch differ by float rounding
# (~1e-7 relative); a gap below this could route a token differently after an update, and the discrete
# change would then move the trajectory by far more than the test's tolerance.
ADAMW_MARGIN = 2e-5


def selection_margins(model, layer, logits):
    """The gaps at every top-k (and group top-k) boundary of one router call's selection. logits: f32 [T, E]."""
    gate = model.model.layers[layer].mlp.gate
    cfg = model.config
    k, E = gate.top_k, gate.num_experts
    gaps = []

    def gap(x, kk):
        if kk >= x.shape[-1]:
            return
        top = torch.topk(x, kk + 1, dim=-1).values
        finite = torch.isfinite(top[:, kk])
        gaps.append(float((top[:, kk - 1] - top[:, kk])[finite].min()) if bool(finite.any()) else float("inf"))

    with torch.no_grad():
        if cfg.model_type == "deepseek_v3":
            choice = logits.sigmoid() + gate.e_score_correction_bias.float()
            G = gate.num_group
            grp = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            gap(grp, gate.topk_group)
            keep = torch.zeros_like(grp).scatter_(1, torch.topk(grp, gate.topk_group, dim=-1).indices, 1)
            gap(choice.masked_fill(~keep.bool().repeat_interleave(E // G, dim=1), float("-inf")), k)
        else:
            scores = torch.softmax(logits, dim=-1)
            if cfg.model_type == "deepseek_v2" and cfg.topk_method == "group_limited_greedy":
                G = gate.num_group
                grp = scores.view(-1, G, E // G).max(-1).values
                gap(grp, gate.topk_group)
                keep = torch.zeros_like(grp).scatter_(1, torch.topk(grp, gate.topk_group, dim=-1).indices, 1)
                scores = scores.masked_fill(~keep.bool().repeat_interleave(E // G, dim=1), 0.0)
            gap(scores, k)
    return gaps


def check_margins(model, tap, what):
    for layer in tap.layers:
        for c in tap.calls[layer]:
            m = min(selection_margins(model, layer, c[0].detach().float()))
            if m < ADAMW_MARGIN:
                sys.exit(f"{what}, layer {layer}: a top-k gap of {m:.2e} (< {ADAMW_MARGIN}) could route a token "
                         "differently in Kestrel after an update; change the case's seed")


def routing_facts(model, tap, layer, logits):
    """Checks what the routing exercises; returns printable facts. logits: f32 [T, E] of one layer."""
    gate = model.model.layers[layer].mlp.gate
    cfg = model.config
    k, E = gate.top_k, gate.num_experts
    idx = torch.cat([c[2] for c in tap.calls[layer]])
    facts = {"experts_used": int(idx.unique().numel())}
    with torch.no_grad():
        if cfg.model_type == "deepseek_v3":
            scores = logits.sigmoid()
            choice = scores + gate.e_score_correction_bias.float()
            check_no_ties(choice, k, f"layer {layer} choice")
            G = gate.num_group
            grp = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            check_no_ties(grp, gate.topk_group, f"layer {layer} group scores")
            plain = torch.topk(choice, k, dim=-1).indices.sort(-1).values
            facts["tokens_cut_by_group_limit"] = int((plain != idx.sort(-1).values).any(-1).sum())
            # the same routing without the correction bias
            grp0 = scores.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(grp0).scatter_(1, torch.topk(grp0, gate.topk_group, dim=-1).indices, 1)
            masked = scores.masked_fill(~keep.bool().repeat_interleave(E // G, dim=1), float("-inf"))
            nobias = torch.topk(masked, k, dim=-1).indices.sort(-1).values
            facts["tokens_changed_by_correction_bias"] = int((nobias != idx.sort(-1).values).any(-1).sum())
        else:
            scores = torch.softmax(logits, dim=-1)
            check_no_ties(scores, k, f"layer {layer} scores")
            if cfg.model_type == "deepseek_v2" and cfg.topk_method == "group_limited_greedy":
                G = gate.num_group
                check_no_ties(scores.view(-1, G, E // G).max(-1).values, gate.topk_group, f"layer {layer} groups")
                plain = torch.topk(scores, k, dim=-1).indices.sort(-1).values
                facts["tokens_cut_by_group_limit"] = int((plain != idx.sort(-1).values).any(-1).sum())
        check_no_ties(aux_probs(logits, cfg.model_type == "deepseek_v3"), k, f"layer {layer} aux top-k")
    return facts


def make_case(case, base, dtype):
    cls, over, seq_lens, seed, aux_kind, desc = CASES[base]
    out_dir = os.path.join(HERE, case)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)

    config = cls(**{**BASE, **over})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **IMPL)
    randomize_(model, seed)
    model.to(dtype)
    for name, b in model.named_buffers():  # the Hub keeps the correction bias f32 in bf16 checkpoints
        if name.endswith("e_score_correction_bias"):
            b.data = b.data.float()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(tmp, f), os.path.join(out_dir, f))
    del model
    saved = load_file(os.path.join(out_dir, "model.safetensors"))

    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=dtype, **IMPL)
    model.train()  # no dropout in these configs
    weights = saved_tensors(model, lambda p, b: (p if p is not None else b).detach())
    assert set(weights) == set(saved), f"saved names differ: {sorted(set(weights) ^ set(saved))}"
    for n, t in weights.items():  # the per-expert split is the one save_pretrained used
        assert torch.equal(t.to(saved[n].dtype), saved[n]), f"{n}: not the saved tensor"

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed + 7)
    input_ids = torch.randint(0, vocab, (sum(seq_lens),), generator=g, dtype=torch.int64)
    cu = torch.tensor([0] + list(torch.tensor(seq_lens).cumsum(0)), dtype=torch.int64)
    cu_l = cu.tolist()

    tap = RouterTap(model)
    logits, logprobs, entropy, loss = packed_forward(model, input_ids, cu_l)
    golden = {"input_ids": input_ids, "cu_seqlens": cu, "logits": logits.detach().contiguous(),
              "logprobs": logprobs.detach().contiguous(), "entropy": entropy.detach().contiguous(),
              "loss": loss.detach().reshape(1)}
    sigmoid = model.config.model_type == "deepseek_v3"
    aux_sum, seq_aux_sum, z_sum = 0.0, 0.0, 0.0
    facts = {}
    for l in tap.layers:
        calls = tap.calls[l]
        assert len(calls) == len(seq_lens)
        lg = torch.cat([c[0] for c in calls]).float()  # [T, E]
        k = calls[0][2].shape[-1]
        idx = torch.cat([c[2] for c in calls])
        w = torch.cat([c[1] for c in calls]).float()
        order = idx.argsort(-1)
        golden[f"routing.{l}"] = idx.gather(-1, order).to(torch.int32).contiguous()
        golden[f"routing_w.{l}"] = w.gather(-1, order).detach().contiguous()
        aux = switch_aux(lg, k, sigmoid)
        seq_aux = torch.stack([switch_aux(c[0].float(), k, sigmoid) for c in calls]).mean()
        z = torch.logsumexp(lg, dim=-1).square().mean()
        golden[f"aux.{l}"] = aux.detach().reshape(1)
        golden[f"seq_aux.{l}"] = seq_aux.detach().reshape(1)
        golden[f"z.{l}"] = z.detach().reshape(1)
        aux_sum = aux_sum + aux
        seq_aux_sum = seq_aux_sum + seq_aux
        z_sum = z_sum + z
        facts[l] = routing_facts(model, tap, l, lg.detach())
    tap.remove()
    total = loss + AUX_COEFF * (aux_sum if aux_kind == "aux" else seq_aux_sum) + Z_COEFF * z_sum
    golden["total"] = total.detach().float().reshape(1)

    params = [p for _, p in model.named_parameters()]
    g_loss = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    g_total = torch.autograd.grad(total, params, allow_unused=True)
    for prefix, grads in (("grad.", g_loss), ("gradtotal.", g_total)):
        by_param = {id(p): gr for p, gr in zip(params, grads)}

        def of(p, b, by_param=by_param):
            if p is None:
                return torch.zeros(b.shape, dtype=torch.float32)
            gr = by_param[id(p)]
            return (torch.zeros_like(p) if gr is None else gr).detach().float()
        for n, t in saved_tensors(model, of).items():
            golden[prefix + n] = t

    if dtype == torch.float32:
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=dtype, **IMPL)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), **ADAMW)
        losses = []
        tap = RouterTap(model)
        for step in range(ADAMW_STEPS):
            opt.zero_grad(set_to_none=True)
            tap.clear()
            l = packed_forward(model, input_ids, cu_l)[3]
            check_margins(model, tap, f"{case} AdamW step {step}")
            l.backward()
            losses.append(float(l.detach()))
            opt.step()
            if step == 0:  # after one step every side still routes as the golden (see adamw_step1 above)
                for n, t in saved_tensors(model, lambda p, b: (p if p is not None else b).detach().float()).items():
                    golden["adamw_step1." + n] = t.clone()  # the live parameters move on
        golden["adamw_loss"] = torch.tensor(losses, dtype=torch.float32)
        for n, t in saved_tensors(model, lambda p, b: (p if p is not None else b).detach().float()).items():
            golden["adamw_final." + n] = t
        tap.remove()

    check_facts(case, model.config, facts)
    save_file(golden, os.path.join(out_dir, "golden.safetensors"), metadata={"case": case})
    meta = {
        "case": case, "description": desc + (" (bf16 weights and compute)" if dtype != torch.float32 else ""),
        "architecture": model.config.architectures[0], "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "seq_lens": seq_lens, "total_tokens": int(sum(seq_lens)), "seed": seed, "init_std": INIT_STD,
        "norm_init": "1 + 0.25 * N(0,1)", "e_score_correction_bias_init": f"N(0, {BIAS_STD}^2)",
        "attn_implementation": "eager", "experts_implementation": "eager",
        "moe_layers": tap.layers, "routing_facts": {str(l): f for l, f in facts.items()},
        "total": {"aux_kind": aux_kind, "aux_coeff": AUX_COEFF, "z_coeff": Z_COEFF,
                  "formula": f"loss + {AUX_COEFF} * sum_l {aux_kind}_l + {Z_COEFF} * sum_l z_l"},
        "shapes": {n: list(t.shape) for n, t in weights.items()},
        "params": list(weights),
        "optimizer": ({"name": "torch.optim.AdamW", "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]),
                       "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"], "steps": ADAMW_STEPS,
                       "on": "loss"} if dtype == torch.float32 else None),
        "loss": float(loss.detach()), "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    assert math.isfinite(float(loss.detach())) and math.isfinite(float(total.detach()))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"{case:18s} T={sum(seq_lens):3d} loss={float(loss.detach()):.5f} total={float(total.detach()):.5f} "
          f"params={sum(t.numel() for t in weights.values())} folder={size // 1024} KB")
    for l, f in facts.items():
        print(f"    layer {l}: " + ", ".join(f"{k}={v}" for k, v in f.items()))


def check_facts(case, cfg, facts):
    """The routing must exercise what the case is for."""
    for l, f in facts.items():
        if f["experts_used"] < 4:
            sys.exit(f"{case} layer {l}: only {f['experts_used']} experts used")
    if cfg.model_type in ("deepseek_v3", "deepseek_v2"):
        if not any(f["tokens_cut_by_group_limit"] > 0 for f in facts.values()):
            sys.exit(f"{case}: the group limit never changed a choice")
    if cfg.model_type == "deepseek_v3":
        if not any(f["tokens_changed_by_correction_bias"] > 0 for f in facts.values()):
            sys.exit(f"{case}: the correction bias never changed a choice")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    wanted = set(sys.argv[1:])
    cases = all_cases()
    unknown = wanted - {c for c, _, _ in cases}
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; known: {[c for c, _, _ in cases]}")
    for case, base, dtype in cases:
        if not wanted or case in wanted:
            make_case(case, base, dtype)


if __name__ == "__main__":
    main()
