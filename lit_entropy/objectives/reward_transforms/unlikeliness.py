"""The unlikeliness reward (He et al. 2025, "Rewarding the Unlikely: Lifting GRPO Beyond Distribution
Sharpening"): among a group's completions, the less likely ones keep more of their reward."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives.advantages.groups import check_rows
from lit_entropy.objectives.reward_transforms import RewardTransform, register


def unlikeliness_rewards(
    rewards: Tensor, seq_logp_mean: Tensor, group_size: int, beta_rank: float = 0.25
) -> Tensor:
    """Unlikeliness-shaped rewards (He et al. 2025, "Rewarding the Unlikely: Lifting GRPO Beyond
    Distribution Sharpening"), fp32 [B].

    Within each group, rank the samples by ``seq_logp_mean`` (mean token log-prob of the response under
    the current policy), ascending: rank 0 is the least likely sample, rank ``G − 1`` the most likely.
    Ties keep index order (stable sort: the earlier row gets the lower rank). Then
    ``R̃_i = R_i · (1 − β_rank · rank_i / G)``, so among correct samples the unlikely ones keep more of
    their reward. This only transforms rewards; the caller applies an estimator to ``R̃`` afterwards.

    ``seq_logp_mean`` must be [B] and finite (NaN sorts as the most likely). It is only ranked, never
    differentiated. ``G = 1`` is allowed (every rank is 0: rewards unchanged). Raises ``ValueError`` for
    shape mismatches, ``G < 1`` or ``B`` not a multiple of ``G``.
    """
    check_rows(rewards, group_size, min_group_size=1)
    if seq_logp_mean.shape != rewards.shape:
        raise ValueError(
            f"seq_logp_mean {tuple(seq_logp_mean.shape)} does not match rewards {tuple(rewards.shape)}"
        )
    logp = seq_logp_mean.detach().float().view(-1, group_size)
    order = torch.argsort(logp, dim=1, stable=True)  # order[g, k] = index of the k-th least likely
    ranks = torch.argsort(order, dim=1, stable=True)  # inverse permutation: rank of each index
    scale = 1.0 - beta_rank * ranks.float() / group_size
    return (rewards.float().view(-1, group_size) * scale).reshape(-1)


def from_batch(rewards: Tensor, batch: Any, beta_rank: float = 0.25) -> Tensor:
    """:func:`unlikeliness_rewards` ranked by each row's mean pre-update log-prob over its response tokens."""
    resp = batch.response_mask
    seq_logp = torch.where(resp, batch.old_logp, 0.0).sum(-1) / resp.sum(-1).clamp(min=1)
    return unlikeliness_rewards(rewards, seq_logp, batch.group_size, beta_rank=beta_rank)


register(RewardTransform("unlikeliness", from_batch, algo_keys=("beta_rank",),
                         reads_pass="ranks on the pre-update log-probs"))
