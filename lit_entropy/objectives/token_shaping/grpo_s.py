"""GRPO-S (Tan et al. 2025, arXiv 2508.04349): the sequence-level version of GTPO on each response's mean entropy;
it replaces the estimator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.token_shaping import check_coefficients, check_shapes, register


def grpo_s(rewards: Tensor, entropy: Tensor, response_mask: Tensor, group_size: int, beta1: float = 1.0,
           beta2: float = 0.1, correct_threshold: float = 1.0, eps: float = 1e-6) -> Tensor:
    """GRPO-S sequence advantages (Tan et al. 2025, arXiv 2508.04349), fp32 [B].

    Ĥ_i is the mean entropy over response i's tokens. With n successes and m failures in the group:

    * success i: ``r̂_i = β₁·R_i + β₂ · Ĥ_i / Σ_{k∈O⁺} Ĥ_k · n``;
    * failure j: ``r̂_j = −β₁ − β₂ · (1/Ĥ_j) / Σ_{k∈O⁻} (1/Ĥ_k) · m``;

    then ``Â_i = (r̂_i − mean_G r̂)/(std_G r̂ + eps)`` over the whole group (unbiased std), as GRPO does with
    R. Defaults β₁ = 1, β₂ = 0.1 are the paper's. Broadcast to tokens by the caller.
    """
    mask = check_shapes(entropy, response_mask, rewards.shape[0], group_size)
    count = mask.sum(-1)
    mean_h = torch.where(mask, entropy.detach().float(), 0.0).sum(-1) / count.clamp(min=1)
    success = rewards.float() >= correct_threshold
    inv = 1.0 / (mean_h + eps)
    grid = lambda x: x.view(-1, group_size)  # noqa: E731
    pos_h = grid(torch.where(success, mean_h, 0.0))
    neg_inv = grid(torch.where(success, 0.0, inv))
    n = grid(success.float()).sum(-1, keepdim=True)
    safe = lambda x: torch.where(x > 0, x, 1.0)  # noqa: E731 (a sum of 0 means no such rows: share 0)
    bonus = pos_h / safe(pos_h.sum(-1, keepdim=True)) * n
    penalty = neg_inv / safe(neg_inv.sum(-1, keepdim=True)) * (group_size - n)
    shaped = torch.where(grid(success), beta1 * grid(rewards.float()) + beta2 * bonus, -beta1 - beta2 * penalty)
    centred = shaped - shaped.mean(-1, keepdim=True)
    return (centred / (shaped.std(-1, keepdim=True, correction=1) + eps)).reshape(-1)


def check(args: dict[str, Any]) -> None:
    """β₁, β₂ ≥ 0."""
    check_coefficients(args, ("beta1", "beta2"))


def shaped(advantages: Tensor, rewards: Tensor, entropy: Tensor, mask: Tensor, group_size: int,
           **args: Any) -> tuple[Tensor, Tensor]:
    """GRPO-S's sequence advantages, broadcast over the response."""
    seq = grpo_s(rewards, entropy, mask, group_size, **args)
    return seq, torch.where(mask, seq[:, None].expand(mask.shape), 0.0)


register("grpo_s", shaped, args=("beta1", "beta2", "correct_threshold", "eps"), replaces_estimator=True, check=check)
