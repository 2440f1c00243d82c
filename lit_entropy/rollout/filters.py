"""Rollout filters: degenerate completions leave the loss, and the dashboard says how many (prime-rl's
``orchestrator.filters``, docs/correction.md).

* :func:`repetition_rows`: completions that loop, judged by their repeated n-grams.
* :func:`gibberish_rows`: completions with a token sampled far below the uniform distribution's probability
  (``log p < −log V − offset``, with the sampler's own log-probs), the mark of a rare token drawn at high entropy.

Both are off by default (``batch.filter_repetition`` / ``batch.filter_gibberish`` null). A flagged completion
keeps its reward in its group's baseline (the advantages are computed before) and is zero-weighted: its tokens
leave the loss mask, as the overlong filter does. :func:`apply_filters` logs ``rollout/filtered_<name>`` (rows
each filter flagged) and ``rollout/filtered_total`` (rows flagged by any) every iteration a filter is on, zeros
included, so a filter never acts silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class RepetitionFilter:
    """``batch.filter_repetition``: flag a completion when at least ``max_frac`` of its ``ngram``-token windows
    repeat an earlier window of the same completion (``1 − unique/total``); shorter completions pass."""

    ngram: int = 8
    max_frac: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.ngram, bool) or not isinstance(self.ngram, int) or self.ngram < 1:
            raise ValueError(f"batch.filter_repetition.ngram={self.ngram!r} must be an integer >= 1")
        if not 0 < self.max_frac <= 1:
            raise ValueError(f"batch.filter_repetition.max_frac={self.max_frac} must be in (0, 1]")


@dataclass(frozen=True)
class GibberishFilter:
    """``batch.filter_gibberish``: flag a completion holding at least ``min_tokens`` tokens with id above
    ``token_id_threshold`` whose sampler log-prob is below ``−log(V) − logprob_offset`` (V: the vocabulary)."""

    logprob_offset: float = 2.0
    token_id_threshold: int = 0
    min_tokens: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.logprob_offset) and self.logprob_offset >= 0):
            raise ValueError(f"batch.filter_gibberish.logprob_offset={self.logprob_offset} must be >= 0")
        for name in ("token_id_threshold", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "min_tokens" else 0):
                raise ValueError(f"batch.filter_gibberish.{name}={value!r} must be an integer >= "
                                 f"{1 if name == 'min_tokens' else 0}")


def parse_filter(cls: type, value: Any, key: str) -> Any:
    """``value`` (None, a mapping or an instance) as ``cls``; unknown keys are named with ``key``."""
    if value is None or isinstance(value, cls):
        return value
    args = dict(value)
    unknown = sorted(set(args) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{key} {unknown}: unknown; it takes {[f.name for f in fields(cls)]}")
    return cls(**args)


def repetition_rows(input_ids: Tensor, response_mask: Tensor, ngram: int, max_frac: float) -> Tensor:
    """[B] bool: rows whose response's fraction of repeated ``ngram``-grams (``1 − unique/total``) ≥ ``max_frac``.

    The response tokens of a row are taken in order (right-padded rows: a contiguous span)."""
    flagged = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for i in range(input_ids.shape[0]):
        tokens = input_ids[i][response_mask[i].bool()]
        if tokens.numel() <= ngram:
            continue
        windows = tokens.unfold(0, ngram, 1)
        unique = torch.unique(windows, dim=0).shape[0]
        flagged[i] = 1.0 - unique / windows.shape[0] >= max_frac
    return flagged


def gibberish_rows(input_ids: Tensor, sampler_logp: Tensor, response_mask: Tensor, vocab_size: int,
                   logprob_offset: float, token_id_threshold: int = 0, min_tokens: int = 1) -> Tensor:
    """[B] bool: rows with at least ``min_tokens`` response tokens of id > ``token_id_threshold`` and sampler
    log-prob < ``−log(vocab_size) − logprob_offset`` (prime-rl's gibberish rule)."""
    threshold = -math.log(vocab_size) - logprob_offset
    odd = response_mask.bool() & (input_ids > token_id_threshold) & (sampler_logp.float() < threshold)
    return odd.sum(dim=-1) >= min_tokens


def apply_filters(batch: Any, cfg: Any, model: Any) -> dict[str, float]:
    """Zero-weight the completions the filters of ``cfg`` (:class:`~lit_entropy.rollout.batch.BatchConfig`) flag in
    ``batch`` (a :class:`~lit_entropy.rollout.batch.RolloutBatch`): their tokens leave ``batch.loss_mask``.
    Returns the ``rollout/filtered_*`` counts (empty when no filter is on). ``model``: the policy, whose
    ``config.vocab_size`` the gibberish rule reads."""
    rep, gib = cfg.filter_repetition, cfg.filter_gibberish
    if rep is None and gib is None:
        return {}
    resp = batch.response_mask.bool()
    ids = batch.input_ids.cpu()
    flagged = torch.zeros(ids.shape[0], dtype=torch.bool)
    metrics = {}
    if rep is not None:
        rows = repetition_rows(ids, resp.cpu(), rep.ngram, rep.max_frac)
        metrics["rollout/filtered_repetition"] = float(rows.sum())
        flagged |= rows
    if gib is not None:
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if not vocab:
            raise ValueError("batch.filter_gibberish needs the policy's vocabulary size (model.config.vocab_size)")
        rows = gibberish_rows(ids, batch.sampler_logp.cpu(), resp.cpu(), int(vocab), gib.logprob_offset,
                              gib.token_id_threshold, gib.min_tokens)
        metrics["rollout/filtered_gibberish"] = float(rows.sum())
        flagged |= rows
    metrics["rollout/filtered_total"] = float(flagged.sum())
    keep = resp if batch.loss_mask is None else batch.loss_mask.bool()
    batch.loss_mask = keep & ~flagged.to(keep.device)[:, None]
    return metrics
