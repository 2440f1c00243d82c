"""What the token-selection rules share: counts from fractions taken on their decimal value, the shape checks,
masked fp32 statistics with no gradient, stable top-k picks and the covariance terms of Cui et al. 2025.

Counts from fractions (``⌊ρ·N⌋``, ``⌈top_frac·N⌉``) use the decimal value of the fraction exactly
(``Fraction(repr(x))``), so ``⌊0.29·100⌋ = 29`` even though ``0.29 * 100 == 28.999…`` in binary floats. Top-K
selections sort with a stable sort: ties go to the earlier token in row-major ``[B, L]`` order.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

ROUNDINGS = ("floor", "stochastic")
"""How a fraction becomes a count: ``⌊ρN⌋``, or ``⌊ρN⌋ + Bernoulli(ρN − ⌊ρN⌋)`` (expected count exactly ρN)."""


def decimal_count(frac: float, n: int, rounding: str) -> int:
    """``⌊frac·n⌋`` or ``⌈frac·n⌉`` computed on the decimal value of ``frac`` (no binary round-off)."""
    exact = Fraction(repr(float(frac))) * n
    return math.floor(exact) if rounding == "floor" else math.ceil(exact)


def selection_count(frac: float, n: int, min_count: int = 1, rounding: str = "floor",
                    generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> int:
    """Tokens to pick out of ``n`` for a fraction ``frac``: ``max(min_count, ⌊frac·n⌋)`` (``rounding="floor"``),
    or with ``rounding="stochastic"`` ``⌊frac·n⌋`` plus one with probability ``frac·n − ⌊frac·n⌋`` (one draw
    of ``torch.rand`` on ``generator``), so that with ``min_count=0`` the expected count per step is exactly
    ``frac·n`` at any batch size. 0 when ``n = 0``."""
    if n == 0:
        return 0
    base = decimal_count(frac, n, "floor")
    if rounding == "stochastic":
        rest = float(Fraction(repr(float(frac))) * n - base)
        if rest > 0 and float(torch.rand((), generator=generator, device=device)) < rest:
            base += 1
    return max(int(min_count), base)


def check_count(min_count: object) -> None:
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 0:
        raise ValueError(f"algo.selection_args.min_count={min_count!r} must be an integer >= 0")


def check_mask(mask: Tensor, *tensors: Tensor) -> Tensor:
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, L], got shape {tuple(mask.shape)}")
    for t in tensors:
        if tuple(t.shape) != tuple(mask.shape):
            raise ValueError(f"expected a [B, L] tensor of shape {tuple(mask.shape)}, got {tuple(t.shape)}")
    return mask.bool()


def per_token(advantages: Tensor, mask: Tensor) -> Tensor:
    """Advantages as fp32 [B, L]: per token [B, L] as is, per sequence [B] broadcast over tokens."""
    adv = advantages.detach().float()
    if adv.dim() == 1 and adv.shape[0] == mask.shape[0]:
        adv = adv.unsqueeze(-1)
    elif tuple(adv.shape) != tuple(mask.shape):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} must be [B, L] or [B] for mask {tuple(mask.shape)}"
        )
    return adv.expand(mask.shape)


def masked(x: Tensor, mask: Tensor, fill: float = 0.0) -> Tensor:
    """fp32 copy of ``x`` (no grad) with ``fill`` outside ``mask`` (padding garbage, NaN included, is gone)."""
    return torch.where(mask, x.detach().float(), torch.full((), fill, dtype=torch.float32, device=x.device))


def mean_over(x: Tensor, mask: Tensor, n: int) -> Tensor:
    return masked(x, mask).sum() / max(n, 1)


def pop_std(x: Tensor, mask: Tensor, n: int) -> Tensor:
    """Population standard deviation (divide by ``n``) of ``x`` over ``mask``."""
    centred = masked(x - mean_over(x, mask, n), mask)
    return torch.sqrt(centred.pow(2).sum() / max(n, 1))


def fraction(selected: Tensor, n: int) -> Tensor:
    return selected.sum().to(torch.float32) / max(n, 1)


def top_k(scores: Tensor, mask: Tensor, k: int) -> Tensor:
    """Bool [B, L]: the ``k`` largest ``scores`` among ``mask`` (stable: ties → earlier row-major index)."""
    out = torch.zeros_like(mask)
    if k <= 0:
        return out
    keyed = masked(scores, mask, fill=-math.inf).reshape(-1)
    order = torch.sort(keyed, descending=True, stable=True).indices[:k]
    out.view(-1)[order] = True
    return out & mask


def covariance_terms(logp: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``c_t = (A_t − mean A)·(logp_t − mean logp)`` [B, L] fp32, means over the response tokens; 0 on padding.

    The per-token covariance terms of Cui et al. 2025 (their mean is ``diag/cov_logp_adv``).
    ``advantages`` is [B, L] or per sequence [B]. No gradient.
    """
    mask = check_mask(mask, logp)
    adv = per_token(advantages, mask)
    n = int(mask.sum())
    c = (adv - mean_over(adv, mask, n)) * (logp.detach().float() - mean_over(logp, mask, n))
    return masked(c, mask)
