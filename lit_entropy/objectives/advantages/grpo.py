"""GRPO (Shao et al. 2024): the group mean as baseline, the unbiased group std as scale."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def grpo(rewards: Tensor, group_size: int, eps: float = 1e-6, scale_std: bool = True) -> Tensor:
    """GRPO advantages, ``A_i = (R_i − mean_G R) / (std_G R + eps)``, fp32 [B].

    ``std_G`` is the unbiased sample standard deviation of the group (``torch.std`` with
    ``correction=1``), as TRL and verl compute it. ``scale_std=False`` gives Dr.GRPO,
    ``A_i = R_i − mean_G R`` (no division). A group whose rewards are all equal gets advantage 0
    exactly, whatever rounding the mean suffers.

    Raises ``ValueError`` when ``group_size < 2`` or when ``B`` is not a multiple of it.
    """
    grouped = by_group(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_std:
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return centred.reshape(-1)


register("grpo", grpo, options=("eps", "scale_std"))
