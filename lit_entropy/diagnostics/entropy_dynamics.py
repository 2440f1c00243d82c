"""Batch statistics that predict or describe how the policy entropy moves (docs/design.md §7.5).

All functions take per-token tensors ``[B, L]`` aligned with a boolean response mask ``M`` [B, L]
(:class:`~lit_entropy.rollout.batch.RolloutBatch` layout). Positions outside the mask may hold anything,
NaN and inf included: they are replaced with ``torch.where`` before any arithmetic, never multiplied
by 0. Computation is in fp32 (fp64 inputs stay fp64). Advantages may be per sequence ``[B]``
(broadcast over tokens) or per token ``[B, L]``. An empty mask (or an empty sign class) gives 0, never
NaN. No gradient flows through the outputs.

Notation: ``logp_t`` the log-prob of the sampled token, ``A_t`` its advantage, ``H_t`` the
full-vocabulary entropy at that position, ``S_t = p_t·(H_t + log p_t)`` and
``N_t = Σ_v p_v²·(H_t + log p_v)`` (:mod:`lit_entropy.diagnostics.discriminator`); ``mean_B`` is the
mean over the response tokens of the batch.

* :func:`cov_logp_adv` — ``Cov_B(logp, A) = mean_B[(logp_t − mean_B logp)(A_t − mean_B A)]``
  (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"): its sign predicts the sign of
  ``−ΔH`` under natural policy gradient.
* :func:`disc_centered_mean` — ``mean_B[S_t − N_t]``; ``N_t = E_{y∼p}[S_t]`` so this is ≈ 0 when the
  tokens were sampled from the scored policy (Wang et al. 2026): a sanity check.
* :func:`dh_pred` — ``−mean_B[A_t·(S_t − N_t)]``: the first-order entropy change per unit step
  (Wang et al. 2026, Theorem 2 summed over the batch), in product form.
* :func:`entropy_by_sign`, :func:`mean_loglik_by_sign`, :func:`entropy_quantiles` — descriptive.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

DEFAULT_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9, 0.99)


def _float(x: Tensor) -> Tensor:
    """``x`` detached, in fp32 at least (fp64 stays fp64)."""
    x = x.detach()
    return x.to(torch.promote_types(x.dtype, torch.float32)) if x.is_floating_point() else x.float()


def _mask(mask: Tensor, like: Tensor) -> Tensor:
    if tuple(mask.shape) != tuple(like.shape):
        raise ValueError(f"mask {tuple(mask.shape)} does not match values {tuple(like.shape)}")
    return mask.to(device=like.device, dtype=torch.bool)


def _clean(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` in float with every position outside ``mask`` set to 0 (garbage-safe)."""
    x = _float(x)
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """``[B]`` advantages broadcast to ``like``'s ``[B, L]``; ``[B, L]`` returned as is."""
    a = _float(advantages).to(like.device)
    if a.dim() == 1:
        if a.shape[0] != like.shape[0]:
            raise ValueError(f"advantages {tuple(a.shape)} do not match values {tuple(like.shape)}")
        return a[:, None].expand_as(like)
    if tuple(a.shape) != tuple(like.shape):
        raise ValueError(f"advantages {tuple(a.shape)} do not match values {tuple(like.shape)}")
    return a


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``Σ x·M / Σ M`` over all tokens, 0 when the mask is empty (``x`` already cleaned)."""
    count = mask.sum()
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum() / count.clamp(min=1)


def _sequence_sign(advantages: Tensor, mask: Tensor) -> Tensor:
    """Per-sample advantage sign ``[B]``: the ``[B]`` advantage, or the mean of ``[B, L]`` over the sample's
    response tokens (a sample with no response token, or a zero advantage, has sign 0)."""
    a = _float(advantages).to(mask.device)
    if a.dim() == 1:
        if a.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages {tuple(a.shape)} do not match mask {tuple(mask.shape)}")
        has_tokens = mask.any(-1)
        a = torch.where(has_tokens, torch.where(torch.isfinite(a), a, 0.0), 0.0)
        return torch.sign(a)
    a = _clean(a, _mask(mask, a))
    return torch.sign(a.sum(-1) / mask.sum(-1).clamp(min=1))


@torch.no_grad()
def cov_logp_adv(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Batch covariance of ``logp_t`` and ``A_t`` over the response tokens (Cui et al. 2025).

    ``mean_B[(logp_t − mean_B logp)·(A_t − mean_B A)]`` — the population covariance (divide by the
    number of response tokens N), the quantity whose sign drives the entropy change in Cui et al.'s
    Lemma/Theorem 1. Positive: high-advantage tokens are already likely, so the update sharpens the
    policy and entropy falls. Returns a 0-d tensor (0 for an empty mask).
    """
    logp = _float(logp)
    mask = _mask(mask, logp)
    a = _clean(_token_advantages(advantages, logp), mask)
    lp = _clean(logp, mask)
    dlp = lp - _masked_mean(lp, mask)
    da = a - _masked_mean(a, mask)
    return _masked_mean(dlp * da, mask)


