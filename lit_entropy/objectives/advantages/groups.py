"""What the estimators share: rewards laid out in groups of G completions of one prompt (rows of a group are
contiguous, so ``rewards.view(-1, G)`` puts each group on one row), the shape checks, and DAPO's dynamic sampling
(Yu et al. 2025), which the rollout source applies to every sampling round (:func:`group_has_signal`,
:func:`select_groups`)."""

from __future__ import annotations

import torch
from torch import Tensor


def by_group(rewards: Tensor, group_size: int) -> Tensor:
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


def check_rows(rewards: Tensor, group_size: int, min_group_size: int) -> None:
    """Shape checks shared by the estimators that do not need a baseline (``G >= min_group_size``)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < min_group_size:
        raise ValueError(f"group_size must be >= {min_group_size}, got {group_size}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not divisible by group_size {group_size}")


def zero_std_groups(rewards: Tensor, group_size: int) -> Tensor:
    """[B // G] bool: True for groups whose rewards are all equal (they carry no learning signal), compared in
    ``rewards``' own dtype (float64 rewards compare exactly as the Python floats they came from)."""
    grouped = rewards.view(by_group(rewards, group_size).shape)  # by_group checks the shapes
    return (grouped == grouped[:, :1]).all(dim=1)


def group_has_signal(rewards: Tensor, group_size: int) -> Tensor:
    """[B // G] bool: True for groups whose rewards are not all equal (DAPO dynamic sampling,
    Yu et al. 2025, keeps only these). The complement of :func:`zero_std_groups`; same errors."""
    return ~zero_std_groups(rewards, group_size)


def select_groups(num_groups_needed: int, signal: Tensor) -> Tensor:
    """int64 indices of the first ``num_groups_needed`` groups whose ``signal`` is True, ascending.

    For DAPO dynamic sampling (Yu et al. 2025): the data module samples rounds of groups, keeps the
    groups with signal (see :func:`group_has_signal`) and stops once the batch is full. When fewer
    than ``num_groups_needed`` groups have signal, all of them are returned (the caller samples another
    round for the rest). The result is on ``signal``'s device. Raises ``ValueError`` when ``signal`` is
    not a 1-D bool tensor or ``num_groups_needed < 0``.
    """
    if signal.dim() != 1 or signal.dtype != torch.bool:
        raise ValueError(f"signal must be a 1-D bool tensor, got {signal.dtype} {tuple(signal.shape)}")
    if num_groups_needed < 0:
        raise ValueError(f"num_groups_needed must be >= 0, got {num_groups_needed}")
    return torch.nonzero(signal).reshape(-1)[:num_groups_needed].to(torch.int64)
