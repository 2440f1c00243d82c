"""Where a pass's time goes on the real model: the decoder, the LM head, and the fp32 work over 49k columns.

For ``tokens`` tokens of SmolLM2-135M-Instruct (bf16 autocast, as ``experiment=real_lm`` trains), each part of a
pass is timed alone:

* **decoder**: the model body (``model.model``) on ``tokens`` tokens in rows of ``row_len``, forward without
  gradient (the pre-update pass) and forward + backward (the update);
* **LM head**: the ``[tokens, 576] × [576, 49152]`` projection, forward, and forward + backward;
* **log p + entropy**: :func:`~lit_entropy.diagnostics.entropy.token_logprobs_and_entropy` on those logits,
  forward, and forward + backward, with the eager ops and with the compiled kernels
  (:mod:`lit_entropy.diagnostics.vocab_kernels`);
* **+ S and N**: the pre-update pass's diagnostics (:func:`~lit_entropy.diagnostics.discriminator.
  token_logprobs_entropy_and_scores`, all four statistics) minus log p + entropy alone.

Each part's share of the pre-update pass (forwards, with S and N) and of the update (forward + backward, no
scores) follows, eager and compiled. Attention is inside the decoder's time.
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.limits import median_time


def _parts(model: Any, tokens: int, row_len: int, repeats: int, kernels: str) -> dict:
    from lit_entropy.diagnostics.discriminator import token_logprobs_entropy_and_scores
    from lit_entropy.diagnostics.entropy import token_logprobs_and_entropy

    g = torch.Generator().manual_seed(0)
    vocab, width = model.config.vocab_size, model.config.hidden_size
    ids = torch.randint(100, vocab, (max(1, tokens // row_len), row_len), generator=g)
    n = ids.numel()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)
    head = model.get_output_embeddings()
    hidden = torch.randn(1, n, width, generator=g).bfloat16()
    targets = torch.randint(0, vocab, (1, n), generator=g)
    with torch.no_grad(), autocast:
        logits = head(hidden)

    def body(grad: bool) -> None:
        with torch.set_grad_enabled(grad), autocast:
            out = model.model(input_ids=ids).last_hidden_state
        if grad:
            out.float().mean().backward()
            model.zero_grad(set_to_none=True)

    def head_pass(grad: bool) -> None:
        h = hidden.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad), autocast:
            out = head(h)
        if grad:
            out.backward(torch.ones_like(out))
            model.zero_grad(set_to_none=True)

    def stats(grad: bool) -> None:
        x = logits.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            logp, ent = token_logprobs_and_entropy(x, targets, chunk_size=2048, kernels=kernels)
        if grad:
            (logp.sum() + ent.sum()).backward()

    def scores() -> None:
        token_logprobs_entropy_and_scores(logits, targets, chunk_size=2048, kernels=kernels)

    return {"tokens": n, "decoder_fwd_s": median_time(lambda: body(False), repeats),
            "decoder_fwd_bwd_s": median_time(lambda: body(True), repeats),
            "head_fwd_s": median_time(lambda: head_pass(False), repeats),
            "head_fwd_bwd_s": median_time(lambda: head_pass(True), repeats),
            "stats_fwd_s": median_time(lambda: stats(False), repeats),
            "stats_fwd_bwd_s": median_time(lambda: stats(True), repeats),
            "stats_with_scores_s": median_time(scores, repeats)}


def bench_vocab_work(folder: str, repeats: int, tokens: int = 2048, row_len: int = 128) -> dict:
    """The parts of both passes, eager and compiled (compilation happens in the warm-up call)."""
    from transformers import AutoModelForCausalLM

    from lit_entropy.diagnostics import vocab_kernels

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out: dict = {"settings": {"tokens": tokens, "row_len": row_len, "vocab": model.config.vocab_size}}
    for kernels in ("eager", "compiled"):
        out[kernels] = _parts(model, tokens, row_len, repeats, kernels)
    out["compile_failure"] = vocab_kernels.failure()
    return out


def shares(p: dict) -> dict:
    """Each part's share of the pre-update pass and of the update, and their totals."""
    pre = {"decoder": p["decoder_fwd_s"], "LM head": p["head_fwd_s"], "log p + entropy": p["stats_fwd_s"],
           "+ S and N": max(0.0, p["stats_with_scores_s"] - p["stats_fwd_s"])}
    upd = {"decoder": p["decoder_fwd_bwd_s"], "LM head": p["head_fwd_bwd_s"], "log p + entropy": p["stats_fwd_bwd_s"],
           "+ S and N": 0.0}
    tp, tu = sum(pre.values()), sum(upd.values())
    return {"pre_update_s": tp, "update_s": tu,
            "parts": {k: {"pre_s": pre[k], "pre_share": pre[k] / tp, "update_s": upd[k], "update_share": upd[k] / tu}
                      for k in pre}}


def markdown(report: dict) -> list[str]:
    from benchmarks.report import fmt

    s = report["settings"]
    eager, compiled = shares(report["eager"]), shares(report["compiled"])
    lines = [f"## where a pass's time goes ({s['tokens']} tokens, vocabulary {s['vocab']:,}, bf16 autocast)", "",
             "| part | pre-update s (eager) | share | pre-update s (compiled) | share | update s (eager) | share | "
             "update s (compiled) | share |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in eager["parts"]:
        e, c = eager["parts"][k], compiled["parts"][k]
        lines.append(f"| {k} | {fmt(e['pre_s'])} | {fmt(e['pre_share'], 2)} | {fmt(c['pre_s'])} | "
                     f"{fmt(c['pre_share'], 2)} | {fmt(e['update_s'])} | {fmt(e['update_share'], 2)} | "
                     f"{fmt(c['update_s'])} | {fmt(c['update_share'], 2)} |")
    lines.append(f"| **total** | {fmt(eager['pre_update_s'])} | | {fmt(compiled['pre_update_s'])} | | "
                 f"{fmt(eager['update_s'])} | | {fmt(compiled['update_s'])} | |")
    if report.get("compile_failure"):
        lines += ["", f"Compilation failed, both columns are eager: {report['compile_failure']}"]
    return lines + [""]