@torch.no_grad()
def disc_centered_mean(S: Tensor, N: Tensor, mask: Tensor) -> Tensor:
    """``mean_B[S_t − N_t]`` over the response tokens (Wang et al. 2026).

    ``N_t`` is the expectation of ``S_t`` over the sampled token drawn from the scored policy, so on
    policy this is 0 up to sampling noise (standard error ``std(S − N)/√N``). A value many standard
    errors away from 0 means the tokens were not sampled from the policy that was scored (a
    temperature mismatch, stale weights, a sampler bug).
    """
    S = _float(S)
    mask = _mask(mask, S)
    return _masked_mean(_clean(S, mask) - _clean(N, mask), mask)


@torch.no_grad()
def dh_pred(S: Tensor, N: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Predicted first-order entropy change per unit step: ``−mean_B[A_t·(S_t − N_t)]``.

    For a softmax over logits ``z`` updated by ``z ← z + η·A_t·∇_z log p_t`` (SGD on ``−A_t·log p_t``),
    ``∇_z H = −p ⊙ (log p + H)`` and ``∇_z log p_t = e_t − p`` give
    ``ΔH_t = −η·A_t·(S_t − N_t) + O(η²)`` (Wang et al. 2026, Theorem 2); this is its token mean
    over the batch divided by η. The product form is used rather than ``−Cov_B(A, S − N)``
    (Corollary 4): the two agree only when ``mean_B(S − N) = 0``, which holds in expectation only.
    Positive: the update raises entropy; negative: it lowers it.
    """
    S = _float(S)
    mask = _mask(mask, S)
    a = _clean(_token_advantages(advantages, S), mask)
    centred = _clean(S, mask) - _clean(N, mask)
    return -_masked_mean(a * centred, mask)


@torch.no_grad()
def entropy_by_sign(entropy: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(pos, neg)``: token-mean entropy over the response tokens of positive / negative advantage samples.

    A sample's sign is that of its ``[B]`` advantage (or of the mean of its ``[B, L]`` token advantages);
    zero-advantage samples count in neither. Tokens are pooled (a token mean, not a mean of per-sample
    means). 0 for a class with no token.
    """
    ent = _float(entropy)
    mask = _mask(mask, ent)
    sign = _sequence_sign(advantages, mask)
    ent = _clean(ent, mask)
    pos = mask & (sign > 0)[:, None]
    neg = mask & (sign < 0)[:, None]
    return _masked_mean(ent, pos), _masked_mean(ent, neg)


@torch.no_grad()
def mean_loglik_by_sign(logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(pos, neg)``: mean over positive / negative advantage samples of each sample's mean token log-prob.

    Each sample (with at least one response token) contributes ``mean_t logp_t`` once, whatever its
    length. Signs as in :func:`entropy_by_sign`; 0 for a class with no sample.
    """
    lp = _float(logp)
    mask = _mask(mask, lp)
    sign = _sequence_sign(advantages, mask)
    count = mask.sum(-1)
    seq = _clean(lp, mask).sum(-1) / count.clamp(min=1)
    has = count > 0
    pos = has & (sign > 0)
    neg = has & (sign < 0)
    return _masked_mean(seq, pos), _masked_mean(seq, neg)


@torch.no_grad()
def entropy_quantiles(entropy: Tensor, mask: Tensor, qs: Sequence[float] = DEFAULT_QUANTILES) -> Tensor:
    """Quantiles ``qs`` of the response-token entropies (linear interpolation, as ``torch.quantile``).

    Sort-based, so there is no size limit on the number of tokens. Returns a 1-D tensor of
    ``len(qs)`` values (zeros for an empty mask).
    """
    ent = _float(entropy)
    mask = _mask(mask, ent)
    q = torch.as_tensor(list(qs), dtype=ent.dtype, device=ent.device)
    if q.numel() and not bool(((q >= 0) & (q <= 1)).all()):
        raise ValueError(f"quantiles must lie in [0, 1], got {list(qs)}")
    values = ent[mask]
    n = values.numel()
    if n == 0:
        return torch.zeros_like(q)
    values = values.sort().values
    pos = q * (n - 1)
    lo = pos.floor().long().clamp(0, n - 1)
    hi = pos.ceil().long().clamp(0, n - 1)
    frac = pos - lo.to(pos.dtype)
    return values[lo] + (values[hi] - values[lo]) * frac


def response_values(values: Tensor, mask: Tensor) -> Tensor:
    """The response-token values of ``values`` as a flat fp32 CPU tensor (e.g. for a histogram)."""
    values = _float(values)
    return values[_mask(mask, values)].float().cpu()


__all__ = [
    "DEFAULT_QUANTILES",
    "cov_logp_adv",
    "dh_pred",
    "disc_centered_mean",
    "entropy_by_sign",
    "entropy_quantiles",
    "mean_loglik_by_sign",
    "response_values",
]
