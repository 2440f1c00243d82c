"""The pure parts of Entrocraft (Li et al. 2026), docs/design.md §7.4.2.

Given the batch entropy ``H`` and the band ``[h_low, h_high]``, the direction is
``m = 1[H > h_high] − 1[H < h_low]``.

*Paper mode*: sequence i is kept with probability ``min(1, exp(γ·m·A_i))``. With ``m = +1`` (entropy
too high) negative-advantage samples are thinned out, with ``m = −1`` positive ones, and ``m = 0``
keeps everything (:func:`keep_probability`, :func:`sample_keep`).

*Hard mode* (reference-code parity): the advantages are replaced — ``m = +1`` → ``max(R, 0)``
(RAFT++, learn from the rewarded samples only), ``m = −1`` → ``min(R − offset, 0)`` (NSR, learn from
the penalised samples only), ``m = 0`` → the base estimator's advantages (:func:`hard_advantages`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def band_direction(entropy: float, low: float, high: float) -> int:
    """``m = 1[H > high] − 1[H < low]`` ∈ {−1, 0, +1}."""
    if low > high:
        raise ValueError(f"entropy band has low={low} > high={high}")
    if math.isnan(entropy):
        raise ValueError("entropy is NaN")
    return int(entropy > high) - int(entropy < low)


def keep_probability(advantages: Tensor, m: int, gamma: float = 10.0) -> Tensor:
    """``min(1, exp(γ·m·A))`` in fp32, same shape as ``advantages``; all ones when ``m = 0``.

    The exponent is clamped at 0 before ``exp``, so no overflow for large ``γ·|A|``.
    """
    if m not in (-1, 0, 1):
        raise ValueError(f"m must be -1, 0 or +1, got {m}")
    if not (gamma >= 0 and math.isfinite(gamma)):
        raise ValueError(f"gamma must be finite and >= 0, got {gamma}")
    exponent = (gamma * m) * advantages.float()
    return torch.exp(exponent.clamp(max=0.0))


def sample_keep(
    advantages: Tensor,
    m: int,
    gamma: float = 10.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Bool mask of kept sequences: independent Bernoulli draws with :func:`keep_probability`.

    Always draws one number per sequence (also when ``m = 0``), so the generator advances the same
    way whatever the direction.
    """
    probs = keep_probability(advantages, m, gamma)
    return torch.bernoulli(probs, generator=generator).bool()


def hard_advantages(
    rewards: Tensor,
    advantages: Tensor,
    m: int,
    nsr_reward_offset: float = 0.0,
) -> Tensor:
    """Hard-mode per-sequence advantages, fp32 [B].

    ``m = +1``: ``A = max(R, 0)`` (RAFT++). ``m = −1``: ``A = min(R − nsr_reward_offset, 0)`` (NSR).
    ``m = 0``: ``advantages`` (the base estimator's) returned unchanged — the same tensor object.

    ``R`` is the raw reward. With 0/1 rewards ``min(R, 0)`` is all zeros (no update at all); reference
    code that uses NSR pairs it with rewards in {−1, +1}. ``nsr_reward_offset = 1`` maps {0, 1} to
    {−1, 0}, i.e. −1 on the failed samples and 0 on the correct ones. The offset does not enter the
    RAFT++ branch.
    """
    if m not in (-1, 0, 1):
        raise ValueError(f"m must be -1, 0 or +1, got {m}")
    if not math.isfinite(nsr_reward_offset):
        raise ValueError(f"nsr_reward_offset must be finite, got {nsr_reward_offset}")
    if rewards.shape != advantages.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and advantages {tuple(advantages.shape)} differ in shape")
    if m == 0:
        return advantages
    r = rewards.float()
    if m > 0:
        return r.clamp(min=0.0)
    return (r - nsr_reward_offset).clamp(max=0.0)


def group_renormalised_weights(keep: Tensor, group_size: int) -> Tensor:
    """The paper's 1/|S_x|: kept row i of prompt x weighs G/|S_x|, rejected rows 0 (fp32 [B]).

    Each prompt keeps the total weight it had before rejection (G rows of weight 1), spread over the
    rows it kept, so rejecting samples changes *which* samples a prompt learns from, not how much
    it counts. A prompt with no kept row contributes nothing.
    """
    if keep.dim() != 1 or keep.numel() % group_size:
        raise ValueError(f"keep must be [B] with B divisible by G={group_size}, got {tuple(keep.shape)}")
    kept = keep.view(-1, group_size).float()
    counts = kept.sum(-1, keepdim=True)
    weights = torch.where(kept > 0, group_size / counts.clamp(min=1), torch.zeros_like(kept))
    return weights.flatten()
