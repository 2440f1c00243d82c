"""Token selection rules for entropy control (docs/design.md §7.3).

Every rule takes per-token tensors [B, L] aligned with ``input_ids`` and a bool ``mask`` [B, L] of response
tokens, and is computed over the WHOLE minibatch it is given (statistics, counts and caps are minibatch
quantities: call it once on the whole minibatch, then slice the returned mask per micro-batch). Values at
padding positions may be garbage (even NaN/inf): they never enter a statistic (``torch.where``) and a
returned mask is never True there. Statistics are fp32 and use no gradient.

Each rule returns ``(bool mask [B, L], frac)`` with ``frac`` a 0-dim fp32 tensor: the fraction of the
minibatch's ``N`` response tokens the rule touched (0 when ``N = 0``).

Counts from fractions (``⌊ρ·N⌋``, ``⌈top_frac·N⌉``) use the decimal value of the fraction exactly
(``Fraction(repr(x))``), so ``⌊0.29·100⌋ = 29`` even though ``0.29 * 100 == 28.999…`` in binary floats.
Top-K selections sort with a stable sort: ties go to the earlier token in row-major ``[B, L]`` order.

Rules (each registered, with the batch tensors it needs, in :mod:`lit_entropy.objectives.registry`):

* :func:`clip_cov` / :func:`kl_cov` (+ :func:`kl_cov_loss`) — Cui et al. 2025, "The Entropy Mechanism of
  Reinforcement Learning for Reasoning Language Models".
* :func:`clip_b`, :func:`clip_v` — Wang et al. 2026 (entropy discriminator clipping); ``S`` and ``N`` come
  from :func:`lit_entropy.diagnostics.discriminator.token_scores`.
* :func:`forking_tokens` — Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
  Effective Reinforcement Learning for LLM Reasoning".
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

from lit_entropy.objectives.policy_loss import ratio

# ----------------------------------------------------------------------------------------------- helpers


def _count(frac: float, n: int, rounding: str) -> int:
    """``⌊frac·n⌋`` or ``⌈frac·n⌉`` computed on the decimal value of ``frac`` (no binary round-off)."""
    exact = Fraction(repr(float(frac))) * n
    return math.floor(exact) if rounding == "floor" else math.ceil(exact)


CLIP_COV_BOUNDS = ("absolute", "quantile")
"""Clip-Cov's ``bounds``: the paper's absolute c range, or quantiles of c over the minibatch (scale-free)."""
ROUNDINGS = ("floor", "stochastic")
"""How a fraction becomes a count: ``⌊ρN⌋``, or ``⌊ρN⌋ + Bernoulli(ρN − ⌊ρN⌋)`` (expected count exactly ρN)."""


def selection_count(frac: float, n: int, min_count: int = 1, rounding: str = "floor",
                    generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> int:
    """Tokens to pick out of ``n`` for a fraction ``frac``: ``max(min_count, ⌊frac·n⌋)`` (``rounding="floor"``),
    or with ``rounding="stochastic"`` ``⌊frac·n⌋`` plus one with probability ``frac·n − ⌊frac·n⌋`` (one draw
    of ``torch.rand`` on ``generator``), so that with ``min_count=0`` the expected count per step is exactly
    ``frac·n`` at any batch size. 0 when ``n = 0``."""
    if n == 0:
        return 0
    base = _count(frac, n, "floor")
    if rounding == "stochastic":
        rest = float(Fraction(repr(float(frac))) * n - base)
        if rest > 0 and float(torch.rand((), generator=generator, device=device)) < rest:
            base += 1
    return max(int(min_count), base)


def _check_count(min_count: object) -> None:
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 0:
        raise ValueError(f"algo.selection_args.min_count={min_count!r} must be an integer >= 0")


def check_clip_cov_args(rho: float = 2e-4, bound_low: float = 1.0, bound_high: float = 5.0, bounds: str = "absolute",
                        min_count: int = 1, rounding: str = "floor", **_: object) -> None:
    """Raise, naming the ``algo.selection_args`` key, on a Clip-Cov setting that cannot work."""
    if not rho >= 0:
        raise ValueError(f"algo.selection_args.rho={rho} must be >= 0")
    if bounds not in CLIP_COV_BOUNDS:
        raise ValueError(f"algo.selection_args.bounds={bounds!r}; choose one of {CLIP_COV_BOUNDS}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"algo.selection_args.rounding={rounding!r}; choose one of {ROUNDINGS}")
    _check_count(min_count)
    if bounds == "quantile" and not 0 <= bound_low < bound_high <= 1:
        raise ValueError(f"algo.selection_args.bound_low={bound_low}, bound_high={bound_high}: with bounds=quantile "
                         "they are quantiles of c and need 0 <= bound_low < bound_high <= 1")
    if bounds == "absolute" and not bound_low < bound_high:
        raise ValueError(f"algo.selection_args.bound_low={bound_low} must be < bound_high={bound_high}")


def check_kl_cov_args(k: float = 2e-3, min_count: int = 1, beta: float = 1.0, **_: object) -> None:
    """Raise, naming the ``algo.selection_args`` key, on a KL-Cov setting that cannot work."""
    if not 0 <= k <= 1:
        raise ValueError(f"k must be in [0, 1], got {k} (algo.selection_args.k)")
    _check_count(min_count)
    if not beta >= 0:
        raise ValueError(f"algo.selection_args.beta={beta} must be >= 0")


def check_args(rule: str | None, args: dict) -> None:
    """The start-up check of ``algo.selection_args`` values (their names are checked by the registry)."""
    checks = {"clip_cov": check_clip_cov_args, "kl_cov": check_kl_cov_args}
    if rule in checks:
        checks[rule](**args)


def _check_mask(mask: Tensor, *tensors: Tensor) -> Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, L], got shape {tuple(mask.shape)}")
    for t in tensors:
        if tuple(t.shape) != tuple(mask.shape):
            raise ValueError(f"expected a [B, L] tensor of shape {tuple(mask.shape)}, got {tuple(t.shape)}")
    return mask.bool()


def _per_token(advantages: Tensor, mask: Tensor) -> Tensor:
    """Advantages as fp32 [B, L]: per token [B, L] as is, per sequence [B] broadcast over tokens."""
    adv = advantages.detach().float()
    if adv.dim() == 1 and adv.shape[0] == mask.shape[0]:
        adv = adv.unsqueeze(-1)
    elif tuple(adv.shape) != tuple(mask.shape):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B, L] or [B] for mask {tuple(mask.shape)}"
        )
    return adv.expand(mask.shape)


def _masked(x: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """fp32 copy of ``x`` (no grad) with ``fill`` outside ``mask`` (padding garbage, NaN included, is gone)."""
    return torch.where(mask, x.detach().float(), torch.full((), fill, dtype=torch.float32, device=x.device))


def _mean(x: Tensor, mask: Tensor, n: int) -> Tensor:
    return _masked(x, mask).sum() / max(n, 1)


def _pop_std(x: Tensor, mask: Tensor, n: int) -> Tensor:
    """Population standard deviation (divide by ``n``) of ``x`` over ``mask``."""
    centred = _masked(x - _mean(x, mask, n), mask)
    return torch.sqrt(centred.pow(2).sum() / max(n, 1))


def _frac(selected: Tensor, n: int) -> Tensor:
    return selected.sum().to(torch.float32) / max(n, 1)


def _top_k(scores: Tensor, mask: Tensor, k: int) -> Tensor:
    """Bool [B, L]: the ``k`` largest ``scores`` among ``mask`` (stable: ties → earlier row-major index)."""
    out = torch.zeros_like(mask)
    if k <= 0:
        return out
    keyed = _masked(scores, mask, fill=-math.inf).reshape(-1)
    order = torch.sort(keyed, descending=True, stable=True).indices[:k]
    out.view(-1)[order] = True
    return out & mask


def covariance_terms(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``c_t = (A_t − mean A)·(logp_t − mean logp)`` [B, L] fp32, means over the response tokens; 0 on padding.

    The per-token covariance terms of Cui et al. 2025 (their mean is ``diag/cov_logp_adv``).
    ``advantages`` is [B, L] or per sequence [B]. No gradient.
    """
    mask = _check_mask(mask, logp)
    adv = _per_token(advantages, mask)
    n = int(mask.sum())
    c = (adv - _mean(adv, mask, n)) * (logp.detach().float() - _mean(logp, mask, n))
    return _masked(c, mask)


