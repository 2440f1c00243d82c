"""Sampled evaluation: n answers per problem, scored in isolation, reported as accuracy, mean@k, pass@k.

`evaluate` is what ``scripts/evaluate.py`` runs; it works with any policy bundle, prompt list, reward
and rollout engine (HF ``generate`` or vLLM). Metric names follow DESIGN §6: ``eval/accuracy``,
``eval/mean@k``, ``eval/pass@k`` (the unbiased estimator, §7.5).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from lit_entropy.data.prompts import Prompt
from lit_entropy.metrics.passk import Accuracy, MeanAtK, PassAtK
from lit_entropy.models import PolicyBundle
from lit_entropy.rewards.runner import RewardRunner
from lit_entropy.rollout.base import RolloutEngine, SamplingConfig

log = logging.getLogger(__name__)

__all__ = ["evaluate"]


def _make_engine(engine: RolloutEngine | Callable[..., RolloutEngine], bundle: PolicyBundle) -> tuple[RolloutEngine, bool]:
    """An engine instance, and whether it was built here (and must be closed here)."""
    if isinstance(engine, RolloutEngine):
        return engine, False
    if not callable(engine):
        raise TypeError(f"engine must be a RolloutEngine or a factory of one, got {engine!r}")
    tok = bundle.tokenizer
    max_len = getattr(getattr(bundle.model, "config", None), "max_position_embeddings", None)
    return engine(model_path=bundle.path, eos_id=tok.eos_id, pad_id=tok.pad_id, max_model_len=max_len), True


def evaluate(
    policy_bundle: PolicyBundle,
    prompts: Sequence[Prompt],
    reward_fn: Callable[..., float],
    engine: RolloutEngine | Callable[..., RolloutEngine],
    n: int = 16,
    ks: Sequence[int] = (1,),
    temperature: float = 1.0,
    max_new_tokens: int = 512,
    seed: int = 0,
    reward_kwargs: dict | None = None,
    *,
    top_p: float = 1.0,
    correct_threshold: float = 1.0,
    reward_timeout_s: float = 10.0,
    reward_workers: int = 2,
    reward_mode: str = "auto",
    prompts_per_chunk: int = 64,
    keep_completions: int = 1,
    encode: Callable[[str], list[int]] | None = None,
) -> dict[str, Any]:
    """Sample ``n`` completions per prompt, score them, and return the metrics.

    ``engine`` is a `RolloutEngine`, or a factory called like the rollout DataModule calls it
    (``model_path=, eos_id=, pad_id=, max_model_len=``; closed again afterwards). The engine is synced to
    ``policy_bundle.model`` first. Prompts are generated ``prompts_per_chunk`` at a time; chunk ``j`` uses
    a seed derived from (``seed``, ``j``), so results are reproducible for a fixed chunk size.

    ``encode`` turns a prompt's text into token ids (default: the text after BOS; a run with
    ``data.chat_template=true`` passes its DataModule's ``encode_prompt``).

    A completion is correct when its reward is >= ``correct_threshold``. Rewards run in a
    `RewardRunner` (process mode by default: a reward that raises or hangs scores 0 and is counted
    in ``reward_failures``).

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
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    tok = policy_bundle.tokenizer
    eng, owned = _make_engine(engine, policy_bundle)
    runner = RewardRunner(reward_fn, timeout_s=reward_timeout_s, mode=reward_mode, num_workers=reward_workers,
                          fn_kwargs=reward_kwargs or {})
    counts: list[tuple[int, int]] = []
    kept: list[list[str]] = []
    truncated = 0
    t_gen = t_score = 0.0
    try:
        eng.sync_weights(policy_bundle.model)
        for j, start in enumerate(range(0, len(prompts), prompts_per_chunk)):
            chunk = list(prompts[start : start + prompts_per_chunk])
            ids = [encode(p.text) if encode else tok.encode(p.text, add_bos=True) for p in chunk]
            chunk_seed = random.Random(f"{seed}:eval:{j}").randrange(2**30)
            t0 = time.perf_counter()
            gens = eng.generate(ids, n, sampling, seed=chunk_seed)
            t_gen += time.perf_counter() - t0
            if len(gens) != len(chunk) or any(len(g) != n for g in gens):
                raise RuntimeError(f"engine returned {[len(g) for g in gens]} completions for {len(chunk)} prompts")
            texts = [tok.decode([t for t in g.token_ids if t != tok.eos_id]) for per in gens for g in per]
            truncated += sum(g.truncated for per in gens for g in per)
            t0 = time.perf_counter()
            rewards, _ = runner.score([p.text for p in chunk for _ in range(n)], texts,
                                      [p.reference for p in chunk for _ in range(n)])
            t_score += time.perf_counter() - t0
            for i in range(len(chunk)):
                row = rewards[i * n : (i + 1) * n]
                counts.append((n, sum(r >= correct_threshold for r in row)))
                kept.append(texts[i * n : i * n + keep_completions])
            log.info("evaluated %d/%d problems", len(counts), len(prompts))
        failures = runner.total.failures
    finally:
        runner.close()
        if owned:
            eng.close()

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
