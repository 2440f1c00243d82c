"""RLOO (Ahmadian et al. 2024): the leave-one-out mean as baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.objectives.advantages import register
from lit_entropy.objectives.advantages.groups import by_group


def rloo(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs"), fp32 [B].

    ``A_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_G R)``: each sample's baseline is the mean
    reward of the other ``G − 1`` samples of its group, so the baseline does not depend on ``R_i``.
    All-equal groups give exactly 0. Raises ``ValueError`` for ``G < 2`` (no other sample to average)
    or ``B`` not a multiple of ``G``.
    """
    grouped = by_group(rewards, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)) * (group_size / (group_size - 1))
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


register("rloo", rloo, options=())
