"""Group-relative advantage estimators (DESIGN §7.1).

Rows of a rollout batch come in contiguous groups of ``group_size`` completions of one prompt, so
``rewards.view(-1, group_size)`` puts each group on one row. Advantages are per sequence ([B], fp32);
:func:`broadcast_to_tokens` spreads them over the response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """``rewards`` [B] as fp32 [B // G, G], after checking the shapes."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2, got {group_size}: with G=1 a group has no baseline "
            "(every advantage would be 0)"
        )
    batch = rewards.shape[0]
    if batch % group_size != 0:
        raise ValueError(f"batch size {batch} is not divisible by group_size {group_size}")
    return rewards.float().view(batch // group_size, group_size)


def zero_std_groups(rewards: Tensor, group_size: int) -> Tensor:
    """[B // G] bool: True for groups whose rewards are all equal (they carry no learning signal)."""
    grouped = _grouped(rewards, group_size)
    return (grouped == grouped[:, :1]).all(dim=1)


def grpo(rewards: Tensor, group_size: int, eps: float = 1e-6, scale_std: bool = True) -> Tensor:
    """GRPO advantages, ``A_i = (R_i − mean_G R) / (std_G R + eps)``, fp32 [B].

    ``std_G`` is the unbiased sample standard deviation of the group (``torch.std`` with
    ``correction=1``), as TRL and verl compute it. ``scale_std=False`` gives Dr.GRPO,
    ``A_i = R_i − mean_G R`` (no division). A group whose rewards are all equal gets advantage 0
    exactly, whatever rounding the mean suffers.

    Raises ``ValueError`` when ``group_size < 2`` or when ``B`` is not a multiple of it.
    """
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_std:
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return centred.reshape(-1)


def broadcast_to_tokens(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Per-token advantages [B, L] fp32: ``A_i`` on the response tokens of row i, 0 elsewhere (padding)."""
    if advantages.dim() != 1 or advantages.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"advantages {tuple(advantages.shape)} does not match response_mask {tuple(response_mask.shape)}"
        )
    values = advantages.float()[:, None].expand(response_mask.shape)
    return torch.where(response_mask.bool(), values, torch.zeros_like(values))
