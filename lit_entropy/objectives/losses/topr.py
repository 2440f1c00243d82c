"""TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv 2503.14286; docs/design.md §7.2).

Positive samples get plain REINFORCE, negative ones REINFORCE weighted by their truncated trajectory ratio::

    w_i = 1                                   if A_i ≥ 0
    w_i = clip(π_θ(y_i) / π_old(y_i), 0, 1)   if A_i < 0          (π(y_i) = Π_t π(y_it): the whole sequence)
    l_it = −sg(w_i)·A_it·log π_θ(y_it)

No PPO clip: a positive sample's gradient is never cut, a negative one's fades as the policy moves away from it
(``a⁻ = 0``: the paper shows any lower bound above 0 lets the negatives push the policy to degenerate). The paper's
Algorithm 1 weighs ``log π(y|x)`` by ``sg(α)·R``, the ratio over the whole trajectory, split on the sign of the
reward; here the split is on the sign of the row's advantage (the mean of its token advantages; with ±1 rewards
and no baseline, the paper's case, the two agree: ``algo=topr_paper``) and ``π_old`` is the policy of the pre-update
pass (the sampler's with ``correction.bypass``).

The trajectory ratio is summed over the loss mask, which for TOPR is always the whole sampled sequence: the loss is
registered with ``sequence_ratio``, so the token-level masks (forking, Clip-B/V, ``correction.level=token`` with
``mode=mask``) are refused at start-up (docs/design.md §7.2); row-level masks take a whole row out, never part of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from lit_entropy.dose import Dose
from lit_entropy.objectives.losses import PolicyLoss, register
from lit_entropy.objectives.policy_loss import loss_info, masked_loss_inputs, ratio

TAPER_TOL = 1e-3
"""A negative sample counts as tapered (``train/clipfrac_low``, TOPR's dose) when its weight is under ``1 − TAPER_TOL``:
on-policy the trajectory ratio is 1 up to rounding, which must not count."""


def topr_weights(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """TOPR's per-row weights ``w`` [B] (detached, fp32), the rows' advantage signs ``negative`` [B] and the rows'
    log trajectory ratios ``Σ_t (log π_θ − log π_old)`` [B]; inputs [B, L] as :func:`topr_surrogate` takes them."""
    lp, old, adv, mask = masked_loss_inputs(logp, old_logp, advantages, mask)
    with torch.no_grad():
        log_ratio = (lp - old).sum(-1)
        tokens = mask.sum(-1).clamp(min=1)
        negative = (adv.sum(-1) / tokens) < 0
        # exp(min(L, 0)) = clip(exp(L), 0, 1) without overflow for a long sequence whose ratio grew
        w = torch.where(negative, torch.exp(log_ratio.clamp(max=0.0)), torch.ones_like(log_ratio))
    return w, negative, log_ratio


def topr_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """TOPR's per-token loss [B, L] (fp32): ``−sg(w_i)·A_it·log π_θ(y_it)`` with :func:`topr_weights`.

    Its gradient is ``−w_i·A_it·∇log π_θ(y_it)``. ``clipped_low`` marks the tokens of negative rows whose weight
    was cut (``w < 1 − TAPER_TOL``: the policy has moved away from the sample), ``clipped_high`` those of negative
    rows whose ratio grew above 1 and was truncated to 1.
    """
    w, negative, log_ratio = topr_weights(logp, old_logp, advantages, mask)
    lp, old, adv, mask = masked_loss_inputs(logp, old_logp, advantages, mask)
    loss = torch.where(mask, -w[:, None] * adv * lp, torch.zeros((), device=lp.device))
    tapered = (negative & (w < 1.0 - TAPER_TOL))[:, None] & mask
    truncated = (negative & (log_ratio > 0))[:, None] & mask
    return loss, loss_info(ratio(lp, old), tapered, truncated)


def topr(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float, eps_high: float,
         knobs: Mapping[str, Any], dual_clip: float | None) -> tuple[Tensor, dict[str, Tensor]]:
    """No clip knob: ``eps_low`` / ``eps_high`` are not read."""
    return topr_surrogate(logp, old_logp, advantages, mask)


register(PolicyLoss("topr", topr, sequence_ratio=True, clip_knobs=(), dose=Dose(
    "topr_tapered_frac", "fraction of response tokens in negative samples whose weight the taper cut "
    "(train/clipfrac_low)", tag="train/clipfrac_low")))
