"""GTPO (Tan et al. 2025, "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy", arXiv
2508.04349): token rewards re-weighted by entropy share, inverse for failures; it replaces the estimator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.token_shaping import check_coefficients, check_shapes, register

GTPO_NORMS = ("set", "group")
"""How GTPO z-scores its token rewards: over each set's own tokens (O⁺ and O⁻ apart), or over the whole group's."""


def positions(mask: Tensor) -> Tensor:
    """[B, L] int64: index t of each response token within its response (0, 1, ...), 0 elsewhere."""
    return torch.where(mask, mask.long().cumsum(-1) - 1, 0)


def column_sum(values: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """[B, L]: at each response token, the sum of ``values`` over the tokens of its group's rows in ``mask``
    that sit at the same response position t (rows whose response is shorter than t do not take part)."""
    rows, width = mask.shape
    pos = positions(mask)
    slot = torch.arange(rows, device=mask.device)[:, None] // group_size * width + pos
    sums = torch.zeros(rows // group_size * width, dtype=values.dtype, device=values.device)
    sums.index_add_(0, slot[mask], values[mask])
    return torch.where(mask, sums[slot], 0.0)


def normalise_within(values: Tensor, mask: Tensor, group_size: int, eps: float) -> Tensor:
    """``(x − mean)/(std + eps)`` over each group's tokens in ``mask`` (unbiased std); 0 outside the mask and
    for a group whose such tokens are fewer than two or all equal."""
    rows = mask.shape[0]
    m = mask.view(rows // group_size, -1)
    x = torch.where(mask, values, 0.0).view(rows // group_size, -1)
    count = m.sum(-1, keepdim=True)
    mean = x.sum(-1, keepdim=True) / count.clamp(min=1)
    var = torch.where(m, (x - mean) ** 2, 0.0).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
    lo = torch.where(m, x, torch.inf).amin(-1, keepdim=True)
    hi = torch.where(m, x, -torch.inf).amax(-1, keepdim=True)
    spread = (count >= 2) & (hi > lo)  # exactly equal values: 0, not rounding noise over eps
    out = torch.where(m & spread, (x - mean) / (var.sqrt() + eps), 0.0)
    return out.view(mask.shape)


def share(values: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """``values`` over their sum across the group's rows in ``mask`` at the same response position; 0 where
    that sum is 0. A position with one row gives exactly 1."""
    total = column_sum(values, mask, group_size)
    return torch.where(mask & (total > 0), values / torch.where(total > 0, total, 1.0), 0.0)


def gtpo(rewards: Tensor, entropy: Tensor, response_mask: Tensor, group_size: int, alpha1: float = 1.0,
         alpha2: float = 0.1, correct_threshold: float = 1.0, eps: float = 1e-6, norm: str = "set") -> Tensor:
    """GTPO token advantages (Tan et al. 2025, arXiv 2508.04349), fp32 [B, L].

    Within a group, O⁺ are the successful responses (``R ≥ correct_threshold``) and O⁻ the others. At
    response position t let d_t (h_t) count the O⁺ (O⁻) responses still running at t. Token rewards:

    * success i: ``r̃_{i,t} = α₁·R_i + α₂ · H_{i,t} / Σ_{k∈O⁺, t} H_{k,t} · d_t`` — the entropy share of the
      token among the successes at t, scaled so that the bonuses at t sum to α₂·d_t;
    * failure j: ``r̃_{j,t} = −α₁ − α₂ · (1/H_{j,t}) / Σ_{k∈O⁻, t} (1/H_{k,t}) · h_t`` — inverse entropy, so a
      confident token of a wrong answer takes the larger share of the penalty.

    Advantages normalise the two sets separately over the group's tokens (paper's Eq. 6):
    ``Ã = (r̃ − mean)/(std + eps)`` over O⁺'s tokens, the same over O⁻'s. So within each set the sign
    says whether a token's shaped reward is above that set's average; an all-equal group still gets
    non-zero token advantages (entropy shares differ), unlike GRPO, while a lone success in its group gets 0
    (its share is 1 at every position). Sets whose shaped rewards are all equal get exactly 0. With binary
    rewards the z-scoring cancels α₁ and α₂ (every success has R = 1): they matter for non-binary rewards
    only. ``eps`` keeps 1/H finite where H = 0; a position where all the set's entropies are 0 gets share 0. Defaults α₁ = 1, α₂ = 0.1 are the paper's. For non-binary rewards the success term uses R_i
    itself and the failure term −α₁, as the paper's formula reads.

    ``norm="group"`` instead z-scores all of the group's tokens together. That keeps the success/failure
    signal (success tokens above the group's mean, failure tokens below) and leaves α₁, α₂ meaningful for
    binary rewards; the per-set reading, measured on the lab, loses it: the accuracy of a 40-iteration run
    falls (docs/results.md). The paper's Eq. 6 can be read either way; ``set`` follows the published
    reimplementations.
    """
    mask = check_shapes(entropy, response_mask, rewards.shape[0], group_size)
    success = (rewards.float() >= correct_threshold)[:, None] & mask
    failure = ~(rewards.float() >= correct_threshold)[:, None] & mask
    h = torch.where(mask, entropy.detach().float(), 0.0)
    inv = torch.where(failure, 1.0 / (h + eps), 0.0)
    h_pos = torch.where(success, h, 0.0)
    d_t = column_sum(success.float(), success, group_size)
    h_t = column_sum(failure.float(), failure, group_size)
    bonus = share(h_pos, success, group_size) * d_t
    penalty = share(inv, failure, group_size) * h_t
    r = rewards.float()[:, None].expand(mask.shape)
    shaped = torch.where(success, alpha1 * r + alpha2 * bonus, torch.where(failure, -alpha1 - alpha2 * penalty, 0.0))
    if norm == "group":
        return normalise_within(shaped, mask, group_size, eps)
    return normalise_within(shaped, success, group_size, eps) + normalise_within(shaped, failure, group_size, eps)


def check(args: dict[str, Any]) -> None:
    """``norm`` one of :data:`GTPO_NORMS`, α₁, α₂ ≥ 0."""
    if args.get("norm", "set") not in GTPO_NORMS:
        raise ValueError(f"algo.token_shaping_args.norm={args['norm']!r}; choose one of {list(GTPO_NORMS)}")
    check_coefficients(args, ("alpha1", "alpha2"))


def shaped(advantages: Tensor, rewards: Tensor, entropy: Tensor, mask: Tensor, group_size: int,
           **args: Any) -> tuple[Tensor, Tensor]:
    """GTPO's token advantages, and as the per-sequence value controllers read, the mean of each row's."""
    tokens = gtpo(rewards, entropy, mask, group_size, **args)
    return tokens.sum(-1) / mask.sum(-1).clamp(min=1), tokens


register("gtpo", shaped, args=("alpha1", "alpha2", "correct_threshold", "eps", "norm"), replaces_estimator=True,
         check=check)