# ------------------------------------------------------------------------------------------------- rules


def clip_cov(
    logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    already_clipped: Tensor | None,
    rho: float = 2e-4,
    bound_low: float = 1.0,
    bound_high: float = 5.0,
    bounds: str = "absolute",
    min_count: int = 1,
    rounding: str = "floor",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Clip-Cov (Cui et al. 2025): the response tokens to detach from the policy gradient.

    Rule: ``c_t = (A_t − mean A)·(logp_t − mean logp)`` with both means over the minibatch's ``N``
    response tokens. Candidates are response tokens not ``already_clipped`` (e.g. the PPO clip is active
    there; ``None`` = none are) whose ``c_t`` lies between the bounds:

    * ``bounds="absolute"`` (the paper's rule): ``bound_low < c_t < bound_high`` (strict), in units of c;
    * ``bounds="quantile"`` (scale-free): ``q(bound_low) < c_t <= q(bound_high)``, ``q`` the quantile of c over
      the ``N`` response tokens (``torch.quantile``, linear interpolation), ``0 <= bound_low < bound_high <= 1``;
      e.g. ``(0.9, 1.0)``: the top tenth of the tokens by covariance, whatever c's scale in this regime.

    Of the candidates, ``n = selection_count(rho, N, min_count, rounding)`` are picked uniformly at random
    without replacement (all of them if there are fewer; none if there are none, or if ``N = 0``). The paper's
    ``max(1, ⌊rho·N⌋)`` is ``min_count=1, rounding="floor"``. The caller zeroes/detaches their loss.

    Randomness: ``torch.randperm`` over the candidates (and, with ``rounding="stochastic"``, one ``torch.rand``
    before it) on ``generator``'s device (the tensors' device when ``generator`` is None, using the global RNG),
    so a seeded generator gives the same mask.

    Returns ``(detach_mask [B, L] bool, frac = detached / N)``.
    """
    mask = _check_mask(mask, logp)
    check_clip_cov_args(rho, bound_low, bound_high, bounds, min_count, rounding)
    n = int(mask.sum())
    c = covariance_terms(logp, advantages, mask)
    if bounds == "quantile" and n > 0:
        values = c[mask]
        q = torch.quantile(values, torch.tensor([bound_low, bound_high], dtype=values.dtype, device=values.device))
        candidates = mask & (c > q[0]) & (c <= q[1])
    else:
        candidates = mask & (c > bound_low) & (c < bound_high)
    if already_clipped is not None:
        candidates &= ~_check_mask(already_clipped.bool(), mask)
    out = torch.zeros_like(mask)
    idx = candidates.reshape(-1).nonzero().squeeze(-1)
    if n == 0 or idx.numel() == 0:
        return out, _frac(out, n)
    device = generator.device if generator is not None else idx.device
    n_pick = min(selection_count(rho, n, min_count, rounding, generator, device), idx.numel())
    if n_pick == 0:
        return out, _frac(out, n)
    perm = torch.randperm(idx.numel(), generator=generator, device=device)[:n_pick].to(idx.device)
    out.view(-1)[idx[perm]] = True
    return out, _frac(out, n)


def kl_cov(logp: Tensor, advantages: Tensor, mask: Tensor, k: float = 2e-3,
           min_count: int = 1) -> tuple[Tensor, Tensor]:
    """KL-Cov (Cui et al. 2025): the response tokens that get the KL penalty in :func:`kl_cov_loss`.

    Rule: ``c_t = (A_t − mean A)·(logp_t − mean logp)`` (means over the ``N`` response tokens); select the
    top ``min(N, max(min_count, ⌊k·N⌋))`` response tokens by ``c_t`` (ties → earlier row-major index).
    ``min_count=1`` (the default) is Clip-Cov's at-least-one: with ``⌊k·N⌋ = 0`` (a small minibatch, the 32B
    value of ``k``) the penalty would vanish and the loss become the unclipped ``−A·r`` alone; a larger
    ``min_count`` keeps a fixed number of tokens per step in small minibatches. ``k = 0`` selects none.
    Paper values: ``k = 2e-3`` (7B class), ``2e-4`` (32B class).

    Returns ``(selected_mask [B, L] bool, frac = selected / N)``.
    """
    mask = _check_mask(mask, logp)
    check_kl_cov_args(k, min_count)
    n = int(mask.sum())
    count = min(n, max(min_count, _count(k, n, "floor"))) if k > 0 and n > 0 else 0
    selected = _top_k(covariance_terms(logp, advantages, mask), mask, count)
    return selected, _frac(selected, n)


def kl_cov_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, selected: Tensor, beta: float = 1.0
) -> Tensor:
    """Per-token KL-Cov loss [B, L] (fp32; Cui et al. 2025). Masking is left to the aggregation.

    Rule, with the unclipped ratio ``r = exp(logp − old_logp)``::

        l_t = −A_t·r_t + beta·|logp_t − old_logp_t|    if selected_t
        l_t = −A_t·r_t                                   otherwise

    ``advantages`` is [B, L] or per sequence [B]. With ``logp == old_logp`` the penalty and its
    gradient (``sign(0) = 0``) vanish, so the loss is exactly the plain surrogate ``−A·r``.
    """
    r = ratio(logp, old_logp)
    adv = advantages.float()
    if adv.dim() == r.dim() - 1:
        adv = adv.unsqueeze(-1)
    surrogate = -adv * r
    penalty = beta * (logp.float() - old_logp.float()).abs()
    return torch.where(selected.bool(), surrogate + penalty, surrogate)


def clip_b(S: Tensor, advantages: Tensor, mask: Tensor, mu: float = 2.5) -> tuple[Tensor, Tensor]:
    """Clip_B (Wang et al. 2026): batch-normalised discriminator clipping of negative-advantage tokens.

    Rule: over the ``N`` response tokens, ``z_t = S_t − mean S`` and ``σ`` = population std of ``S``
    (``S_t = p_t·(H_t + log p_t)``). A response token with ``A_t < 0`` and ``z_t < −mu·σ`` (strict) is
    removed from the loss; tokens with ``A_t ≥ 0`` are always kept. ``σ = 0`` removes nothing.

    Returns ``(keep_mask, frac_removed)``: ``keep_mask`` is ``mask`` minus the removed tokens (False on
    padding, usable directly as the loss mask), ``frac_removed = removed / N``.
    """
    mask = _check_mask(mask, S)
    adv = _per_token(advantages, mask)
    n = int(mask.sum())
    z = S.detach().float() - _mean(S, mask, n)
    removed = mask & (adv < 0) & (z < -mu * _pop_std(S, mask, n))
    return mask & ~removed, _frac(removed, n)


def clip_v(
    S: Tensor, N: Tensor, advantages: Tensor, mask: Tensor, mu: float = 8.5, max_frac: float = 1e-4
) -> tuple[Tensor, Tensor]:
    """Clip_V (Wang et al. 2026): vocabulary-baseline discriminator clipping, capped.

    Rule: ``D_t = N_t − S_t`` (``N_t = Σ_v p_v²(H_t + log p_v)``, the on-policy mean of ``S_t``, so ``D`` is
    the negative centred score and is not re-centred here). ``σ_D`` = population std of ``D`` over the
    ``N`` response tokens. A response token with ``A_t < 0`` and ``D_t > mu·σ_D`` (strict) qualifies. At
    most ``K = ⌊max_frac·N⌋`` tokens are removed: if more qualify, the ``K`` with the largest ``D`` are
    removed (ties → earlier row-major index).

    Decision on the cap: ``K = ⌊max_frac·N⌋`` with no ``max(1, ·)``, so the removed fraction never
    exceeds ``max_frac`` (docs/design.md §7.3). Consequently ``K = 0`` — and nothing is
    removed — when ``N < 1 / max_frac`` (10,000 response tokens at the default): raise ``max_frac`` for
    small minibatches. ``frac_removed`` shows it. This matches :func:`kl_cov`'s ``⌊k·N⌋ = 0`` → none.

    Returns ``(keep_mask, frac_removed)``: ``keep_mask`` is ``mask`` minus the removed tokens (False on
    padding), ``frac_removed = removed / N``.
    """
    mask = _check_mask(mask, S, N)
    if not 0 <= max_frac <= 1:
        raise ValueError(f"max_frac must be in [0, 1], got {max_frac}")
    adv = _per_token(advantages, mask)
    n = int(mask.sum())
    d = _masked(N, mask) - _masked(S, mask)
    qualifies = mask & (adv < 0) & (d > mu * _pop_std(d, mask, n))
    removed = _top_k(d, qualifies, _count(max_frac, n, "floor"))
    return mask & ~removed, _frac(removed, n)


def forking_tokens(entropy: Tensor, mask: Tensor, top_frac: float = 0.2) -> tuple[Tensor, Tensor]:
    """High-entropy "forking" tokens (Wang et al. 2025, "Beyond the 80/20 Rule").

    Rule: keep in the loss only the top ``⌈top_frac·N⌉`` of the ``N`` response tokens by entropy ``H_t``
    (paper: 20%); ties are broken deterministically toward the earlier token in row-major [B, L] order.

    Returns ``(keep_mask [B, L] bool (False on padding), frac_kept = kept / N)``.
    """
    mask = _check_mask(mask, entropy)
    if not 0 <= top_frac <= 1:
        raise ValueError(f"top_frac must be in [0, 1], got {top_frac}")
    n = int(mask.sum())
    keep = _top_k(entropy, mask, _count(top_frac, n, "ceil"))
    return keep, _frac(keep, n)
