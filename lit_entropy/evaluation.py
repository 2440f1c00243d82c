"""Sampled evaluation: n answers per problem, scored in isolation, reported as accuracy, mean@k, pass@k.

`evaluate` is what ``scripts/evaluate.py`` and the periodic in-training evaluation run: any policy bundle,
prompt list and :class:`~lit_entropy.rollout.sampler.Sampler` (HF ``generate`` or vLLM). Metric names:
``eval/accuracy``, ``eval/mean@k``, ``eval/pass@k`` (the unbiased estimator).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lit_entropy.data.prompts import Prompt
from lit_entropy.metrics.passk import Accuracy, MeanAtK, PassAtK
from lit_entropy.models import PolicyBundle
from lit_entropy.rollout.sampler import Sampler

log = logging.getLogger(__name__)

__all__ = ["HELD_OUT_ITERATION", "evaluate", "held_out_prompts"]

HELD_OUT_ITERATION = 10**6
"""The prompt-stream key of evaluation problems from a generated stream (training uses iterations
0 … max_epochs − 1), so Countdown evaluation problems are never seen in training."""


def held_out_prompts(source: Any, limit: int | None, default: int = 128) -> list[Prompt]:
    """Evaluation problems of a prompt source: a finite dataset's first ``limit`` (all by default), or
    ``limit`` (default ``default``) problems of a generated stream's held-out iteration."""
    if hasattr(source, "all_prompts"):
        return source.all_prompts()[:limit]
    return source.sample(limit or default, iteration=HELD_OUT_ITERATION)


def evaluate(
    policy: PolicyBundle,
    prompts: Sequence[Prompt],
    sampler: Sampler,
    n: int = 16,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    *,
    prompts_per_chunk: int = 64,
    keep_completions: int = 1,
    encode: Callable[[str], list[int]] | None = None,
) -> dict[str, Any]:
    """Sample ``n`` completions per prompt with a started ``sampler``, score them, and return the metrics.

    The sampler (:class:`~lit_entropy.rollout.sampler.Sampler`) is the one training samples with, or one
    built from the same ``rollout`` and ``reward`` groups: same engine, sampling settings and stop strings,
    same isolated reward runner (a reward that raises or hangs scores 0 and is counted in
    ``reward_failures``). Rewards are not shaped: a completion is correct when its reward is
    >= ``reward.correct_threshold``. The engine is synced to ``policy.model`` first. Prompts are sampled
    ``prompts_per_chunk`` at a time; chunk ``j`` uses a seed derived from (``seed``, ``j``), so results are
    reproducible for a fixed chunk size. ``encode`` turns a prompt's text into token ids (default: the text
    after BOS; a run with ``data.chat_template=true`` passes its DataModule's ``encode_prompt``).

    Returns ``eval/accuracy``, ``eval/mean@k`` and ``eval/pass@k`` for each k, ``num_problems``,
    ``num_samples``, ``reward_failures``, ``time/generate``, ``time/score``, and ``per_problem``: for
    each prompt its text, reference, ``num_samples``, ``num_correct`` and its first
    ``keep_completions`` completions.
    """
    ks = sorted({int(k) for k in ks})
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not ks or ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"every k must be in [1, n={n}], got {ks}")
    if not prompts:
        raise ValueError("no prompts to evaluate")
    tok = policy.tokenizer
    threshold = sampler.reward.correct_threshold
    counts: list[tuple[int, int]] = []
    kept: list[list[str]] = []
    truncated = 0
    t_gen = t_score = 0.0
    failures_before = sampler.reward_failures
    sampler.sync(policy.model)
    for j, start in enumerate(range(0, len(prompts), prompts_per_chunk)):
        chunk = list(prompts[start : start + prompts_per_chunk])
        ids = [encode(p.text) if encode else tok.encode(p.text, add_bos=True) for p in chunk]
        chunk_seed = random.Random(f"{seed}:eval:{j}").randrange(2**30)
        out = sampler.sample(chunk, ids, n, chunk_seed, shaped=False)
        t_gen += out.time_generate
        t_score += out.time_score
        truncated += sum(g.truncated for per in out.generations for g in per)
        for i in range(len(chunk)):
            row = out.rewards[i * n : (i + 1) * n]
            counts.append((n, sum(r >= threshold for r in row)))
            kept.append(out.texts[i * n : i * n + keep_completions])
        log.info("evaluated %d/%d problems", len(counts), len(prompts))
    failures = sampler.reward_failures - failures_before

    num_samples = torch.tensor([c[0] for c in counts])
    num_correct = torch.tensor([c[1] for c in counts])
    acc = Accuracy()
    acc.update(num_samples, num_correct)
    out: dict[str, Any] = {"eval/accuracy": float(acc.compute())}
    for k in ks:
        mean_k, pass_k = MeanAtK(k), PassAtK(k)
        mean_k.update(num_samples, num_correct)
        pass_k.update(num_samples, num_correct)
        out[f"eval/mean@{k}"] = float(mean_k.compute())
        out[f"eval/pass@{k}"] = float(pass_k.compute())
    out.update({
        "num_problems": len(counts),
        "num_samples": int(num_samples.sum()),
        "n": n,
        "ks": ks,
        "truncated_frac": truncated / max(1, int(num_samples.sum())),
        "reward_failures": failures,
        "time/generate": t_gen,
        "time/score": t_score,
        "per_problem": [
            {"prompt": p.text, "reference": _jsonable(p.reference), "num_samples": s, "num_correct": c,
             "completions": texts}
            for p, (s, c), texts in zip(prompts, counts, kept, strict=True)
        ],
    })
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
