"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models"): detach the tokens whose covariance term lies between two bounds."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.selection import SelectionRule, register
from lit_entropy.objectives.selection.tokens import (
    ROUNDINGS,
    check_count,
    check_mask,
    covariance_terms,
    fraction,
    selection_count,
)

CLIP_COV_BOUNDS = ("absolute", "quantile")
"""Clip-Cov's ``bounds``: the paper's absolute c range, or quantiles of c over the minibatch (scale-free)."""


def check_clip_cov_args(rho: float = 2e-4, bound_low: float = 1.0, bound_high: float = 5.0, bounds: str = "absolute",
                        min_count: int = 1, rounding: str = "floor", **_: object) -> None:
    """Raise, naming the ``algo.selection_args`` key, on a Clip-Cov setting that cannot work."""
    if not rho >= 0:
        raise ValueError(f"algo.selection_args.rho={rho} must be >= 0")
    if bounds not in CLIP_COV_BOUNDS:
        raise ValueError(f"algo.selection_args.bounds={bounds!r}; choose one of {CLIP_COV_BOUNDS}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"algo.selection_args.rounding={rounding!r}; choose one of {ROUNDINGS}")
    check_count(min_count)
    if bounds == "quantile" and not 0 <= bound_low < bound_high <= 1:
        raise ValueError(f"algo.selection_args.bound_low={bound_low}, bound_high={bound_high}: with bounds=quantile "
                         "they are quantiles of c and need 0 <= bound_low < bound_high <= 1")
    if bounds == "absolute" and not bound_low < bound_high:
        raise ValueError(f"algo.selection_args.bound_low={bound_low} must be < bound_high={bound_high}")


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
    mask = check_mask(mask, logp)
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
        candidates &= ~check_mask(already_clipped.bool(), mask)
    out = torch.zeros_like(mask)
    idx = candidates.reshape(-1).nonzero().squeeze(-1)
    if n == 0 or idx.numel() == 0:
        return out, fraction(out, n)
    device = generator.device if generator is not None else idx.device
    n_pick = min(selection_count(rho, n, min_count, rounding, generator, device), idx.numel())
    if n_pick == 0:
        return out, fraction(out, n)
    perm = torch.randperm(idx.numel(), generator=generator, device=device)[:n_pick].to(idx.device)
    out.view(-1)[idx[perm]] = True
    return out, fraction(out, n)



register(SelectionRule("clip_cov", clip_cov, effect="detach", per_token_ratios=True, check=check_clip_cov_args,
                       inputs={"logp": "current_logp", "advantages": "token_advantages", "mask": "mask",
                               "already_clipped": "ppo_clipped", "generator": "generator"}))
