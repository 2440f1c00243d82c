"""Batch-scaled group advantages (TRL ``scale_rewards="batch"``, Lite PPO): group mean, batch std."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def grpo_batch(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Batch-scaled group advantages (TRL ``scale_rewards="batch"``; "Lite PPO", Liu et al. 2025, "Part I: Tricks
    or Traps?", arXiv 2508.08221), fp32 [B].

    ``A_i = (R_i − mean_G R)/(std_B R + eps)``: the group mean is the baseline, as in :func:`grpo`, but one
    standard deviation of ALL the batch's rewards (unbiased, ``correction=1``, as ``torch.std`` in TRL) scales
    every group, so near-flat groups are not blown up. All-equal groups give exactly 0; a batch of equal
    rewards gives all zeros.
    """
    grouped = by_group(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.reshape(-1).std(correction=1) if grouped.numel() > 1 else torch.zeros(())
    centred = centred / (std + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


register("grpo_batch", grpo_batch, options=("eps",))
