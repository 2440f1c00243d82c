"""EntroPIC's loss term (Yang et al. 2025; docs/design.md §7.4.6): confident tokens weighted by sign(A).

With the controller's output α ∈ [−1, 1], the loss gains α · mean over high-probability tokens of
(−r·|A|), r = exp(logp − logp_old) the unclipped ratio. Since d(−r·|A|)/d logp = −r·|A| = −r·A·sign(A),
on those tokens the surrogate −r·A then weighs positive samples by (1 + α) and negative samples by
(1 − α): α > 0 (entropy above target) reinforces what the policy already believes and sharpens it,
α < 0 leans on the negative samples and flattens it. Tokens outside ``high_prob`` are untouched.

The mean divides by the high-probability token count of the WHOLE minibatch (``count``), so summing
:func:`entropic_term` over micro-batches (gradient accumulation) gives exactly the minibatch value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.objectives.policy_loss import LOG_RATIO_CLAMP

PIC_PROB_THRESHOLD = 0.95
"""EntroPIC acts on tokens the pre-update policy gave probability above this."""


def high_prob_tokens(old_logp: Tensor, loss_mask: Tensor, threshold: float = PIC_PROB_THRESHOLD) -> Tensor:
    """[B, L] bool: the loss tokens whose pre-update probability is above ``threshold``."""
    return loss_mask & (old_logp > math.log(threshold))


def entropic_term(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, high_prob: Tensor, count: Tensor | int
) -> Tensor:
    """Σ over ``high_prob`` tokens of (−r·|A|), divided by the minibatch's high-probability token ``count``.

    Args:
        logp: ``[B, L]`` current log-probs of the sampled tokens (with gradient).
        old_logp: ``[B, L]`` pre-update (sampler) log-probs.
        advantages: ``[B]`` per-sequence or ``[B, L]`` per-token advantages.
        high_prob: ``[B, L]`` bool, the loss tokens whose pre-update probability is above the threshold.
        count: the number of ``high_prob`` tokens over the whole minibatch (all micro-batches); when it
            is 0 the term is 0 (with a zero gradient).

    Returns:
        A fp32 scalar. Multiply by α to get the loss contribution.
    """
    adv = advantages if advantages.dim() == logp.dim() else advantages[:, None].expand_as(logp)
    # Mask the log-ratio before exponentiating: padding can hold arbitrary log-probs, and an overflowing
    # exp in the unselected branch of a `where` would still turn the gradient into NaN (0·inf).
    delta = torch.where(high_prob, logp.float() - old_logp.float(), 0.0)
    r = torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # bounded like the surrogate's ratio
    values = torch.where(high_prob, -r * adv.float().abs(), 0.0)
    total = values.sum()
    count = torch.as_tensor(count, device=total.device)
    return torch.where(count > 0, total / count.clamp(min=1), total * 0)
