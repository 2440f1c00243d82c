"""How the batch's tokens split: by entropy rank, and by advantage sign × probability (docs/diagnostics.md).

Pure functions of ``[B, L]`` tensors and a boolean mask of the tokens to count; positions outside the mask
may hold anything (NaN included), they are replaced before any arithmetic. fp32, no gradient. An empty
mask or an empty class gives 0, never NaN.

* :func:`entropy_high_low` — mean entropy of the top fraction of tokens by entropy and of the rest: the
  "forking" tokens of Wang et al. 2025 ("Beyond the 80/20 Rule", arXiv 2506.01939) against the others;
  several of the entropy-shaping papers (GTPO, Archer, entropy-based advantage shaping) plot these two.
* :func:`grad_mass_quadrants` — where the policy-gradient magnitude goes: share of ``Σ |A_t|·(1 − p_t)`` in
  each quadrant of advantage sign × sampled-token probability.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

QUADRANTS: tuple[str, ...] = ("pos_highp", "pos_lowp", "neg_highp", "neg_lowp")
"""Quadrant names of :func:`grad_mass_quadrants`, in the order it returns them."""


def _values(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` detached in fp32 with 0 outside ``mask``, and ``mask`` as bool on ``x``'s device."""
    if x.shape != mask.shape:
        raise ValueError(f"values {tuple(x.shape)} do not match mask {tuple(mask.shape)}")
    m = mask.to(device=x.device, dtype=torch.bool)
    return torch.where(m, x.detach().float(), 0.0), m


def entropy_high_low(entropy: Tensor, mask: Tensor, high_frac: float = 0.2) -> tuple[Tensor, Tensor]:
    """``(mean H of the high tokens, mean H of the low tokens)`` over the tokens in ``mask``.

    The N masked tokens are ranked by entropy; the ``⌈high_frac·N⌉`` highest are "high" (ties broken by
    position, so the split is exact), the other ``N − ⌈high_frac·N⌉`` are "low". With the default 0.2 this
    is the top-20 % / bottom-80 % split of the 80/20 rule. Raises ``ValueError`` for ``high_frac ∉ (0, 1)``.
    """
    if not 0 < high_frac < 1:
        raise ValueError(f"high_frac={high_frac} must be in (0, 1)")
    h, m = _values(entropy, mask)
    values = h[m]
    zero = torch.zeros((), dtype=torch.float32)
    if values.numel() == 0:
        return zero, zero
    n_high = math.ceil(high_frac * values.numel() - 1e-9)
    ordered = values.sort(descending=True, stable=True).values
    high, low = ordered[:n_high], ordered[n_high:]
    return high.mean(), low.mean() if low.numel() else zero


def grad_mass_quadrants(advantages: Tensor, logp: Tensor, mask: Tensor, threshold: float = 0.5) -> Tensor:
    """fp32 [4]: the share of gradient mass in each of :data:`QUADRANTS`; the shares sum to 1 (all 0 when
    the total is 0).

    A token's mass is ``|A_t|·(1 − p_t)`` with ``p_t = exp(logp_t)``: the size of the policy-gradient push on
    the sampled token's own logit (``∂ log p_t / ∂ z_t = 1 − p_t``), times its advantage. ``pos``/``neg`` is
    the sign of A_t (A = 0 carries no mass); ``highp`` is ``p_t ≥ threshold``, ``lowp`` below it. The fixed
    threshold 0.5 is used rather than the batch median because it has a meaning of its own: above it the
    sampled token is its position's most likely token, and the split does not move as the policy sharpens.
    ``advantages`` are per token [B, L] or per sequence [B] (broadcast).
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand(logp.shape)
    a, m = _values(advantages, mask)
    lp, _ = _values(logp, mask)
    p = lp.exp()
    mass = torch.where(m, a.abs() * (1 - p), 0.0)
    high = p >= threshold
    parts = torch.stack([mass[(a > 0) & high].sum(), mass[(a > 0) & ~high].sum(),
                         mass[(a < 0) & high].sum(), mass[(a < 0) & ~high].sum()])
    total = parts.sum()
    return torch.where(total > 0, parts / total.clamp(min=1e-30), torch.zeros_like(parts))
